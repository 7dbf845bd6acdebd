"""Specs that check but are not attention the kernels can run: each is a SpecError at the
construct, with a hint, never an IRError from the verifier (an IRError is a compiler bug)."""

from __future__ import annotations

import pytest

import attncc
from attncc.spec import SpecError

BASE = """attention t
dims B, H, M, N, D
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
in w[B, H, M, N]
s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d]
{extra}
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""

# (id, spec text, "line:column", a phrase of the message)
CASES = [
    (
        "contraction-in-modification",
        BASE.format(extra="s = s + q[b, h, m, e] * k[b, h, n, e]"),
        "8:1",
        "a score modification is elementwise, but this one sums over 'e'",
    ),
    (
        "second-definition-is-a-contraction",
        BASE.format(extra="s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d]"),
        "8:1",
        "sums over 'd'",
    ),
    (
        "modification-sums-an-aux-tensor",
        BASE.format(extra="s = s + w[b, h, m, j]"),
        "8:1",
        "sums over 'j'",
    ),
    (
        "modification-reads-the-query",
        BASE.format(extra="s = s + q[b, h, m, 0]"),
        "8:9",
        "a score modification cannot read the query tensor 'q'",
    ),
    (
        "modification-reads-the-value",
        BASE.format(extra="s = s * v[b, h, n, 0]"),
        "8:9",
        "cannot read the value tensor 'v'",
    ),
    (
        "mask-reads-the-key",
        BASE.format(extra="mask k[b, h, n, 0] > 0.0"),
        "8:6",
        "a mask cannot read the key tensor 'k'",
    ),
    (
        "scale-reads-the-value",
        BASE.format(extra="").replace(
            "* k[b, h, n, d]\n", "* k[b, h, n, d] * (v[0, 0, 0, 0] + 1.0)\n"
        ),
        "7:50",
        "a scalar factor of the scores cannot read the value tensor 'v'",
    ),
    (
        "modification-after-the-softmax",
        BASE.format(extra="").replace("p = softmax(s, n)\n", "p = softmax(s, n)\ns = s * 2.0\n"),
        "10:1",
        "'s' is modified after the softmax has read it",
    ),
    (
        # self-attention lets s[b, h, n, m] check; it is another score, not this one
        "scores-read-transposed",
        BASE.replace("dims B, H, M, N, D", "dims B, H, N, D")
        .replace("M", "N")
        .format(extra="s = s + s[b, h, n, m]"),
        "8:9",
        "a score modification reads 's' at its own indices only",
    ),
]


@pytest.mark.parametrize(
    ("text", "at", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_not_runnable_attention_is_a_spec_error(text: str, at: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        attncc.optimise(text)
    err = info.value
    assert message in err.message, str(err)
    assert err.span is not None and f"{err.span.line}:{err.span.column}" == at, str(err)
    assert err.hint, str(err)


def test_an_aux_tensor_in_a_modification_still_lowers() -> None:
    _, kernel = attncc.optimise(BASE.format(extra="s = s + w[b, h, m, n]"))
    assert len(kernel.score_mods) == 1
