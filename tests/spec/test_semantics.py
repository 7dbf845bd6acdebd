"""What the checker decides about valid specs: types of division, bare names, summation, masks."""

from __future__ import annotations

import pytest

from attncc.spec import SpecError, check, parse
from attncc.spec.check import CheckedSpec, Definition, Softmax

HEADER = """\
attention t
dims B, H, M, N, D
in q[B, H, M, D]
in k[B, H, N, D]
in v[B, H, N, D]
"""

TAIL = """\
p = softmax(s, n)
o[b, h, m, d] = p[b, h, m, n] * v[b, h, n, d]
out o
"""


def spec(body: str) -> CheckedSpec:
    return check(parse(HEADER + body + TAIL))


def error(body: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        spec(body)
    return info.value


SCORES = "s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d]\n"


# ----------------------------------------------------------------------------- division


def test_integer_division_stays_integer() -> None:
    # an i32 param accepts it, a let accepts it, a subscript accepts it
    checked = spec(
        "param half: i32 = N / 2\n"
        "let pair = n / 2 * 2\n"
        "s[b, h, m, n] = q[b, h, m, d] * k[b, h, pair, d]\n"
        "mask m / 2 >= n / 2\n"
    )
    assert checked.params["half"].dtype == "i32"
    assert list(checked.lets) == ["pair"]


def test_division_with_a_float_operand_is_float() -> None:
    err = error("param half: i32 = N / 2.0\n" + SCORES)
    assert err.message == "the default of 'half' is float, but the param is i32"
    err = error("s[b, h, m, n] = q[b, h, m, d] * k[b, h, n / 2.0, d]\n")
    assert err.message == "a subscript must be an integer, got float"


def test_one_over_sqrt_is_float() -> None:
    spec("param scale: f32 = 1 / sqrt(D)\n" + SCORES)
    err = error("param scale: i32 = 1 / sqrt(D)\n" + SCORES)
    assert err.message == "the default of 'scale' is float, but the param is i32"


def test_integer_default_for_a_float_param() -> None:
    checked = spec("param scale: f32 = 1 / 8\n" + SCORES)
    assert checked.params["scale"].dtype == "f32"


def test_remainder_needs_integers() -> None:
    spec(SCORES + "mask (m - n) % 4 == 0\n")
    assert error(SCORES + "mask (m - n) % 4.0 == 0\n").message == "'%' needs integers"


def test_param_defaults_use_earlier_params_only() -> None:
    spec("param w: i32 = 64\nparam w2: i32 = w * 2\n" + SCORES + "mask m - n < w2\n")
    err = error("param w2: i32 = w * 2\nparam w: i32 = 64\n" + SCORES)
    assert "earlier params only, not 'w'" in err.message


# ----------------------------------------------------------------------------- assignments


def test_bare_name_keeps_the_earlier_indices() -> None:
    checked = spec(SCORES + "s = s - (m - n) * 0.5\ns = s * 2.0\n")
    first, second, third = checked.steps[:3]
    assert all(isinstance(step, Definition) for step in (first, second, third))
    assert first.indices == second.indices == third.indices == ("b", "h", "m", "n")
    assert isinstance(second, Definition) and second.summed == ()
    assert checked.defined_indices("s") == ("b", "h", "m", "n")


def test_redefinition_may_repeat_the_same_indices() -> None:
    checked = spec(SCORES + "s[b, h, m, n] = s[b, h, m, n] * 2.0\n")
    assert checked.steps[1].indices == ("b", "h", "m", "n")


def test_indices_missing_on_the_left_are_summed_in_order() -> None:
    checked = spec(SCORES + "r[b] = s[b, h, m, n] * 1.0\n")
    r = checked.steps[1]
    assert isinstance(r, Definition) and r.summed == ("h", "m", "n")


def test_left_index_unused_on_the_right_broadcasts() -> None:
    checked = spec(SCORES + "r[b, h, m, n] = q[b, h, m, d] * 2.0\n")
    r = checked.steps[1]
    assert isinstance(r, Definition) and r.indices == ("b", "h", "m", "n")
    assert r.summed == ("d",)


def test_softmax_may_spell_out_the_score_indices() -> None:
    text = HEADER + SCORES + TAIL.replace("p = softmax", "p[b, h, m, n] = softmax")
    step = check(parse(text)).steps[1]
    assert isinstance(step, Softmax) and step.indices == ("b", "h", "m", "n")


def test_lets_expand_into_the_indices_they_use() -> None:
    checked = spec("let g = h / 2\ns[b, h, m, n] = q[b, h, m, d] * k[b, g, n, d]\n")
    s = checked.steps[0]
    assert isinstance(s, Definition) and s.summed == ("d",)  # g is h, not a summed index
    assert "g" not in checked.index_dims


def test_a_dim_size_and_a_constant_are_valid_subscripts() -> None:
    checked = spec("s[b, h, m, n] = q[b, h, m, d] * k[b, h, n, d] * v[b, 0, N - 1 - n, d]\n")
    assert checked.index_dims["n"] == "N"


# ----------------------------------------------------------------------------- masks and types


def test_masks_are_collected_in_order() -> None:
    checked = spec(SCORES + "mask m >= n\nmask m - n < 4\n")
    assert [mask.span.line for mask in checked.masks] == [7, 8]


def test_where_min_max_abs_types() -> None:
    spec(SCORES + "s = where(m >= n, s, s * 0.5)\ns = s + abs(m - n) * 0.1 + max(s, -5.0)\n")
    # where with integer branches is integer, so it cannot be a score on its own
    err = error(SCORES + "s = where(m >= n, 1, 0)\n")
    assert err.message == "'s' must be a float expression, got int"


def test_integer_tensors_are_fine_in_masks_and_elementwise() -> None:
    text = HEADER.replace("in v[B, H, N, D]\n", "in v[B, H, N, D]\nin doc[B, N]: i32\n")
    checked = check(parse(text + SCORES + "s = s + doc[b, n] * 1.0\nmask doc[b, n] > 0\n" + TAIL))
    assert checked.inputs["doc"].type == "int"


def test_bool_input_in_a_mask() -> None:
    text = HEADER.replace("in v[B, H, N, D]\n", "in v[B, H, N, D]\nin keep[B, N]: bool\n")
    checked = check(parse(text + SCORES + "mask keep[b, n] and m >= n\n" + TAIL))
    assert checked.inputs["keep"].type == "bool"


def test_comments_blank_lines_and_indentation_are_ignored() -> None:
    text = (HEADER + SCORES + "mask m >= n\n" + TAIL).replace("\n", "   # note\n\n")
    checked = check(parse(text.replace("mask", "  \tmask")))
    assert checked.output == "o"
    assert checked.masks[0].span.line == 13
