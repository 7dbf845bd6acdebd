"""Length families (attncc.runtime.length_family): a call over a key length the kernel has
not seen replays a recorded call of the same length bucket, with the length and the strides
that follow it rewritten, and gets exactly what the full path gives.

On the CPU the kernels run in the interpreter; with a GPU (the `kernels` step of
benchmarks/gpu_suite.sh) the replays are compiled launches through attncc's launcher.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import attncc
from attncc.runtime import length_family
from attncc.runtime.jit import interpreter
from attncc.runtime.launch_plan import Plans
from tests.kernels._support import DEVICE, example_path

FAMILY = "replay: its length family"


def _decode(name: str = "decode") -> Any:
    return attncc.compile(example_path(name), target="triton")


def _full_path(kernel: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The generated module's own entry, without plans or families."""
    on_cpu = DEVICE == "cpu"
    with interpreter(on_cpu):
        return kernel.module(on_cpu)._forward(dict(inputs), {}, False)[0]


def _cache(total: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Decode inputs (examples/decode.attn: q[B, H, D], k and v [B, N, KVH, D]) over a cache
    of ``total`` tokens, GQA 4:2, head dim 16."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(2, total, 2, 16, generator=gen)
    return {
        "q": torch.randn(2, 4, 16, generator=gen).to(DEVICE),
        "k": k.to(DEVICE),
        "v": torch.randn(k.shape, generator=gen).to(DEVICE),
    }


def _at(cache: dict[str, torch.Tensor], n: int, layout: str = "view") -> dict[str, torch.Tensor]:
    """The call at length ``n``: views of the cache, or keys and values of their own (as
    torch.cat makes them: strides that change with the length)."""
    k, v = cache["k"][:, :n], cache["v"][:, :n]
    if layout == "cat":
        k, v = k.contiguous(), v.contiguous()
    lengths = torch.tensor([n, max(1, n - 7)], dtype=torch.int32, device=k.device)
    return {"q": cache["q"], "k": k, "v": v, "cache_len": lengths}


@pytest.mark.parametrize("layout", ["view", "cat"])
def test_a_growing_cache_replays_its_length_family(layout: str) -> None:
    kernel = _decode()
    cache = _cache(140)
    paths = {}
    for n in range(97, 136):
        inputs = _at(cache, n, layout)
        paths[n] = kernel.launch_path(**inputs)
        got = kernel(**inputs)
        torch.testing.assert_close(got, _full_path(kernel, inputs), rtol=0, atol=0)
    # a family a power-of-two bucket and Triton's specialization class of the length (a
    # multiple of 16 or not): its first two lengths are recorded, the others replay it
    assert paths[97] == paths[98] == "full: no call of this geometry yet"
    assert all(paths[n] == FAMILY for n in range(99, 128) if n % 16), paths
    # the multiples of 16 in the bucket (96 is in the one below): a family of their own
    assert paths[112] == paths[128] == "full: no call of this geometry yet"
    assert paths[129] == paths[130] == "full: no call of this geometry yet"
    assert paths[131] == FAMILY


def test_a_length_called_again_gets_a_plan_of_its_own() -> None:
    # as a model's layers call each length: the second call of a length its family served
    # makes the family's plan, its values written in, that geometry's own (which the C
    # launcher replays on a GPU)
    kernel = _decode()
    cache = _cache(140, seed=5)
    for n in (99, 100, 101):
        kernel(**_at(cache, n, "cat"))
    inputs = _at(cache, 102, "cat")
    kernel(**inputs)
    assert kernel.launch_path(**inputs) == FAMILY
    for _ in range(3):
        got = kernel(**inputs)
        torch.testing.assert_close(got, _full_path(kernel, inputs), rtol=0, atol=0)
        assert kernel.launch_path(**inputs) == "replay"
    # the family's plan still serves its other lengths
    assert kernel.launch_path(**_at(cache, 103, "cat")) == FAMILY
    inputs = _at(cache, 103, "cat")
    torch.testing.assert_close(kernel(**inputs), _full_path(kernel, inputs), rtol=0, atol=0)


def test_a_family_replays_its_lengths_in_any_order() -> None:
    kernel = _decode()
    cache = _cache(260, seed=1)
    for n in (200, 133, 255, 129, 170, 254, 131):
        inputs = _at(cache, n)
        torch.testing.assert_close(kernel(**inputs), _full_path(kernel, inputs), rtol=0, atol=0)
    assert kernel.launch_path(**_at(cache, 199)) == FAMILY


def test_a_cache_length_passed_as_a_param_follows_the_family() -> None:
    # transformers' causal spec takes the cache's length as `offset` (queries' position
    # minus the keys'): a decoding step's offset grows with the keys, read by the kernel
    # alone, so it is a family argument too
    kernel = attncc.compile(Path(attncc.__file__).parent / "specs" / "hf_causal.attn")
    assert kernel._families.length is not None
    assert "p_offset" in kernel._host._KEY_LENGTH_ARGS
    gen = torch.Generator().manual_seed(4)
    k = torch.randn(1, 2, 90, 16, generator=gen).to(DEVICE)
    v = torch.randn(k.shape, generator=gen).to(DEVICE)
    q = torch.randn(1, 4, 1, 16, generator=gen).to(DEVICE)
    for n in range(66, 80):
        inputs = {"q": q, "k": k[:, :, :n], "v": v[:, :, :n]}
        # one query at position n - 1, or (every third step) a stale offset hiding keys
        params = {"scale": 0.25, "offset": n - 1 - 5 * (n % 3 == 0)}
        got = kernel(**inputs, **params)
        on_cpu = DEVICE == "cpu"
        with interpreter(on_cpu):
            want = kernel.module(on_cpu)._forward(dict(inputs), dict(params), False)[0]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    inputs = {"q": q, "k": k[:, :, :83], "v": v[:, :, :83]}
    assert kernel.launch_path(**inputs, scale=0.25, offset=82) == FAMILY


def test_a_family_whose_lengths_launch_differently_is_never_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a module table that leaves the batch strides of keys and values out, which follow
    # the length in caches of their own: the two recordings differ there, so the comparison
    # refuses the family and its calls keep the full path
    kernel = _decode()
    for module in (kernel.module(False), kernel.module(True)):  # (every kernel's of the spec)
        table = dict(module._KEY_LENGTH_ARGS)
        del table["s_k_0"], table["s_v_0"]
        monkeypatch.setattr(module, "_KEY_LENGTH_ARGS", table)
    kernel._families = length_family.Families(length_family.KeyLength.of(kernel._host))
    cache = _cache(80, seed=2)
    for n in range(70, 76):
        inputs = _at(cache, n, "cat")
        torch.testing.assert_close(kernel(**inputs), _full_path(kernel, inputs), rtol=0, atol=0)
    (family,) = kernel._families._families.values()
    assert family.state == "refused"
    assert family.refusal == "two lengths of the bucket launched differently"
    assert kernel.launch_path(**_at(cache, 77, "cat")) == "full: no call of this geometry yet"


def test_inputs_that_disagree_on_the_length_or_rank_get_the_full_paths_error() -> None:
    kernel = _decode()
    cache = _cache(80, seed=3)
    for n in (70, 71, 72):
        kernel(**_at(cache, n))
    inputs = _at(cache, 73)
    inputs["v"] = cache["v"][:, :74]
    with pytest.raises(ValueError, match="dim N"):
        kernel(**inputs)
    inputs["v"] = cache["v"][:, :73, 0]
    with pytest.raises(ValueError, match="input 'v' must have 4 dims"):
        kernel(**inputs)


def test_a_length_past_32_bit_offsets_has_no_family() -> None:
    # the full path refuses an input of 2**31 elements or more; in one bucket with lengths
    # below that (40M and 50M keys of 48 elements: bucket 2**26), its family must not take it
    kernel = _decode()
    q = torch.randn(1, 6, 16)
    lengths = torch.tensor([7], dtype=torch.int32)

    def found(n: int) -> Any:
        k = torch.randn(1, 1, 3, 16).expand(1, n, 3, 16)  # (no memory behind the keys)
        tensors = {"q": q, "k": k, "v": k, "cache_len": lengths}
        key = Plans.key(tensors, {}, False, False, stream=False)
        return kernel._families.find(key, tensors, {})

    assert found(40_000_000) is not None
    assert found(50_000_000) is None


def test_specs_whose_host_reads_the_key_length_have_no_family() -> None:
    # the paged cache's length is derived from the page table's (N = NP * PAGE)
    assert _decode("paged_decode")._families.length is None
    assert _decode()._families.length is not None


def test_each_family_argument_is_the_split_kernels() -> None:
    for name in ("decode", "speculative_decode", "gqa_causal", "bias"):
        kernel = _decode(name)
        module = kernel._host
        split = next(
            v for n, v in vars(module).items() if n.startswith("_attncc_") and n.endswith("_split")
        )
        assert set(module._KEY_LENGTH_ARGS) <= set(split.arg_names), name


def test_the_bucket_is_the_least_power_of_two_at_or_above() -> None:
    assert [length_family.bucket(n) for n in (0, 1, 2, 3, 64, 65, 4096, 4097)] == [
        1, 1, 2, 4, 64, 128, 4096, 8192,
    ]  # fmt: skip
