"""The GPU gradient test's inputs, kernel calls and comparison (tests/grad_cases.py) at tiny
sizes in the Triton interpreter, for every example it covers."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from grad_cases import EXAMPLES, NAMES, draw, gradient_verdicts, note_replays

import attncc
from attncc.runtime import autograd, gradients
from attncc.tolerance import compare_grad

pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_at_tiny_sizes(name: str) -> None:
    given, params = draw(name, 1, 4, 24, 16, torch.bfloat16, "cpu")
    verdicts = gradient_verdicts(name, given, params)
    assert all(v.ok for v in verdicts.values()), verdicts
    assert ("slopes" in verdicts) == (name == "alibi")
    assert ("bias" in verdicts) == (name == "bias")
    assert ("rel" in verdicts) == (name == "relative_bias")


def test_a_wrong_gradient_fails_at_tiny_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    right = autograd.Backward.run

    def wrong(self: autograd.Backward, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        grads = right(self, *args, **kwargs)
        return [grads[0] * 1.05, *grads[1:]]  # q's

    monkeypatch.setattr(autograd.Backward, "run", wrong)
    given, params = draw("causal", 1, 4, 24, 16, torch.bfloat16, "cpu")
    verdicts = gradient_verdicts("causal", given, params)
    assert [n for n, v in verdicts.items() if not v.ok] == ["q"]


def test_the_backward_backend_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTNCC_BACKWARD picks the backward: a value it does not know is one clear error, and
    "cuda" where the sm_90a kernel cannot run (a CPU call) takes the Triton backward, saying
    why."""
    given, params = draw("causal", 1, 2, 32, 16, torch.float32, "cpu")
    monkeypatch.setenv("ATTNCC_BACKWARD", "cudnn")
    with pytest.raises(ValueError, match=r"ATTNCC_BACKWARD.*auto, cuda or triton, not 'cudnn'"):
        gradient_verdicts("causal", given, params)
    monkeypatch.setenv("ATTNCC_BACKWARD", "cuda")
    verdicts = gradient_verdicts("causal", given, params)
    assert all(v.ok for v in verdicts.values()), verdicts
    assert autograd.last_backend().startswith("triton: "), autograd.last_backend()


@pytest.mark.parametrize(
    ("name", "keys", "head_dim", "forced", "takes"),
    [
        ("causal", 1024, 128, False, True),
        ("gqa_causal", 4096, 128, False, True),
        ("causal", 1023, 128, False, False),  # below 1024 keys: Triton's is as fast
        ("causal", 4096, 64, False, True),
        ("causal", 1023, 64, False, False),
        ("causal", 512, 64, True, True),  # ATTNCC_BACKWARD=cuda
        ("causal", 4096, 96, False, False),  # padded to 128: not measured
        ("causal", 4096, 96, True, True),
        ("causal", 4096, 160, True, False),  # past 128: no sm_90a backward
        ("softcap", 4096, 128, False, True),  # the chain rule through tanh in the kernel
        ("alibi", 4096, 128, False, True),  # the slopes' gradient: Backward.run decides
    ],
)
def test_which_calls_the_sm90a_backward_takes(
    name: str, keys: int, head_dim: int, forced: bool, takes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA host module's rule for the sm_90a backward (_backward_refusal), as if on an
    sm_90 GPU: by default head dims 64 and 128 from 1024 keys, where it measured ahead of the
    Triton backward; asked for, any head dim up to 128 (padded to 64 or 128); never past 128."""
    host = attncc.compile(EXAMPLES / f"{name}.attn", target="cuda").module(False)
    monkeypatch.setattr(host, "_has_wgmma", lambda device: True)
    heads, kv_heads = (8, 2) if name == "gqa_causal" else (4, 4)
    q = torch.zeros(1, heads, keys, head_dim, dtype=torch.bfloat16)
    k, v = (torch.zeros(1, kv_heads, keys, head_dim, dtype=torch.bfloat16) for _ in range(2))
    sizes = {"B": 1, "H": heads, "KVH": kv_heads, "M": keys, "N": keys, "D": head_dim}
    out = torch.zeros_like(q)
    tensors = {"q": q, "k": k, "v": v}
    if name == "alibi":
        tensors["slopes"] = torch.ones(heads, dtype=torch.bfloat16)
    why = host._backward_refusal(
        tensors, out, out, sizes, torch.bfloat16, torch.device("cuda"), forced
    )
    assert (why is None) == takes, why


@pytest.mark.parametrize(
    ("key_tiles", "chunk"), [(8, 16), (16, 16), (32, 8), (64, 4), (128, 2), (256, 1), (1, 16)]
)
def test_the_sm90a_backward_interleaves_the_programs_of_a_wave(key_tiles: int, chunk: int) -> None:
    """The sm_90a backward's grid takes its block programs in chunks (their key tiles side
    by side): the fewest whose blocks fill a wave of 132 SMs, at most 16, so a causal
    program's long first key tiles run beside other programs' rather than in the last wave."""
    host = attncc.compile(EXAMPLES / "causal.attn", target="cuda").module(False)
    assert host._backward_chunk(key_tiles, 132) == chunk


@pytest.mark.parametrize(
    ("name", "loops"),
    [("causal", 2), ("fused", 2), ("document_mask", 2), ("sliding_window", 3), ("prefix_lm", 2)],
)
def test_the_triton_dq_kernel_has_a_loop_before_the_band_only_under_a_lower_bound(
    name: str, loops: int
) -> None:
    """Without a mask bounding the keys from below every row sees key 0, so no key tile
    precedes the band of whole tiles: the dq kernel has no loop for such tiles (the forward's
    rule), which is less code for Triton to compile at a first backward."""
    kernel = attncc.compile(EXAMPLES / f"{name}.attn", target="triton")
    assert isinstance(kernel._backward, autograd.Backward)
    dq = kernel._backward.path.read_text().split("_bwd_dq(", 1)[1].split("\n@triton.jit", 1)[0]
    assert dq.count("for start_n in range(") == loops


_GQA_SPEC = """attention gqa_walk
dims  B, H, KVH, N, D
in    q[B, H, N, D]
in    k[B, KVH, N, D]
in    v[B, KVH, N, D]
{inputs}
let g = h / (H / KVH)
s[b, h, m, n] = q[b, h, m, d] * k[b, g, n, d] * 0.125
{modification}
mask {mask}
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, g, n, d]
out o
"""


@pytest.mark.parametrize(
    ("inputs", "modification", "mask", "walks"),
    [
        ("", "", "m >= n", True),
        # read per score, within the head's own steps
        ("in slopes[H]", "s = s - slopes[h] * (m - n)", "m >= n", True),
        ("in temp[H]", "s = s * temp[h]", "m >= n", True),
        # the key tile's bounds, computed once a block
        ("param w: i32 = 256", "", "m >= n and m - n < w + h", False),
        # a tile index: a block's live query tiles are its head's
        ("in doc[B, N]: i32", "", "doc[b, m] == doc[b, n] and m >= n", False),
    ],
)
def test_the_sm90a_backward_walks_a_gqa_group_where_the_spec_allows(
    inputs: str, modification: str, mask: str, walks: bool
) -> None:
    """A block of the sm_90a backward walks the query heads of a GQA group (dK and dV summed
    in registers) where its key tile's bounds, computed once for all of them, do not read
    the head, and there is no tile index; without a group it has one head."""
    text = _GQA_SPEC.format(inputs=inputs, modification=modification, mask=mask)
    host = attncc.compile(text, target="cuda").module(False)
    assert host._backward_group(4) == (4 if walks else 1)
    assert host._backward_group(1) == 1


@pytest.mark.parametrize(("rows", "takes"), [(8_500_000, True), (8_700_000, False)])
def test_a_tile_index_past_shared_memory_takes_the_triton_backward(
    rows: int, takes: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sm_90a backward keeps two bits a query tile of 64 rows for a tile index (document
    masks) beside 194 KB of tiles: past about 8.6M rows they would not fit in an H100's or
    H200's 227 KB (the launch would fail), so such calls take the Triton backward."""
    host = attncc.compile(EXAMPLES / "document_mask.attn", target="cuda").module(False)
    monkeypatch.setattr(host, "_has_wgmma", lambda device: True)
    monkeypatch.setattr(host, "_shared_limit", lambda device: 227 * 1024)
    # rows of one stored row each: the rule reads shapes and strides, not data
    q = torch.zeros(1, 1, 1, 128, dtype=torch.bfloat16).expand(1, 1, rows, 128)
    doc = torch.zeros(1, 1, dtype=torch.int32).expand(1, rows)
    sizes = {"B": 1, "H": 1, "N": rows, "D": 128}
    tensors = {"q": q, "k": q, "v": q, "doc": doc}
    why = host._backward_refusal(tensors, q, q, sizes, torch.bfloat16, torch.device("cuda"))
    assert (why is None) == takes, why
    assert takes or "tile index" in why


@pytest.mark.parametrize("slopes_grad", [False, True])
def test_a_side_input_without_a_gradient_leaves_the_sm90a_backward_open(
    slopes_grad: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ALiBi's slopes: which inputs need a gradient reaches the choice of backward (the
    sm_90a backward computes no side gradient, so it may take the call only where the slopes
    need none), and the gradients asked for pass the check against the float64 reference
    either way (here from the Triton backward)."""
    seen: list[bool] = []
    choose = autograd.Backward._hopper

    def recording(self: autograd.Backward, *args: Any) -> Any:
        seen.append(args[-2])  # side_needs (the verdicts after it)
        return choose(self, *args)

    monkeypatch.setattr(autograd.Backward, "_hopper", recording)
    given, params = draw("alibi", 1, 2, 24, 16, torch.bfloat16, "cpu")
    needs = ["q", "k", "v"] + (["slopes"] if slopes_grad else [])
    verdicts = gradient_verdicts("alibi", given, params, needs=needs)
    assert sorted(verdicts) == sorted(needs)
    assert all(v.ok for v in verdicts.values()), verdicts
    assert seen == [slopes_grad]


def test_a_repeated_backward_checks_once_a_call_geometry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Backward.run checks a call geometry's inputs once (as the forward's plans do): a
    backward like an earlier one, on new data, skips the host module's checks and still
    passes the check against the float64 reference; another stride or dtype is checked
    again."""
    kernel = attncc.compile(EXAMPLES / "causal.attn", target="triton", schedule="fused")
    checks: list[int] = []  # the backward's (the forward's own calls check too)
    in_backward = [False]
    check = kernel._host._check

    def counted(*args: Any, **kwargs: Any) -> Any:
        if in_backward[0]:
            checks.append(1)
        return check(*args, **kwargs)

    monkeypatch.setattr(kernel._host, "_check", counted)

    def backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = kernel(*leaves)
        grad = torch.ones_like(out)
        in_backward[0] = True
        grads = torch.autograd.grad(out, leaves, grad)
        in_backward[0] = False
        # flash-attn's rule: against float64, within 3x the same math's error in the dtype
        exact, eager = (
            torch.autograd.grad(
                F.scaled_dot_product_attention(*inputs, is_causal=True),
                inputs,
                grad.to(inputs[0].dtype),
            )
            for inputs in (
                [t.double().requires_grad_(True) for t in (q, k, v)],
                [t.detach().requires_grad_(True) for t in (q, k, v)],
            )
        )
        for got, want, low in zip(grads, exact, eager, strict=True):
            verdict = compare_grad(
                got.double().numpy(), want.numpy(), [low.double().numpy()], str(q.dtype)[6:], 1
            )
            assert verdict.ok, verdict

    gen = torch.Generator().manual_seed(3)
    shape = (1, 2, 24, 16)
    backward(*(torch.randn(shape, generator=gen) for _ in range(3)))
    assert len(checks) == 1
    backward(*(torch.randn(shape, generator=gen) for _ in range(3)))
    assert len(checks) == 1  # the same geometry: not checked again
    q = torch.randn((1, 24, 2, 16), generator=gen).transpose(1, 2)  # another stride
    backward(q, *(torch.randn(shape, generator=gen) for _ in range(2)))
    assert len(checks) == 2
    backward(*(torch.randn(shape, generator=gen).bfloat16() for _ in range(3)))
    assert len(checks) == 3  # another dtype


def _scatter(name: str) -> tuple[gradients.Scatter, Any, dict[str, int], int]:
    """Example ``name``'s gradient scatter on a tiny call (B=2, H=4, S=24, D=16), with its
    IR, sizes and batch programs."""
    kernel = attncc.compile(EXAMPLES / f"{name}.attn", target="triton", schedule="fused")
    given, params = draw(name, 2, 4, 24, 16, torch.float32, "cpu")
    sizes, _, _ = kernel._host._check(given, params)
    k = kernel.ir
    floats = tuple(n for n in kernel.input_names if given[n].is_floating_point())
    reads = [k.query.tensor, k.key.tensor, k.value.tensor]
    programs = 1
    for axis in k.batch_axes:
        programs *= sizes[axis.dim]
    return gradients.Scatter(k, sizes, params, given, floats, reads), k, sizes, programs


@pytest.mark.parametrize("name", ["gqa_causal", "causal", "alibi"])
def test_a_recipe_gives_the_general_scatters_gradient(name: str) -> None:
    """The recipe a repeated backward keeps for each operand (a view, the query heads of a
    kv head summed, the axes an input lacks summed, a permutation) gives the gradient the
    general scatter (an index_put_ at the elements each subscript reads) gives."""
    scatter, k, sizes, programs = _scatter(name)
    keys, head = k.key_axis.index, k.head_axis.index
    inner = (keys, head)
    recipe = scatter.recipe(k.key, inner)
    assert recipe is not None
    buffer = torch.randn(programs, sizes[k.key_axis.dim], sizes[k.head_axis.dim])
    # the general path: what add() does where no recipe applies
    general: dict[str, torch.Tensor] = {}
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as patch:
        patch.setattr(gradients.Scatter, "recipe", lambda *_: None)
        scatter.add(general, k.key, buffer, inner)
    torch.testing.assert_close(recipe(buffer), general[k.key.tensor], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["gqa_causal", "causal"])
def test_a_buffer_of_kernel_summed_groups_gives_the_same_gradient(name: str) -> None:
    """Where the sm_90a backward walks a GQA group's query heads (Scatter.kv_group finds the
    group: K and V read the innermost batch axis divided by it), its dK and dV buffers hold
    each group's sum; their recipe then gives what the per-head buffers' recipe gives, and
    the buffer is the input's whole gradient (written in its dtype)."""
    scatter, k, sizes, programs = _scatter(name)
    key = (k.key, (k.key_axis.index, k.head_axis.index))
    value = (k.value, (k.key_axis.index, k.value_axis.index))
    group = sizes["H"] // sizes["KVH"] if name == "gqa_causal" else 1
    assert scatter.kv_group(key, value) == group
    if group == 1:
        return
    assert group > 1
    assert not scatter.whole(*key) and scatter.whole(*key, kernel_groups=True)
    buffer = torch.randn(programs, sizes[k.key_axis.dim], sizes[k.head_axis.dim])
    per_head = scatter.recipe(*key)
    summed = scatter.recipe(*key, kernel_groups=True)
    assert per_head is not None and summed is not None
    by_group = buffer.reshape(programs // group, group, *buffer.shape[1:]).sum(1)
    torch.testing.assert_close(summed(by_group), per_head(buffer), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["causal", "gqa_causal", "document_mask", "alibi", "bias"])
def test_a_repeated_backward_replays_its_call(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backward like an earlier one replays its recorded call (Backward's repeats) and
    gives what the full path gives, bit for bit (the Triton backward adds in a fixed
    order): on new data, with new document ids (the live tiles come from the call's own
    data, never the recorded call's), and with a dO of other strides (the full path). Side
    inputs' gradients too: ALiBi's learnt slopes (a value a row, summed), a bias's."""
    kernel = attncc.compile(EXAMPLES / f"{name}.attn", target="triton", schedule="fused")
    backward = kernel._backward
    assert isinstance(backward, autograd.Backward)
    first, params = draw(name, 1, 4, 40, 16, torch.float32, "cpu")

    def gradients(given: dict[str, torch.Tensor], dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = {
            n: t.clone().requires_grad_(True) if t.is_floating_point() else t
            for n, t in given.items()
        }
        out = kernel(**inputs, **params)
        leaves = [t for t in inputs.values() if t.requires_grad]
        return torch.autograd.grad(out, leaves, dout)

    def full_path(given: dict[str, torch.Tensor], dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with monkeypatch.context() as patch:
            patch.setattr(autograd._Repeat, "__call__", lambda *_: None)
            return gradients(given, dout)

    gen = torch.Generator().manual_seed(5)
    dout = torch.randn(first["q"].shape, generator=gen)
    gradients(first, dout)
    assert len(backward._repeats) == 1
    said = autograd.last_backend()  # a repeat says what its recorded call said
    second = {n: torch.randn(t.shape, generator=gen) for n, t in first.items() if n != "doc"}
    if name == "document_mask":  # other documents: other live tiles
        second["doc"] = torch.randint(0, 7, first["doc"].shape, generator=gen, dtype=torch.int32)
        second["doc"] = second["doc"].sort(dim=-1).values
    replayed = note_replays(monkeypatch)
    for dout_now in (dout, dout.transpose(1, 2).contiguous().transpose(1, 2)):
        repeated = gradients(second, dout_now)
        assert autograd.last_backend() == said
        for got, want in zip(repeated, full_path(second, dout_now), strict=True):
            assert torch.equal(got, want)
    assert replayed == [True, False]  # the transposed dO: the full path


def test_a_side_input_the_general_scatter_takes_is_not_recorded() -> None:
    """A relative bias read through an index expression (rel[h, m - n + ...]) has no
    recipe: its backward keeps the full path every call."""
    kernel = attncc.compile(EXAMPLES / "relative_bias.attn", target="triton", schedule="fused")
    backward = kernel._backward
    assert isinstance(backward, autograd.Backward)
    given, params = draw("relative_bias", 1, 4, 24, 16, torch.float32, "cpu")
    for _ in range(2):
        leaves = {n: t.clone().requires_grad_(t.is_floating_point()) for n, t in given.items()}
        kernel(**leaves, **params).sum().backward()
        assert leaves["rel"].grad is not None and leaves["rel"].grad.abs().sum() > 0
    assert len(backward._repeats) == 0


@pytest.mark.parametrize("name", NAMES)
def test_a_training_step_frees_its_inputs_without_the_garbage_collector(name: str) -> None:
    """Once a step's tensors go out of scope, reference counting frees them: nothing a
    forward or backward builds holds them in a reference cycle, which only Python's
    collector would break, at a time of its choosing (GPU memory meanwhile held). GQA's
    group size, read by evaluating its subscript, once left every first backward's inputs in
    such a cycle (a recursive closure over the inputs)."""
    kernel = attncc.compile(EXAMPLES / f"{name}.attn", target="triton", schedule="fused")
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(2):  # the first backward of a geometry, then a repeated one
            given, params = draw(name, 1, 4, 24, 16, torch.float32, "cpu")
            for n in ("q", "k", "v"):
                given[n].requires_grad_(True)
            out, lse = kernel(**given, **params, return_lse=True)
            (out.sum() + lse.sum()).backward()
            freed = [weakref.ref(t) for t in (*given.values(), out, lse)]
            del given, out, lse
            assert all(ref() is None for ref in freed)
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("name", NAMES)
def test_eager_autograd_gives_the_ops_gradients(name: str) -> None:
    """Every gradient example through the eager path (attncc.runtime.eager's Function) and
    through the torch op's registered autograd, on the same inputs: the same output,
    log-sum-exp and gradients of every float input, bit for bit (the same kernels and the
    same Backward.run behind both)."""
    kernel = attncc.compile(EXAMPLES / f"{name}.attn", target="triton", schedule="fused")
    given, params = draw(name, 1, 4, 24, 16, torch.float32, "cpu")
    floats = [n for n in kernel.input_names if given[n].is_floating_point()]
    gen = torch.Generator().manual_seed(9)

    def leaves() -> dict[str, torch.Tensor]:
        return {
            n: t.clone().requires_grad_(n in floats) if t.is_floating_point() else t
            for n, t in given.items()
        }

    eager = leaves()
    out, lse = kernel(**eager, **params, return_lse=True)
    weights = torch.randn(out.shape, generator=gen), torch.randn(lse.shape, generator=gen)
    ((out * weights[0]).sum() + (lse * weights[1]).sum()).backward()
    through_op = leaves()
    values = [params.get(p) for p in kernel.param_names]
    op_out, op_lse = kernel._op(
        *[through_op[n] for n in kernel.input_names], *values, return_lse=True
    )
    op_lse = kernel._returned_lse(op_lse)
    ((op_out * weights[0]).sum() + (op_lse * weights[1]).sum()).backward()
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse)
    for n in floats:
        got, want = eager[n].grad, through_op[n].grad
        assert got is not None and want is not None, n
        assert torch.equal(got, want), n


def test_a_repeated_backward_follows_the_fp32_product_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Triton backward's kernels are compiled for PyTorch's fp32 product setting (TF32
    or exact, ``_dot_precision``); a repeat after the setting changed takes the full path,
    which launches the kernels of the new setting, rather than replaying the old ones."""
    kernel = attncc.compile(EXAMPLES / "causal.attn", target="triton", schedule="fused")
    backward = kernel._backward
    assert isinstance(backward, autograd.Backward)
    module = backward.module(True)
    given, params = draw("causal", 1, 2, 24, 16, torch.float32, "cpu")
    grad = torch.randn(given["q"].shape, generator=torch.Generator().manual_seed(2))

    def step() -> None:
        leaves = [given[n].clone().requires_grad_(True) for n in ("q", "k", "v")]
        kernel(*leaves, **params).backward(grad)

    replayed = note_replays(monkeypatch)
    step()
    step()
    setting = module._dot_precision

    def other(dtype: torch.dtype) -> str:
        return "tf32" if setting(dtype) != "tf32" else "tf32x3"

    monkeypatch.setattr(module, "_dot_precision", other)
    step()
    assert replayed == [True, False]


# side inputs of each kind a side buffer takes: per score with an axis the input lacks
# (summed over the batch), per key, per row
_SIDE_SPECS = {
    "bias_per_head": ("bias[H, M, N]", "s = s + bias[h, m, n]", (2, 20, 24)),
    "key_bias": ("kb[B, N]", "s = s + kb[b, n]", (2, 24)),
    "row_scale": ("t[B, H, M]", "s = s * t[b, h, m]", (2, 2, 20)),
}


@pytest.mark.parametrize("name", sorted(_SIDE_SPECS))
@pytest.mark.parametrize("side_only", [False, True])
def test_a_repeated_backward_of_each_kind_of_side_input(name: str, side_only: bool) -> None:
    """A repeated backward's side gradients, whichever of rows and keys the side input
    reads, equal the full path's bit for bit; with only the side input requiring grad
    too (a call geometry of its own)."""
    declaration, line, shape = _SIDE_SPECS[name]
    text = (
        f"attention {name}\ndims  B, H, M, N, D\nin    q[B, H, M, D]\nin    k[B, H, N, D]\n"
        f"in    v[B, H, N, D]\nin    {declaration}\n"
        "s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] / sqrt(D)\n"
        f"{line}\np = softmax(s, n)\no[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]\nout o\n"
    )
    kernel = attncc.compile(text, target="triton", schedule="fused")
    gen = torch.Generator().manual_seed(3)
    shapes = {"q": (2, 2, 20, 16), "k": (2, 2, 24, 16), "v": (2, 2, 24, 16)}
    side = kernel.input_names[3]
    given = {n: torch.randn(shapes.get(n, shape), generator=gen) for n in kernel.input_names}
    dout = torch.randn(2, 2, 20, 16, generator=gen)

    def gradients() -> tuple[torch.Tensor, ...]:
        leaves = {n: t.clone().requires_grad_(n == side or not side_only) for n, t in given.items()}
        needed = [t for t in leaves.values() if t.requires_grad]
        return torch.autograd.grad(kernel(**leaves), needed, dout)

    gradients()
    monkeypatch = pytest.MonkeyPatch()
    replayed = note_replays(monkeypatch)
    try:
        repeated = gradients()
    finally:
        monkeypatch.undo()
    assert replayed == [True]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(autograd._Repeat, "__call__", lambda *_: None)
        full = gradients()
    for got, want in zip(repeated, full, strict=True):
        assert torch.equal(got, want)
