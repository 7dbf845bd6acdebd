"""Every example spec parses and checks, and the checker reads the examples as intended."""

from __future__ import annotations

from pathlib import Path

import pytest

from attncc.spec import CheckedSpec, check, load, parse, parse_file
from attncc.spec.check import Definition, Softmax

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.attn"))


def example(name: str) -> CheckedSpec:
    return check(parse_file(EXAMPLES_DIR / f"{name}.attn"))


def test_examples_are_found() -> None:
    assert len(EXAMPLES) >= 10
    assert EXAMPLES_DIR / "gqa_causal.attn" in EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_parses_and_checks(path: Path) -> None:
    checked = check(parse_file(path))
    assert checked.name == path.stem
    assert checked.spec.filename == str(path)
    assert checked.output in checked.defined_indices(checked.output) or checked.output_indices
    # exactly one softmax, over the key index, and the output is the last step
    softmaxes = [s for s in checked.steps if isinstance(s, Softmax)]
    assert len(softmaxes) == 1
    assert softmaxes[0].axis == "n"
    assert checked.steps[-1].target == checked.output
    # every index is bound to a declared dim, and every dim is used by an input
    assert set(checked.index_dims.values()) <= set(checked.dims)
    used = {d for info in checked.inputs.values() for d in info.dims}
    assert used | set(checked.derived_dims) == set(checked.dims)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_line_endings_do_not_matter(path: Path) -> None:
    text = path.read_text()
    plain = check(parse(text))
    crlf = check(parse(text.replace("\n", "\r\n")))
    unterminated = check(parse(text.rstrip("\n")))
    for other in (crlf, unterminated):
        assert other.index_dims == plain.index_dims
        assert [s.target for s in other.steps] == [s.target for s in plain.steps]


def test_load_accepts_a_path_text_or_checked_spec() -> None:
    path = EXAMPLES_DIR / "causal.attn"
    from_path = load(path)
    assert load(str(path)).name == "causal"
    assert load(path.read_text()).name == "causal"
    assert load(from_path) is from_path


def test_gqa_causal_bindings_and_steps() -> None:
    checked = example("gqa_causal")
    assert checked.dims == ("B", "H", "KVH", "M", "N", "D")
    assert checked.index_dims == {"b": "B", "h": "H", "m": "M", "n": "N", "d": "D"}
    assert list(checked.lets) == ["g"]
    assert {name: info.dims for name, info in checked.inputs.items()} == {
        "q": ("B", "H", "M", "D"),
        "k": ("B", "KVH", "N", "D"),
        "v": ("B", "KVH", "N", "D"),
    }
    assert all(info.dtype == "float" for info in checked.inputs.values())
    assert checked.params["scale"].dtype == "f32"
    assert checked.params["scale"].default is not None

    s, p, o = checked.steps
    assert isinstance(s, Definition)
    assert (s.target, s.indices, s.summed) == ("s", ("b", "h", "m", "n"), ("d",))
    assert isinstance(p, Softmax)
    assert (p.target, p.source, p.axis, p.indices) == ("p", "s", "n", ("b", "h", "m", "n"))
    assert isinstance(o, Definition)
    assert (o.target, o.indices, o.summed) == ("o", ("b", "h", "m", "d"), ("n",))

    assert len(checked.masks) == 1
    assert checked.output == "o"
    assert checked.output_indices == ("b", "h", "m", "d")
    assert checked.schedule is None


def test_decode_has_no_query_index() -> None:
    checked = example("decode")
    assert "m" not in checked.index_dims
    assert checked.index_dims == {"b": "B", "h": "H", "n": "N", "d": "D"}
    assert checked.inputs["cache_len"].dtype == "i32"
    assert checked.inputs["cache_len"].type == "int"
    assert checked.inputs["k"].dims == ("B", "N", "KVH", "D")  # token-major layout
    s, p, o = checked.steps
    assert isinstance(s, Definition) and s.indices == ("b", "h", "n") and s.summed == ("d",)
    assert isinstance(p, Softmax) and p.axis == "n"
    assert isinstance(o, Definition) and o.indices == ("b", "h", "d") and o.summed == ("n",)


def test_document_mask_binds_both_token_indices_to_n() -> None:
    checked = example("document_mask")
    assert checked.index_dims["m"] == "N"
    assert checked.index_dims["n"] == "N"
    assert checked.inputs["doc"].type == "int"


def test_alibi_modification_keeps_the_score_indices() -> None:
    checked = example("alibi")
    scores, modified = checked.steps[:2]
    assert isinstance(scores, Definition) and isinstance(modified, Definition)
    assert modified.target == "s"
    assert modified.stmt.indices is None  # written bare: s = s - ...
    assert modified.indices == scores.indices == ("b", "h", "m", "n")
    assert modified.summed == ()
    assert checked.defined_indices("s") == ("b", "h", "m", "n")


@pytest.mark.parametrize(("name", "schedule"), [("naive", "naive"), ("fused", "fused")])
def test_schedules(name: str, schedule: str) -> None:
    assert example(name).schedule == schedule


def test_params_with_integer_defaults() -> None:
    assert example("sliding_window").params["window"].dtype == "i32"
    assert example("prefix_lm").params["prefix"].dtype == "i32"
    assert example("softcap").params["cap"].dtype == "f32"
