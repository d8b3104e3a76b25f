"""The history's results table is made from one list of columns, each a PolicyResult field."""

from __future__ import annotations

from dataclasses import fields

from trtbuild.nightly.history import ADDED_COLUMNS, RESULT_COLUMNS, _tables
from trtbuild.nightly.runner import PolicyResult


def test_every_result_field_is_a_column_and_every_added_column_is_declared():
    stored = {f.name for f in fields(PolicyResult)} - {"path", "outputs"}  # outputs: its table
    assert {c for c, _ in RESULT_COLUMNS} | {"policy"} == stored
    tables = _tables().tables
    assert all(column in tables[table].c for table, column in ADDED_COLUMNS)
