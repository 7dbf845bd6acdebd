"""The property tests at realistic sizes on a CUDA GPU: hypothesis draws shapes (query and key
lengths apart, from 1 to past 2k, on and around the tiles' edges; head dims 32-256, value
dims of their own; GQA groups; memory layouts; dtypes; params) for every example on both
targets (the forward against the float64 reference by the tolerance rule) and for every
example with a backward on both backward backends (every gradient against float64
autograd by flash-attn's rule).

By default the draws are fixed (derandomized, two a test): every run checks the same cases
(``FUZZ_DRAWS=0 bash benchmarks/gpu_suite.sh fuzz``). ``ATTNCC_GPU_FUZZ=N`` makes it a fuzz
run (the suite's ``fuzz`` step, 5 by default): N fresh draws a test, a failure reported at
once (no shrinking, which would recompile for every smaller case) and, with
``ATTNCC_GPU_FUZZ_LOG=FILE``, written to FILE as it fails (a run cut short keeps it).
Without a GPU every test here is skipped.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from grad_cases import gradient_verdicts
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kernels._properties import DTYPES, assert_matches, make_inputs, params_for, sizes_for
from kernels._support import EXAMPLES, LAYOUTS, example_path

import attncc
from attncc.checking import operand_dtype

pytestmark = pytest.mark.gpu

FUZZ = int(os.environ.get("ATTNCC_GPU_FUZZ", "0") or 0)
DRAWS = settings(
    max_examples=FUZZ or 2,
    derandomize=not FUZZ,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate) if FUZZ else tuple(Phase),
    suppress_health_check=list(HealthCheck),
)

LENGTHS = st.one_of(
    st.sampled_from([1, 2, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025]),
    st.integers(1, 400),
    st.integers(400, 2100),
)
HEAD_DIMS = (32, 64, 80, 96, 128, 160, 192, 256)
TARGETS = ("cuda", "triton")
# what the CUDA target refuses with its own error (tests/gpu/test_gpu_cuda.py checks each):
# a softmax sink, the naive schedule; FP8 inputs in any layout but attncc.fp8.quantize's
# (checked on its output)
CUDA_REFUSES = ("sinks", "naive", "fp8_block", "fp8_causal")
NO_BACKWARD = ("decode", "decode_window", "paged_decode", "fp8_block", "fp8_causal")


@functools.cache
def kernel_of(name: str, target: str) -> attncc.Kernel:
    return attncc.compile(example_path(name), target=target)


def forward_cases() -> list[tuple[str, str]]:
    return [(n, t) for n in EXAMPLES for t in TARGETS if not (t == "cuda" and n in CUDA_REFUSES)]


def gradient_cases() -> list[tuple[str, str]]:
    names = [n for n in EXAMPLES if n not in NO_BACKWARD]
    return [(n, b) for n in names for b in TARGETS if not (b == "cuda" and n in CUDA_REFUSES)]


@contextlib.contextmanager
def noted(test: str, case: tuple[str, str], draws: tuple[Any, ...]) -> Iterator[None]:
    """A failure's test, case, draws and error appended to $ATTNCC_GPU_FUZZ_LOG, if set."""
    try:
        yield
    except Exception as error:
        log = os.environ.get("ATTNCC_GPU_FUZZ_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{test} {case} {draws}: {type(error).__name__}: {error}\n")
        raise


@st.composite
def realistic_sizes(draw: st.DrawFn, kernel: attncc.Kernel) -> dict[str, int]:
    """Sizes with long lengths kept to a batch entry or two and few heads (the float64
    reference holds every score)."""
    return draw(sizes_for(kernel.ir, LENGTHS, HEAD_DIMS, most=2, value_dims=HEAD_DIMS))


@pytest.mark.parametrize(("name", "target"), forward_cases())
@DRAWS
@given(data=st.data())
def test_forward_at_drawn_sizes(name: str, target: str, data: st.DataObject) -> None:
    kernel = kernel_of(name, target)
    sizes = data.draw(realistic_sizes(kernel), label="sizes")
    params = data.draw(params_for(kernel, sizes), label="params")
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    layout = data.draw(st.sampled_from(LAYOUTS), label="layout")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    with noted("forward", (name, target), (sizes, params, dtype, layout, seed)):
        assert_matches(kernel, sizes, params, dtype, layout, seed)
    torch.cuda.empty_cache()


@pytest.mark.parametrize(("name", "backend"), gradient_cases())
@DRAWS
@given(data=st.data())
def test_gradients_at_drawn_sizes(name: str, backend: str, data: st.DataObject) -> None:
    """The sm_90a backward ("cuda", after the CUDA target's forward) takes q, k and v's
    gradients (it has no side gradients) where it can run; Triton's every float input's."""
    kernel = kernel_of(name, backend)
    sizes = data.draw(realistic_sizes(kernel), label="sizes")
    params = data.draw(params_for(kernel, sizes), label="params")
    dtypes = DTYPES[1:] if backend == "cuda" else DTYPES  # float32 always takes Triton's
    dtype = operand_dtype(kernel.ir) or data.draw(st.sampled_from(dtypes), label="dtype")
    layout = data.draw(st.sampled_from(LAYOUTS), label="layout")
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    given_inputs = make_inputs(kernel.ir, sizes, dtype, layout, seed)
    floats = [n for n, t in given_inputs.items() if t.is_floating_point()]
    needs: Any = ("q", "k", "v") if backend == "cuda" else floats
    before = os.environ.get("ATTNCC_BACKWARD")
    os.environ["ATTNCC_BACKWARD"] = backend
    try:
        with noted("gradients", (name, backend), (sizes, params, dtype, layout, seed)):
            verdicts = gradient_verdicts(
                name, given_inputs, params, backend, needs=needs, spec=example_path(name)
            )
            failing = {n: v for n, v in verdicts.items() if not v.ok}
            assert not failing, failing
    finally:
        if before is None:
            del os.environ["ATTNCC_BACKWARD"]
        else:
            os.environ["ATTNCC_BACKWARD"] = before
    torch.cuda.empty_cache()
