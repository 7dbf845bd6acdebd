"""Calling a kernel with wrong tensors: one clear TypeError/ValueError naming the spec input.

Also: inputs by position and by name agree, and params given by name override defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import attncc
from attncc.reference import reference
from attncc.runtime.kernel import Kernel

from ._support import compiled, example_path

# Triton 3.6's interpreter calls int() on one-element arrays (deprecated since NumPy 1.25)
# thousands of times per test; the warning is Triton's, not attncc's.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Conversion of an array with ndim > 0 to a scalar:DeprecationWarning"
)


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


Q, K, V = randn(1, 4, 6, 16, seed=1), randn(1, 2, 6, 16, seed=2), randn(1, 2, 6, 16, seed=3)
X = randn(1, 2, 6, 16, seed=4)
DOC = torch.tensor([[0, 0, 1, 1, 1, 2]], dtype=torch.int32)

gqa = compiled("gqa_causal", "fused")
doc = compiled("document_mask", "fused")
window = compiled("sliding_window", "fused")

# (label, call, exception type, words the message must contain)
CASES: list[tuple[str, Callable[[], Any], type[Exception], tuple[str, ...]]] = [
    ("rank", lambda: gqa(Q[0], K, V), ValueError, ("'q'", "4 dims", "(4, 6, 16)")),
    ("rank of k", lambda: gqa(Q, K, V[..., 0]), ValueError, ("'v'", "4 dims")),
    (
        "sizes disagree",
        lambda: gqa(Q, K, V[:, :, :5]),
        ValueError,
        ("'v'", "dim N", "5", "6", "'k'"),
    ),
    (
        "head dims disagree",
        lambda: gqa(Q, K[..., :8], V),
        ValueError,
        ("'k'", "dim D", "8", "16", "'q'"),
    ),
    (
        "H not a multiple of KVH",
        lambda: gqa(randn(1, 3, 6, 16), K, V),
        ValueError,
        ("H (3)", "multiple of KVH (2)"),
    ),
    ("mixed float dtypes", lambda: gqa(Q, K.half(), V), TypeError, ("'k'", "float16", "float32")),
    ("float64", lambda: gqa(Q.double(), K, V), TypeError, ("'q'", "float64")),
    ("integer as float", lambda: gqa(Q, K.int(), V), TypeError, ("'k'", "int32")),
    ("mixed devices", lambda: gqa(Q, K, V.to("meta")), ValueError, ("'v'", "meta", "cpu")),
    (
        "float where an int is declared",
        lambda: doc(X, X, X, DOC.float()),
        TypeError,
        ("'doc'", "integer", "float32"),
    ),
    ("unknown keyword", lambda: gqa(Q, K, V, sacle=0.5), TypeError, ("'sacle'", "scale")),
    ("missing input", lambda: gqa(Q, K), TypeError, ("missing", "v")),
    ("missing by name", lambda: gqa(q=Q, v=V), TypeError, ("missing", "k")),
    ("input twice", lambda: gqa(Q, K, V, q=Q), TypeError, ("'q'", "twice")),
    ("too many inputs", lambda: gqa(Q, K, V, V), TypeError, ("3 inputs", "got 4")),
]

PARAM_CASES = [
    pytest.param(
        "not a tensor",
        lambda: gqa(Q, K.numpy(), V),
        TypeError,
        ("'k'", "torch.Tensor"),
    ),
    pytest.param(
        "i32 param given a float",
        lambda: window(X, X, X, window=2.5),
        TypeError,
        ("'window'", "int", "2.5"),
    ),
    pytest.param(
        "i32 param given a bool",
        lambda: window(X, X, X, window=True),
        TypeError,
        ("'window'", "int", "True"),
    ),
    pytest.param(
        "f32 param given a string",
        lambda: window(X, X, X, scale="0.5"),
        TypeError,
        ("'scale'",),
    ),
]


def expect_clear_error(
    call: Callable[[], Any], kind: type[Exception], words: tuple[str, ...]
) -> None:
    try:
        call()
    except Exception as err:  # the type is the point of the test
        message = str(err)
        assert type(err) is kind, f"{type(err).__name__} instead of {kind.__name__}: {message}"
        assert message.startswith("attncc "), message
        for word in words:
            assert word in message, f"{word!r} not in {message!r}"
        assert "triton" not in message.lower() and "Traceback" not in message
        assert "\n" not in message, "one clear line"
    else:
        raise AssertionError("no error raised")


@pytest.mark.parametrize(("label", "call", "kind", "words"), CASES, ids=[c[0] for c in CASES])
def test_wrong_tensors_raise_a_clear_error(
    label: str, call: Callable[[], Any], kind: type[Exception], words: tuple[str, ...]
) -> None:
    expect_clear_error(call, kind, words)


@pytest.mark.parametrize(("label", "call", "kind", "words"), PARAM_CASES)
def test_wrong_arguments_raise_a_clear_error(
    label: str, call: Callable[[], Any], kind: type[Exception], words: tuple[str, ...]
) -> None:
    expect_clear_error(call, kind, words)


def test_the_generated_module_rejects_a_float_for_an_i32_param() -> None:
    """The generated module's own check, which the Kernel runs before the torch op."""
    module = window.module(interpreted=False)
    tensors, params = module._bind((X, X, X), {"window": 2.5})
    with pytest.raises(TypeError, match=r"param 'window' is i32 and must be an int, got 2\.5"):
        module._check(tensors, params)


# ----------------------------------------------------------------------- binding and params


def test_inputs_by_name_and_by_position_agree() -> None:
    by_position = gqa(Q, K, V)
    assert torch.equal(by_position, gqa(q=Q, k=K, v=V))
    assert torch.equal(by_position, gqa(v=V, q=Q, k=K))
    assert torch.equal(by_position, gqa(Q, v=V, k=K))
    assert torch.equal(by_position, gqa(Q, K, v=V, scale=0.25))  # default 1/sqrt(16)


def test_params_by_name_override_defaults() -> None:
    default = gqa(Q, K, V)
    half = gqa(Q, K, V, scale=0.5)
    assert not torch.allclose(default, half, atol=1e-3)
    exact = reference(gqa.spec)
    np.testing.assert_allclose(half.numpy(), exact(Q, K, V, scale=0.5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(default.numpy(), exact(Q, K, V), rtol=1e-4, atol=1e-5)
    # an int for an f32 param is a number too
    assert torch.equal(gqa(Q, K, V, scale=1), gqa(Q, K, V, scale=1.0))


def test_int_param_by_name() -> None:
    narrow = window(X, X, X, window=2)
    exact = reference(window.spec)(X, X, X, window=2)
    np.testing.assert_allclose(narrow.numpy(), exact, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(narrow, window(X, X, X), atol=1e-3)  # default window 1024


def test_int64_and_int32_ids_agree() -> None:
    assert torch.equal(doc(X, X, X, DOC), doc(X, X, X, DOC.long()))


# ------------------------------------------------------------- params: missing, positional
# A param without a default, not passed, once raised a bare KeyError: 'cap' from the launch.

SOFTCAP_WITHOUT_DEFAULT = (
    example_path("softcap").read_text().replace("param cap: f32 = 30", "param cap: f32")
)
CAP_LINE = 1 + SOFTCAP_WITHOUT_DEFAULT.splitlines().index("param cap: f32")


@pytest.fixture(scope="module")
def no_default(tmp_path_factory: pytest.TempPathFactory) -> Kernel:
    path = tmp_path_factory.mktemp("specs") / "softcap_no_default.attn"
    path.write_text(SOFTCAP_WITHOUT_DEFAULT)
    return attncc.compile(path)


def test_a_param_without_default_must_be_passed(no_default: Kernel) -> None:
    site = f"softcap_no_default.attn:{CAP_LINE})"
    words = ("param 'cap' (", site, "has no default; pass cap=...")
    expect_clear_error(lambda: no_default(X, X, X), TypeError, words)
    expect_clear_error(lambda: no_default(X, X, X, cap=None), TypeError, words)
    expect_clear_error(lambda: no_default._op(X, X, X, None, None), TypeError, words)
    expect_clear_error(lambda: no_default(X, X, X, scale=0.5), TypeError, words)
    capped = no_default(X, X, X, cap=2.0)
    exact = reference(no_default.spec)(X, X, X, cap=2.0)
    np.testing.assert_allclose(capped.numpy(), exact, rtol=1e-4, atol=1e-5)


def test_a_param_without_default_in_spec_text() -> None:
    kernel = attncc.compile(SOFTCAP_WITHOUT_DEFAULT)
    expect_clear_error(
        lambda: kernel(X, X, X), TypeError, (f"param 'cap' (<spec>:{CAP_LINE}) has no default",)
    )


MORE_ARGUMENT_CASES = [
    pytest.param(
        lambda: window(X, X, X, 0.5),
        TypeError,
        ("takes 3 inputs (q, k, v), got 4", "params go by name (scale=..., window=...)"),
        id="param by position",
    ),
    pytest.param(
        lambda: gqa(Q, K, V, 0.5, return_lse=True),
        TypeError,
        ("got 4", "params go by name (scale=...)"),
        id="param by position with return_lse",
    ),
    pytest.param(
        lambda: window(X, X, X, window="3"),
        TypeError,
        ("'window'", "i32", "'3'"),
        id="i32 param given a string",
    ),
    pytest.param(
        lambda: window(X, X, X, widow=3),
        TypeError,
        ("unexpected argument 'widow'", "window"),
        id="misspelt param",
    ),
]


@pytest.mark.parametrize(("call", "kind", "words"), MORE_ARGUMENT_CASES)
def test_more_wrong_arguments(
    call: Callable[[], Any], kind: type[Exception], words: tuple[str, ...]
) -> None:
    expect_clear_error(call, kind, words)


# ------------------------------------------------------------------- empty and odd tensors

EMPTY_SIZES = [
    pytest.param((0, 4, 2, 5, 5), id="B=0"),
    pytest.param((1, 4, 2, 0, 5), id="M=0"),
    pytest.param((1, 4, 2, 5, 0), id="N=0"),
    pytest.param((1, 0, 2, 5, 5), id="H=0"),
]


@pytest.mark.parametrize("schedule", ["fused", "naive", "split_kv"])
@pytest.mark.parametrize("sizes", EMPTY_SIZES)
def test_empty_dims_give_empty_or_keyless_results(sizes: tuple[int, ...], schedule: str) -> None:
    """No keys: output 0 and log-sum-exp -inf (the convention of a fully masked row); no rows:
    empty results. Never NaN, never a launch error."""
    b, h, kvh, m, n = sizes
    kernel = compiled("gqa_causal", schedule)
    q, k, v = randn(b, h, m, 16, seed=1), randn(b, kvh, n, 16, seed=2), randn(b, kvh, n, 16, seed=3)
    out, lse = kernel(q, k, v, return_lse=True)
    assert out.shape == (b, h, m, 16) and lse.shape == (b, h, m)
    if h == 0:  # (the reference divides by H / KVH = 0 in the spec's `let`)
        return
    exact_out, exact_lse = reference(kernel.spec)(q, k, v, return_lse=True)
    np.testing.assert_array_equal(out.numpy(), exact_out)
    np.testing.assert_array_equal(lse.numpy(), exact_lse)


def test_a_default_without_a_value_for_these_sizes() -> None:
    """A head dim of 0 leaves 1 / sqrt(D) without a value (once a bare ZeroDivisionError);
    with the scale given, the call has an answer: an empty output, lse = log(visible keys)."""
    q, k, v = randn(1, 4, 5, 0, seed=1), randn(1, 2, 5, 0, seed=2), randn(1, 2, 5, 0, seed=3)
    words = ("param 'scale' = 1 / sqrt(D) has no value for", "D=0", "pass scale=...")
    expect_clear_error(lambda: gqa(q, k, v), ValueError, words)
    out, lse = gqa(q, k, v, scale=1.0, return_lse=True)
    exact_out, exact_lse = reference(gqa.spec)(q, k, v, scale=1.0, return_lse=True)
    assert out.shape == exact_out.shape == (1, 4, 5, 0)
    np.testing.assert_allclose(lse.numpy(), exact_lse, rtol=1e-6)


ODD_TENSOR_CASES = [
    pytest.param(lambda: gqa(Q > 0, K, V), TypeError, ("'q'", "torch.bool"), id="bool q"),
    pytest.param(
        lambda: gqa(Q.to(torch.complex64), K, V), TypeError, ("'q'", "complex64"), id="complex q"
    ),
    pytest.param(
        lambda: gqa(torch.tensor(1.0), K, V),
        ValueError,
        ("'q'", "4 dims", "got shape ()"),
        id="0-d q",
    ),
    pytest.param(lambda: gqa([1.0], K, V), TypeError, ("'q'", "torch.Tensor", "list"), id="list"),
    pytest.param(
        lambda: gqa(randn(1, 0, 6, 16), K[:, :0], V[:, :0]),
        ValueError,
        ("H (0) must be a multiple of KVH (0)",),
        id="no kv heads",
    ),
    pytest.param(
        lambda: gqa(Q, K, V, return_lse="no"),
        TypeError,
        ("return_lse must be True or False", "'no'"),
        id="return_lse not a bool",
    ),
]


@pytest.mark.parametrize(("call", "kind", "words"), ODD_TENSOR_CASES)
def test_odd_tensors_raise_a_clear_error(
    call: Callable[[], Any], kind: type[Exception], words: tuple[str, ...]
) -> None:
    expect_clear_error(call, kind, words)


def test_size_checks_are_cached_by_the_sizes_they_read() -> None:
    """A cache growing a token a call makes each call a new key length: the checks that read
    sizes alone (the query-head grouping) are cached by the dims they read, so such calls
    find them checked (keyed by every dim, each call missed its cache)."""
    module = compiled("decode", "default").module(False)
    q = randn(1, 4, 16)
    before = module._check_dims.cache_info()
    for n in (5, 6, 7):
        k = randn(1, n, 2, 16)
        lengths = torch.full((1,), n, dtype=torch.int32)
        module._check({"q": q, "k": k, "v": k, "cache_len": lengths}, {})
    after = module._check_dims.cache_info()
    assert after.misses - before.misses <= 1 and after.hits - before.hits >= 2
    with pytest.raises(ValueError, match="H \\(6\\) must be a multiple of KVH \\(4\\)"):
        k = randn(1, 5, 4, 16)
        module._check({"q": randn(1, 6, 16), "k": k, "v": k, "cache_len": lengths}, {})
