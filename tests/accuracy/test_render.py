"""What the terminal says of a report."""

from __future__ import annotations

from trtbuild.accuracy.render import at_risk_lines


def test_ops_at_risk_are_named_once_each_by_their_worst_quantity_and_the_rest_counted():
    """Two quantities of one op among the worst three named it twice and counted the rest
    by ops: four ops read as "a, a, b, +1 more"."""
    rows = [
        {"node": "a", "quantity": "sum", "peak": 9e5},
        {"node": "a", "quantity": "sum of squares", "peak": 8e5},
        {"node": "b", "quantity": "sum", "peak": 7e5},
        {"node": "c", "quantity": "sum", "peak": 6e5},
        {"node": "d", "quantity": "sum", "peak": 5e5},
    ]
    said = at_risk_lines(rows, "storage")
    assert "4 FP16 op(s)" in said
    assert said.endswith(": a (sum 9e+05), b (sum 7e+05), c (sum 6e+05), +1 more")


def test_an_op_at_risk_that_is_also_the_failure_is_not_called_not_failed():
    rows = [
        {"node": "a", "quantity": "sum", "peak": 9e5},
        {"node": "b", "quantity": "sum", "peak": 7e5},
    ]
    said = at_risk_lines(rows, "storage", failed_at="b")
    assert said.startswith("at risk (the storage emulation assumes FP32 inside kernels): 2 FP16")
    assert said.endswith(": b (sum 7e+05; the first divergence above), a (sum 9e+05)")
    last = at_risk_lines(
        [*rows, *({"node": n, "quantity": "sum", "peak": 1e5} for n in "cde")], "storage", "e"
    )
    assert (
        ": e (sum 1e+05; the first divergence above), a (sum 9e+05), b (sum 7e+05), +2 more" in last
    )
    elsewhere = at_risk_lines(rows, "storage", failed_at="c")  # failed where no risk is
    assert elsewhere.startswith("at risk (not failed; the storage emulation assumes FP32")
    assert "first divergence" not in elsewhere


def test_under_strict_the_line_says_which_sums_the_verdict_stored_itself():
    said = at_risk_lines([{"node": "a", "quantity": "sum", "peak": 9e5}], "strict")
    assert said.startswith("at risk (not failed; the strict emulation stores the sums behind")
    assert "assumes FP32 inside other kernels" in said
    assert "at risk (not failed; measured on the FP32 reference)" in at_risk_lines(
        [{"node": "a", "quantity": "sum", "peak": 9e5}], None
    )
