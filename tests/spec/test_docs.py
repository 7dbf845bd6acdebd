"""docs/language.md stays true to the examples and to the checker's error format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attncc.spec import SpecError, check, parse

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "language.md").read_text()
EXAMPLES = sorted((ROOT / "examples").glob("*.attn"))


def code_block_after(heading: str) -> str:
    section = DOC.split(heading, 1)[1]
    match = re.search(r"```[a-z]*\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def test_first_example_is_gqa_causal_verbatim() -> None:
    shown = code_block_after("## A first example")
    assert shown == (ROOT / "examples" / "gqa_causal.attn").read_text()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_is_listed(path: Path) -> None:
    assert f"| `{path.name}`" in DOC


def test_error_example_is_what_the_checker_prints() -> None:
    path = ROOT / "examples" / "gqa_causal.attn"
    text = path.read_text().replace("* k[b, g, n, d]", "* k[b, g, m, d]")
    with pytest.raises(SpecError) as info:
        check(parse(text, "examples/gqa_causal.attn"))
    assert str(info.value) + "\n" == code_block_after("## Errors")


def test_keywords_listed_in_the_doc_are_the_reserved_ones() -> None:
    from attncc.spec.parser import KEYWORDS

    match = re.search(r"Keywords are reserved and cannot be used as names: `([^`]*)`", DOC)
    assert match is not None
    assert set(match.group(1).split()) == KEYWORDS
