"""A masked overflow is worded once: its node, its rule, its line per point."""

from __future__ import annotations

from trtbuild.accuracy.masked import masked_at, overflow_node, overflow_text, rule_said

FOUND = {"node": "/mul", "op": "Mul", "tensor": "t", "nonfinite": 3, "ref_max_abs": 7.0e4}


def test_the_node_and_the_rule_read_alike_everywhere():
    assert overflow_node(FOUND) == "/mul (Mul)"
    assert rule_said("warn") == "(accuracy.masked_overflow: warn)"


def test_a_point_s_line_names_the_sample_and_the_boundary_cast():
    assert masked_at("shape [1, 64]", FOUND) == (
        "masked overflow at shape [1, 64]: /mul (Mul), tensor t: 3 non-finite value(s) where "
        "FP32 is finite (FP32 peak |x| = 7e+04); every output holds"
    )
    text = overflow_text({**FOUND, "sample": 2, "source": "x"})
    assert text.startswith("/mul (Mul) (a boundary Cast of `x`), tensor t, sample 2: 3 ")
