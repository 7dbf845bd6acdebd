"""Kernels are torch custom ops: ``torch.compile(fullgraph=True)`` traces them whole, and
``torch.library.opcheck`` accepts the registered op (CPU tensors, Triton interpreter)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo.testing

import attncc

from ._support import compiled, example_path

# Triton 3.6's interpreter calls int() on one-element arrays (deprecated since NumPy 1.25)
# thousands of times per test; the warning is Triton's, not attncc's.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def qkv(m: int = 20, n: int = 24) -> tuple[torch.Tensor, ...]:
    return randn(1, 2, m, 16, seed=1), randn(1, 2, n, 16, seed=2), randn(1, 2, n, 16, seed=3)


def test_fullgraph_compile_matches_eager() -> None:
    kernel = compiled("causal", "fused")

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, lse = kernel(q * 2, k, v, scale=0.3, return_lse=True)
        return out.sigmoid() + lse[..., None]

    q, k, v = qkv()
    eager = fn(q, k, v)
    compiled_fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled_fn(q, k, v), eager, rtol=0, atol=0)


def test_no_graph_breaks() -> None:
    kernel = compiled("gqa_causal", "fused")
    q, k, v = randn(1, 4, 9, 16, seed=1), randn(1, 2, 9, 16, seed=2), randn(1, 2, 9, 16, seed=3)
    kernel(q, k, v)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(q, k, v).sum(-1)

    explained = torch._dynamo.explain(fn)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_dynamic_shapes_compile_once_per_rank() -> None:
    kernel = compiled("sliding_window", "fused")

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(q, k, v, window=5) + 1

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled_fn = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    for m, n in ((17, 23), (33, 40), (5, 70)):
        q, k, v = qkv(m, n)
        eager = fn(q, k, v)
        torch.testing.assert_close(compiled_fn(q, k, v), eager, rtol=0, atol=0)
    assert counter.frame_count == 1


@pytest.mark.parametrize("dynamic", [None, True])
def test_new_sequence_lengths_do_not_recompile_a_compiled_caller(dynamic: bool | None) -> None:
    """A compiled caller traces the kernel's sizes symbolically: torch.compile's automatic
    dynamic shapes recompile once for a second length (dynamic=True: never), as for any
    ATen op, rather than once per length (a prefill of each prompt length, a decode step of
    each cache length) until dynamo's recompile limit sends the caller back to eager. An int
    param computed from a traced length (a window, a query offset) is traced as one too."""
    prefill = compiled("sliding_window", "fused")
    decode = compiled("decode", "default")  # split-KV

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        lengths = torch.full((2,), k.shape[2] - 1, dtype=torch.int32)
        step = decode(q[:, :, -1], k.transpose(1, 2), v.transpose(1, 2), lengths)
        return prefill(q, k, v, window=k.shape[2] // 2) + step[:, :, None]

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled_fn = torch.compile(fn, fullgraph=True, dynamic=dynamic, backend=counter)
    for n in (9, 13, 17, 21):
        q, k, v = (randn(2, 2, n, 16, seed=seed) for seed in (1, 2, 3))
        torch.testing.assert_close(compiled_fn(q, k, v), fn(q, k, v), rtol=0, atol=0)
    assert counter.frame_count == (1 if dynamic else 2)


def test_fullgraph_compile_of_a_kernel_never_called_eagerly() -> None:
    """The generated module is loaded by compile, not on the first call (dynamo cannot trace
    an import). A spec of its own, so no other test has loaded its module in this process."""
    text = example_path("causal").read_text().replace("attention causal", "attention cold_causal")
    kernel = attncc.compile(text)
    q, k, v = qkv()

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(q, k, v)

    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(out, kernel(q, k, v), rtol=0, atol=0)


def op_args(name: str) -> tuple[tuple[object, ...], dict[str, object]]:
    """Sample arguments in the op's flat order: inputs, then one slot per param."""
    if name == "causal":
        return (*qkv(9, 12), None), {}
    if name == "sliding_window":
        return (*qkv(12, 12), 0.2, 4), {}
    if name == "document_mask":
        x = randn(1, 2, 10, 16, seed=4)
        doc = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2, 3]], dtype=torch.int32)
        return (x, x * 0.5, x.flip(-1), doc, None), {}
    assert name == "decode"
    q, k, v = randn(2, 4, 16, seed=5), randn(2, 11, 2, 16, seed=6), randn(2, 11, 2, 16, seed=7)
    return (q, k, v, torch.tensor([0, 7], dtype=torch.int32), None), {}


OPCHECKED = [
    ("causal", "fused"),
    ("causal", "default"),  # 9 queries: handed to split-KV at run time
    ("sliding_window", "fused"),
    ("document_mask", "naive"),
    ("decode", "default"),  # split-KV
    ("decode", "fused"),
]


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize(("name", "schedule"), OPCHECKED)
def test_opcheck(name: str, schedule: str, return_lse: bool) -> None:
    kernel = compiled(name, schedule)
    args, kwargs = op_args(name)
    torch.library.opcheck(kernel._op, args, {**kwargs, "return_lse": return_lse})


def test_op_is_registered_under_the_attncc_namespace() -> None:
    kernel = compiled("causal", "naive")
    assert kernel._op.namespace == "attncc"
    assert str(kernel._op).startswith("attncc.causal_")
    out, lse = kernel._op(*qkv(), None, return_lse=True)
    assert out.shape == (1, 2, 20, 16) and lse.shape == (1, 2, 20)
    torch.testing.assert_close(out, kernel(*qkv()), rtol=0, atol=0)


class OpSpy:
    """Wraps a kernel's op, counting calls."""

    def __init__(self, op: object) -> None:
        self.op, self.calls = op, 0

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        return self.op(*args, **kwargs)  # type: ignore[operator]


def test_plain_eager_calls_skip_the_op_and_give_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    # the op's dispatch costs more than a decode kernel: eager calls launch directly
    kernel = compiled("causal", "fused")
    args = qkv()
    via_op = kernel._op(*args, None, return_lse=True)
    spy = OpSpy(kernel._op)
    monkeypatch.setattr(kernel, "_op", spy)
    out, lse = kernel(*args, return_lse=True)
    assert spy.calls == 0
    torch.testing.assert_close(out, via_op[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, via_op[1], rtol=0, atol=0)
    with pytest.raises(TypeError, match="input 'q' must be float16, bfloat16 or float32"):
        kernel(args[0].to(torch.int32), *args[1:])  # the direct path checks like the op


def test_traced_and_fake_calls_go_through_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    kernel = compiled("causal", "fused")
    spy = OpSpy(kernel._op)
    monkeypatch.setattr(kernel, "_op", spy)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in qkv()]
        out = kernel(*fake)
    assert spy.calls == 1 and out.shape == (1, 2, 20, 16)


def test_eager_autograd_calls_skip_the_op_and_give_its_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the op's dispatch and torch.library's autograd wrapper cost a forward requiring grad
    # 4x FA2's CPU time: eager calls take attncc.runtime.eager's Function instead
    kernel = compiled("causal", "fused")
    base = qkv()
    through_op = [t.clone().requires_grad_() for t in base]
    out_op, lse_op = kernel._op(*through_op, 0.3, return_lse=True)
    (out_op.sin().sum() + lse_op.cos().sum()).backward()
    spy = OpSpy(kernel._op)
    monkeypatch.setattr(kernel, "_op", spy)
    eager = [t.clone().requires_grad_() for t in base]
    out, lse = kernel(*eager, scale=0.3, return_lse=True)
    (out.sin().sum() + lse.cos().sum()).backward()
    assert spy.calls == 0
    torch.testing.assert_close(out, out_op, rtol=0, atol=0)
    for mine, theirs in zip(eager, through_op, strict=True):
        assert mine.grad is not None
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=0)
    # only the inputs requiring grad get one
    q, k, v = (t.clone() for t in base)
    kernel(q, k.requires_grad_(), v).sum().backward()
    assert q.grad is None and v.grad is None and k.grad is not None
    with pytest.raises(TypeError, match="input 'q' must be float16, bfloat16 or float32"):
        kernel(base[0].to(torch.int32), *eager[1:])  # the eager path checks like the op


def test_functorch_grad_goes_through_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    # functorch's wrapped tensors have no storage to launch on: such calls take the op,
    # whose torch.library autograd torch.func cannot run yet (torch 2.13 asks for a
    # setup_context it does not define), so they fail with torch's own error
    kernel = compiled("causal", "fused")
    spy = OpSpy(kernel._op)
    monkeypatch.setattr(kernel, "_op", spy)
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="functorch transforms"):
        torch.func.grad(lambda q: kernel(q, k, v).sum())(q)
    assert spy.calls == 1


# ------------------------------------------------------------------- autograd: no backward
# Once, a call on inputs requiring grad returned an output that required grad; backward()
# ran and left every .grad None (PyTorch's autograd fallback only warned). Kernels without a
# backward (here the naive schedule) refuse such calls at call time, before launching.

NO_BACKWARD = (
    r"attncc causal: no backward for this spec: only the fused prefill schedule has a "
    r"backward \(this kernel is naive\), but input 'q' requires grad; "
    r"call the kernel under torch\.no_grad\(\)"
)


class LaunchSpy:
    def __init__(self, kernel: attncc.Kernel) -> None:
        self.launch, self.calls = kernel._launch, 0

    def __call__(self, *args: object) -> object:
        self.calls += 1
        return self.launch(*args)  # type: ignore[arg-type]


def test_inputs_requiring_grad_are_refused_before_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = compiled("causal", "naive")
    spy = LaunchSpy(kernel)
    monkeypatch.setattr(kernel, "_launch", spy)
    q, k, v = qkv()
    layer = torch.nn.Linear(16, 16)
    with pytest.raises(NotImplementedError, match=NO_BACKWARD):
        kernel(layer(q), k, v)  # a layer before the kernel: q has a grad_fn
    with pytest.raises(NotImplementedError, match="inputs 'k', 'v' require grad"):
        kernel(q, k.requires_grad_(), v=v.requires_grad_(), return_lse=True)
    q, k, v = qkv()
    with pytest.raises(NotImplementedError, match=NO_BACKWARD):  # the op called directly
        kernel._op(q.requires_grad_(), k, v, None)
    assert spy.calls == 0


def test_grad_free_calls_on_inputs_requiring_grad_run() -> None:
    kernel = compiled("causal", "naive")
    q, k, v = qkv()
    expected = kernel(q, k, v)
    layer = torch.nn.Linear(16, 16)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(16))
        layer.bias.zero_()
        out = kernel(layer(q), k.requires_grad_(), v)
    assert not out.requires_grad
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with torch.inference_mode():
        out = kernel(q.requires_grad_(), k, v)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with torch.no_grad():  # the op too
        out, _ = kernel._op(q, k, v, None)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_compiled_calls_refuse_inputs_requiring_grad() -> None:
    kernel = compiled("causal", "naive")
    layer = torch.nn.Linear(16, 16)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(layer(q), k, v) + 1

    compiled_fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    q, k, v = qkv()
    # dynamo reports it as its own RuntimeError subclass, quoting the kernel's message
    with pytest.raises(RuntimeError, match=NO_BACKWARD):
        compiled_fn(q, k, v)
    with torch.no_grad():
        torch.testing.assert_close(compiled_fn(q, k, v), fn(q, k, v), rtol=0, atol=0)


@pytest.mark.parametrize("schedule", ["fused", "split_kv"])
def test_plain_op_calls_run_the_kernel_without_a_redispatch(
    schedule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The op called on plain tensors with nothing for autograd to record (a compiled
    caller's runtime call) runs the kernel from its autograd kernel (torch.library's, or
    the refusing one of a kernel without a backward), without going round the dispatcher
    again; fake tensors and inputs requiring grad still redispatch, and the latter get
    their gradients."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    kernel = compiled("causal", schedule)
    args = qkv()
    expected = kernel(*args)
    redispatched: list[object] = []
    original = torch._ops.OpOverload.redispatch

    def counting(self: torch._ops.OpOverload, *a: object, **k: object) -> object:
        redispatched.append(self)
        return original(self, *a, **k)

    monkeypatch.setattr(torch._ops.OpOverload, "redispatch", counting)
    out, _ = kernel._op(*args)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    with torch.no_grad():
        kernel._op(*args)
    assert redispatched == []
    with FakeTensorMode() as mode:
        kernel._op(*[mode.from_tensor(t) for t in args])
    assert len(redispatched) == 1
    if schedule == "fused":
        leaves = [t.clone().requires_grad_() for t in args]
        out, _ = kernel._op(*leaves, return_lse=True)
        out.sum().backward()
        assert len(redispatched) == 2 and all(t.grad is not None for t in leaves)
