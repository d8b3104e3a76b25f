"""The history's results table is made from one list of columns, each a PolicyResult field."""

from __future__ import annotations

from dataclasses import fields

import pytest

from trtbuild.nightly.history import ADDED_COLUMNS, RESULT_COLUMNS, _tables
from trtbuild.nightly.runner import PolicyResult


def test_every_result_field_is_a_column_and_every_added_column_is_declared():
    stored = {f.name for f in fields(PolicyResult)} - {"path", "outputs"}  # outputs: its table
    assert {c for c, _ in RESULT_COLUMNS} | {"policy"} == stored
    tables = _tables().tables
    assert all(column in tables[table].c for table, column in ADDED_COLUMNS)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_history_path_that_is_no_regular_file_is_refused_before_sqlite_opens_it(tmp_path, kind):
    """`--history /dev/null` left `/dev/null-journal` beside the device (SQLite's journal,
    made before it failed): a device, a FIFO or a folder is refused first, exit 2 naming
    it, nothing made beside it. (No device here: SQLite puts its journal beside a link's
    target, so a regression would litter /dev.)"""
    import os

    from trtbuild.errors import UsageError
    from trtbuild.nightly.history import open_history

    path = tmp_path / "h.sqlite"
    {"fifo": os.mkfifo, "folder": os.mkdir, "device": lambda p: p.symlink_to("/dev/null")}[kind](
        path
    )
    with pytest.raises(UsageError, match=r"--history: is a .*, not an SQLite file"):
        open_history(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.sqlite"]
