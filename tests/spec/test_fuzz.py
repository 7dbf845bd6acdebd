"""Random mutations of the examples: the front end answers with a checked spec or a SpecError
pointing inside the source, never with another exception."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attncc.spec import SpecError, check, parse
from attncc.spec.check import CheckedSpec

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
TEXTS = [path.read_text() for path in sorted(EXAMPLES_DIR.glob("*.attn"))]

TOKEN = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d*)?|==|!=|<=|>=|\S|\n")
# Tokens worth inserting: punctuation, keywords, names the examples use, and a few strangers.
VOCABULARY = [
    *"[](),=:*/%+-<>#$\n",
    *("==", ">=", "and", "or", "not", "in", "mask", "out", "let", "param", "view", "schedule"),
    *("softmax", "where", "exp", "i32", "f32", "bool", "q", "k", "v", "s", "p", "o"),
    *("b", "h", "m", "n", "d", "g", "B", "H", "M", "N", "D", "0", "1", "0.5", "1e3", "≥"),
]


@st.composite
def mutated_example(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        tokens = [m.span() for m in TOKEN.finditer(text)] or [(0, len(text))]
        a, b = draw(st.sampled_from(tokens))
        c, d = draw(st.sampled_from(tokens))
        i = draw(st.integers(0, len(text) - 1))
        j = draw(st.integers(0, len(text) - 1))
        match draw(st.sampled_from(["delete", "duplicate", "swap", "insert", "char"])):
            case "delete":
                text = text[:a] + text[b:]
            case "duplicate":
                text = text[:b] + " " + text[a:b] + text[b:]
            case "swap" if b <= c:
                text = text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:]
            case "insert":
                text = text[:a] + draw(st.sampled_from(VOCABULARY)) + " " + text[a:]
            case "char":
                i, j = min(i, j), max(i, j)
                op = draw(st.sampled_from(["delete", "duplicate", "swap"]))
                if op == "delete":
                    text = text[:i] + text[i + 1 :]
                elif op == "duplicate":
                    text = text[: i + 1] + text[i:]
                elif i < j:
                    text = text[:i] + text[j] + text[i + 1 : j] + text[i] + text[j + 1 :]
            case _:
                pass
    return text


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_example())
def test_mutated_examples_check_or_fail_cleanly(text: str) -> None:
    try:
        checked = check(parse(text, "m.attn"))
    except SpecError as err:
        source = text if text.endswith("\n") else text + "\n"
        lines = source.splitlines() or [""]
        assert err.span is not None
        assert 1 <= err.span.line <= len(lines)
        assert 1 <= err.span.column <= len(lines[err.span.line - 1]) + 1
        assert (err.span.end_line, err.span.end_column) >= (err.span.line, err.span.column)
        assert str(err).startswith(f"m.attn:{err.span.line}:{err.span.column}: error: ")
    else:
        assert isinstance(checked, CheckedSpec)
        assert checked.output_indices == checked.defined_indices(checked.output)
