"""The nightly history: one database, an SQLite file on one machine or PostgreSQL for many.

Why a database: a night (or one shard of it) is written in one transaction,
whole or not at all, and the questions asked of it (the last passing night in
a lane, a policy's trend, every shard of a night) are queries. One code path
serves both kinds, SQLAlchemy Core: SQLite by path or `sqlite:///` URL (the
default; WAL and a busy timeout let shards on one machine write at once), and
PostgreSQL by a libpq URL (`postgresql://user@host/db`, or the Unix-socket form
`postgresql://user@/db?host=/run/postgresql`) through psycopg 3, the optional
`postgres` extra. trtbuild creates the schema and upgrades it in place.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trtbuild.accuracy.report import METRICS
from trtbuild.errors import UsageError
from trtbuild.fsutil import dumps_json
from trtbuild.nightly.runner import PolicyResult

SCHEMA_VERSION = 3
# The results' columns after its keys (run_id, policy), each a PolicyResult field of the
# same name, with its kind: the table, the row written and the result read back are made
# from this one list. `_JSON` ones are stored as JSON text (their value when null).
RESULT_COLUMNS = (
    ("status", "TEXT"),
    ("exit_code", "INTEGER"),
    *((c, "TEXT") for c in ("evaluator", "emulation", "backend", "device", "trt_version")),
    ("model_sha256", "TEXT"),
    ("policy_sha256", "TEXT"),
    ("low_share", "REAL"),
    ("quantized_share", "REAL"),  # INT8/FP8 compute of a quantized model
    ("fp32_nodes", "INTEGER"),
    *((c, "TEXT") for c in ("message", "versions", "shapes")),
)
_REQUIRED = frozenset({"status", "exit_code"})  # NOT NULL
_JSON = {"versions": "{}", "shapes": "[]"}
# The runs' columns added since the first history format, with their kind
RUN_COLUMNS = (
    ("night", "TEXT"),
    ("shard", "INTEGER"),
    ("shards", "INTEGER"),
    ("device", "TEXT"),
    ("attempt", "INTEGER"),
)
# Columns added since the first history format: an older database gains them on open, of
# the kind its table declares.
ADDED_COLUMNS = (
    ("results", "emulation"),
    ("outputs", "max_abs_of_range"),
    ("results", "shapes"),
    ("outputs", "checks"),
    ("runs", "night"),
    ("runs", "shard"),
    ("runs", "shards"),
    ("runs", "device"),
    ("results", "device"),
    ("results", "trt_version"),
    ("runs", "attempt"),
    ("results", "quantized_share"),
)
# Columns renamed since (table, old, new): an older database's column is renamed on open.
# fp16_share held the share in the policy's low precision, FP16 or BF16: low_share says so.
RENAMED_COLUMNS = (("results", "fp16_share", "low_share"),)
# The columns that make a table ours: a database whose table lacks one holds another schema.
_OURS = {
    "runs": {"id", "started", "finished", "host", "versions"},
    "results": {"run_id", "policy", "status", "exit_code"},
    "outputs": {"run_id", "policy", "output", "passed"},
}
_LANE = ("evaluator", "emulation", "backend", "device")  # a regression compares like with like
_PG_LOCK = 0x7472_7462  # "trtb": one schema change at a time across shards
BUSY_SECONDS = 60  # how long an SQLite history waits for another shard's write lock
_SQLITE_BUSY = 5  # SQLite's result code behind "database is locked"


def _tables():
    """The schema, built per history (SQLAlchemy's MetaData is mutable: none at module level)."""
    from sqlalchemy import Column, Float, ForeignKey, Integer, MetaData, Table, Text

    kinds = {"TEXT": Text, "INTEGER": Integer, "REAL": Float}
    md = MetaData()
    Table(
        "runs",
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("started", Text, nullable=False),
        Column("finished", Text, nullable=False),
        Column("host", Text, nullable=False),
        Column("versions", Text, nullable=False),
        *(Column(c, kinds[k]) for c, k in RUN_COLUMNS),
        sqlite_autoincrement=True,
    )
    Table(
        "results",
        md,
        Column("run_id", Integer, ForeignKey("runs.id"), primary_key=True),
        Column("policy", Text, primary_key=True),
        *(Column(c, kinds[k], nullable=c not in _REQUIRED) for c, k in RESULT_COLUMNS),
    )
    Table(
        "outputs",
        md,
        Column("run_id", Integer, ForeignKey("runs.id"), primary_key=True),
        Column("policy", Text, primary_key=True),
        Column("output", Text, primary_key=True),
        Column("passed", Integer, nullable=False),
        *(Column(m, Integer if m == "nonfinite" else Float) for m in METRICS),
        Column("checks", Text),
    )
    Table("trtbuild_meta", md, Column("key", Text, primary_key=True), Column("value", Text))
    return md


def history_url(target: str | Path) -> Any:
    """The SQLAlchemy URL of `--history`: a path (SQLite) or a URL; exit 2 for anything else."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    text = str(target)
    if "://" not in text:
        path = Path(text).expanduser().resolve()
        _regular_or_new(path, text)
        return make_url(f"sqlite:///{path}")
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise _bad_url(text, str(exc)) from None
    scheme = url.drivername.split("+")[0]
    if scheme == "sqlite":
        return url
    if scheme in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg")
    raise _bad_url(text, f"unsupported scheme '{url.drivername}'")


def _regular_or_new(path: Path, text: str) -> None:
    """Exit 2 where an SQLite history's path is there and no regular file (a device, a FIFO,
    a folder): SQLite would fail on it, and leave its `-journal` file beside it first
    (`/dev/null-journal`, found by random command lines)."""
    from trtbuild.fsutil import file_kind

    kind = file_kind(path)
    if kind:
        raise UsageError(
            f"--history: {kind}, not an SQLite file",
            where=text,
            hint="give an SQLite file's path (a new one is made), or a postgresql:// URL",
        )


def _bad_url(text: str, why: str) -> UsageError:
    return UsageError(
        f"--history: not a history path or URL ({why})",
        where=_redacted(text),
        hint="give an SQLite path, sqlite:///PATH or postgresql://USER@HOST/DB; "
        "through a Unix socket, postgresql://USER@/DB?host=/SOCKET/DIR",
    )


def _redacted(text: str) -> str:
    """A URL without its password, to name it in a message."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(text).render_as_string(hide_password=True)
    except Exception:  # not a URL at all: a path, shown as given
        return text


class History:
    """One history database, opened (and created or upgraded) by `open_history`."""

    def __init__(self, engine: Any, where: str):
        self.engine, self.where = engine, where
        self.t = _tables().tables

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """One transaction; a database that fails under it is exit 2 naming it."""
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with self.engine.begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise _unusable(self.where, exc) from None

    def record(self, started: str, results: list[PolicyResult], versions: dict, **run: Any) -> int:
        """One night (or one shard of it), in one transaction: whole or not at all.

        `run` holds `night`, `shard`, `shards` and `device` where a shard wrote it. A
        shard run again under its night (a CI retry) is its next `attempt`: every attempt
        is kept, and the last one counts (`latest`).
        """
        finished = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        with self.transaction() as conn:
            row = {"started": started, "finished": finished, "host": socket.gethostname()}
            row["versions"] = json.dumps(versions)
            row["attempt"] = _attempt(conn, self.t["runs"], run)
            run_id = conn.execute(
                self.t["runs"].insert().values(**row, **run)
            ).inserted_primary_key[0]
            for r in results:
                conn.execute(self.t["results"].insert().values(**_result_row(run_id, r)))
                rows = [_output_row(run_id, r.policy, n, m) for n, m in r.outputs.items()]
                if rows:
                    conn.execute(self.t["outputs"].insert(), rows)
        return int(run_id)

    def last_pass(self, r: PolicyResult, run_id: int, night: str | None) -> dict | None:
        """The last passing result of `r`'s policy before `run_id`, in `r`'s lane, not of `night`.

        A result that errored before it was judged has no evaluator: it is matched by its
        device alone.
        """
        from sqlalchemy import select

        runs, results = self.t["runs"], self.t["results"]
        q = (
            select(results, runs.c.started)
            .join(runs, runs.c.id == results.c.run_id)
            .where(results.c.policy == r.policy, results.c.status == "pass")
            .where(results.c.run_id < run_id, latest(self.t))
        )
        lane = _LANE if r.evaluator is not None else ("device",)
        for key in lane:
            value = getattr(r, key)
            q = q.where(results.c[key].is_(None) if value is None else results.c[key] == value)
        if night is not None:
            q = q.where((runs.c.night.is_(None)) | (runs.c.night != night))
        with self.transaction() as conn:
            row = conn.execute(q.order_by(results.c.run_id.desc()).limit(1)).mappings().first()
        return dict(row) if row is not None else None

    def outputs(self, run_id: int, policy: str) -> dict[str, dict[str, Any]]:
        from sqlalchemy import select

        o = self.t["outputs"]
        q = select(o).where(o.c.run_id == run_id, o.c.policy == policy)
        with self.transaction() as conn:
            rows = list(conn.execute(q).mappings())
        return {row["output"]: {**row, **{k: number(row[k]) for k in METRICS}} for row in rows}

    def trend(self, policy: str, device: str | None = None, limit: int = 60) -> list[dict]:
        """The policy's last `limit` results (in one lane's device where given), oldest first."""
        from sqlalchemy import select

        runs, results = self.t["runs"], self.t["results"]
        q = select(results.c.run_id, results.c.status, runs.c.started).join(
            runs, runs.c.id == results.c.run_id
        )
        q = q.where(results.c.policy == policy, latest(self.t))
        if device is not None:
            q = q.where(results.c.device == device)
        with self.transaction() as conn:
            rows = list(conn.execute(q.order_by(results.c.run_id.desc()).limit(limit)).mappings())
        return [
            {
                "run": row["run_id"],
                "started": row["started"],
                "status": row["status"],
                "outputs": self.outputs(row["run_id"], policy),
            }
            for row in reversed(rows)
        ]

    def night(self, night: str) -> tuple[list[dict], list[tuple[int, PolicyResult]]]:
        """Every shard run of `night` (each attempt) and, as (run id, result), the results of
        each policy's last attempt: a retried shard supersedes what it ran before."""
        with self.transaction() as conn:
            shard_runs, rows = _night_rows(conn, self.t, night)
        found = [
            (row["run_id"], _policy_result(row, self.outputs(row["run_id"], row["policy"])))
            for row in rows
        ]
        return shard_runs, found


def latest(t: dict) -> Any:
    """Where a result is the night's last at its policy on its device: no later run of the
    same night and device wrote that policy. A run without a night (no `--run-id`) is
    never retried. Why a query, not a flag: a history written before attempts were kept,
    with a night's retries in it, reads right too.

    Why not per shard: a night whose matrix changed between attempts (shards 1/2, then
    2/3) ran a policy in two shards of different counts (its shard follows from the
    count), and each counted: the night's total held it twice. A policy's later run in
    its night supersedes the earlier one whichever shard ran it.
    """
    from sqlalchemy import and_, exists, func, select

    runs, results = t["runs"], t["results"]
    mine, later = runs.alias("mine"), runs.alias("later")
    again = results.alias("again")
    return ~exists(
        select(again.c.run_id)
        .join(later, later.c.id == again.c.run_id)
        .join(mine, mine.c.id == results.c.run_id)
        .where(
            and_(
                again.c.policy == results.c.policy,
                again.c.run_id > results.c.run_id,
                later.c.night == mine.c.night,
                func.coalesce(later.c.device, "") == func.coalesce(mine.c.device, ""),
            )
        )
    )


def _attempt(conn: Any, runs: Any, run: dict[str, Any]) -> int:
    """1 + the runs already recorded for this night, shard and device (1 without a night)."""
    from sqlalchemy import func, select

    if run.get("night") is None:
        return 1
    q = select(func.count()).where(
        runs.c.night == run["night"],
        func.coalesce(runs.c.shard, 1) == (run.get("shard") or 1),
        func.coalesce(runs.c.device, "") == (run.get("device") or ""),
    )
    return int(conn.execute(q).scalar() or 0) + 1


def _night_rows(conn: Any, t: dict, night: str) -> tuple[list[dict], list[Any]]:
    """The runs of `night`, oldest first, and the latest attempt's result rows."""
    from sqlalchemy import select

    runs, results = t["runs"], t["results"]
    q = select(runs).where(runs.c.night == night).order_by(runs.c.id)
    shard_runs = [dict(r) for r in conn.execute(q).mappings()]
    ids = [r["id"] for r in shard_runs]
    q = select(results).where(results.c.run_id.in_(ids), latest(t)).order_by(results.c.run_id)
    return shard_runs, list(conn.execute(q).mappings())


def _policy_result(row: Any, outputs: dict[str, dict[str, Any]]) -> PolicyResult:
    """A PolicyResult as the history keeps it (the summary judges from the history alone)."""
    metrics = {}
    for name, o in outputs.items():
        m = {k: o[k] for k in METRICS}
        m["passed"] = bool(o["passed"])
        m["checks"] = _loads(o["checks"], "{}")
        metrics[name] = m
    fields = {c: row[c] if k == "TEXT" else number(row[c]) for c, k in RESULT_COLUMNS}
    fields.update({c: _loads(row[c], empty) for c, empty in _JSON.items()})
    fields["message"] = row["message"] or ""
    return PolicyResult(policy=row["policy"], path="", outputs=metrics, **fields)


def number(v: Any) -> float | None:
    """A metric as a number, `"inf"` and `"nan"` (as JSON writes them) as floats; None for
    anything that is no number.

    Why: a history is read night after night, and SQLite keeps any value in any column:
    text in a metric's cell (a hand edit, another program) is a value the history does
    not have, like NULL, not a bug of trtbuild's that stops the night (exit 70).
    """
    if v is None or isinstance(v, (int, float)):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _loads(text: Any, empty: str) -> Any:
    """A JSON column's value; `empty`'s value where it is missing, not JSON or of another
    kind (a damaged history reads as one that lacks the value, as `number` does)."""
    default = json.loads(empty)
    try:
        found = json.loads(text) if text else default
    except (TypeError, ValueError):
        return default
    return found if isinstance(found, type(default)) else default


def _result_row(run_id: int, r: PolicyResult) -> dict[str, Any]:
    row = {"run_id": run_id, "policy": r.policy}
    row.update({c: getattr(r, c) for c, _ in RESULT_COLUMNS})
    row.update({c: dumps_json(getattr(r, c)) for c in _JSON})
    return row


def _output_row(run_id: int, policy: str, name: str, m: dict[str, Any]) -> dict[str, Any]:
    row = {"run_id": run_id, "policy": policy, "output": name, "passed": int(m["passed"])}
    row.update({k: number(m.get(k)) for k in METRICS})
    row["checks"] = dumps_json(m.get("checks", {}))
    return row


def _unusable(where: str, exc: Exception) -> UsageError:
    first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return UsageError(
        f"cannot use the history database: {first[0] if first else type(exc).__name__}",
        where=where,
        hint="check --history: is the server up, may the user connect, is the file one "
        "trtbuild nightly wrote? Or give a new path",
    )


def open_history(target: str | Path, *, create: bool = True) -> History:
    """Connect, then create the schema or upgrade an older one in place; exit 2 when the
    database cannot be used (unreachable, not a database, another schema, no driver).

    With `create` False (a reader: `trtbuild summary`), an SQLite file that is not there
    is exit 2 naming it: a mistyped path must not leave an empty history behind.
    """
    from sqlalchemy.exc import SQLAlchemyError

    url = history_url(target)
    where = _redacted(str(target))
    if not create:
        _check_exists(url)
    try:
        engine = _engine(url)
    except OSError as exc:  # its folder cannot be made: a file in the way, a read-only disk
        raise UsageError(
            f"cannot create the history's folder: {exc.strerror}: {exc.filename}",
            where=where,
            hint="give --history a path whose folders exist or can be created",
        ) from None
    history = History(engine, where)
    try:
        with engine.begin() as conn:
            _schema(conn, history.t, where)
    except SQLAlchemyError as exc:
        engine.dispose()
        raise _unusable(where, exc) from None
    except UsageError:
        engine.dispose()
        raise
    return history


def _check_exists(url: Any) -> None:
    """Exit 2 when `url` is an SQLite file that does not exist (SQLite would create it)."""
    database = url.database if url.drivername.startswith("sqlite") else None
    if database and database != ":memory:" and not Path(database).exists():
        raise UsageError(
            f"history not found: {database}",
            hint="pass the --history the nightly wrote; `trtbuild nightly` creates one",
        )


def _engine(url: Any) -> Any:
    """An engine; SQLite in WAL mode (the switch tried again while another shard makes the
    same new file: `_to_wal`) with a busy timeout, each transaction taking the write lock at
    BEGIN, so shards on one machine wait for each other instead of failing."""
    from sqlalchemy import create_engine, event

    if url.drivername.startswith("postgresql"):
        try:
            import psycopg  # noqa: F401 - the driver SQLAlchemy loads for postgresql+psycopg
        except ImportError:
            raise UsageError(
                "--history: a postgresql:// history needs the PostgreSQL driver, psycopg 3",
                hint="pip install 'trtbuild[postgres]'",
            ) from None
        return create_engine(url, pool_pre_ping=True)
    if url.database:
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": BUSY_SECONDS})

    @event.listens_for(engine, "connect")
    def _wal(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy's BEGIN below, not the driver's
        dbapi_conn.execute(f"PRAGMA busy_timeout = {BUSY_SECONDS * 1000}")
        _to_wal(dbapi_conn, time.monotonic() + BUSY_SECONDS)

    @event.listens_for(engine, "begin")
    def _immediate(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _to_wal(dbapi_conn: Any, deadline: float) -> None:
    """Put the SQLite file in WAL mode, tried again while another connection holds the
    write lock, until `deadline` (`time.monotonic`).

    Why not the busy timeout alone: on a file not yet in WAL mode (a new history), the
    switch reads the header under a shared lock and only then asks for the write lock,
    and SQLite does not wait for a lock it would take over a read it holds (two such
    connections would wait for each other for ever): while another shard switches the
    same new file, this one's switch fails at once with "database is locked", and the
    shard exits 2. The other holds that lock for one page's write; once it is released,
    the switch here finds the file in WAL mode already.
    """
    import sqlite3

    pause = 0.005
    while True:
        try:
            dbapi_conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.1)


def _busy(exc: Exception) -> bool:
    """Whether an SQLite error is SQLITE_BUSY, another connection's lock ("database is
    locked"): by its code where Python gives it (3.11 and later), else by SQLite's words."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == _SQLITE_BUSY
    return str(exc).startswith("database is locked")


def _schema(conn: Any, tables: dict, where: str) -> None:
    """Create what is missing, add the columns an older trtbuild did not write, and refuse
    a database whose tables of these names are not ours."""
    from sqlalchemy import inspect, text

    if conn.dialect.name == "postgresql":  # shards starting at once create the schema once
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK})
    have = {
        t: {c["name"] for c in inspect(conn).get_columns(t)}
        for t in inspect(conn).get_table_names()
    }
    if "trtbuild_meta" in have:  # a newer trtbuild's tables are its own: say that first
        _readable_version(conn, tables["trtbuild_meta"], where)
    for name, needed in _OURS.items():
        missing = needed - have.get(name, needed)
        if missing:
            raise UsageError(
                f"the history database holds a table '{name}' of another schema (no column "
                f"{', '.join(sorted(missing))})",
                where=where,
                hint="give --history a database of its own (a new SQLite path or database)",
            )
    _whole(have, where)
    tables["runs"].metadata.create_all(conn)
    for table, old, new in RENAMED_COLUMNS:
        if table in have and old in have[table] and new not in have[table]:
            conn.execute(text(f"ALTER TABLE {table} RENAME COLUMN {old} TO {new}"))
    for table, column in ADDED_COLUMNS:
        if table in have and column not in have[table]:
            kind = _sql_kind(tables[table].c[column].type, conn.dialect.name)
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {kind}"))
    _schema_version(conn, tables["trtbuild_meta"], where)


def _whole(have: dict[str, set[str]], where: str) -> None:
    """Exit 2 where a history lacks one of its tables (`outputs` dropped: a hand edit, a
    cleanup script, a restore of part of a file).

    Why not make it again, as for a new history: an empty table reads as nights that
    measured nothing, so no error could grow and the trends went blank without a word;
    the rows are lost, and only the user can bring them back. A history is trtbuild's
    once it holds one of its tables (the first format had no `trtbuild_meta`).
    """
    if not (set(_OURS) | {"trtbuild_meta"}) & set(have):
        return  # a new history: every table is made
    lost = sorted(set(_OURS) - set(have))
    if lost:
        raise UsageError(
            f"the history database has no table {', '.join(map(repr, lost))} (a history "
            "trtbuild wrote has all of runs, results and outputs: a damaged one)",
            where=where,
            hint="restore the file from a backup, or give --history a new path (trtbuild "
            "does not remake a table whose rows are lost)",
        )


def _schema_version(conn: Any, meta: Any, where: str) -> None:
    """Record this trtbuild's schema version where none or an older one is recorded."""
    from sqlalchemy import select

    found = conn.execute(select(meta.c.value).where(meta.c.key == "schema")).scalar()
    if found is None:
        conn.execute(meta.insert().values(key="schema", value=str(SCHEMA_VERSION)))
    elif _readable_version(conn, meta, where) < SCHEMA_VERSION:
        conn.execute(meta.update().where(meta.c.key == "schema").values(value=str(SCHEMA_VERSION)))


def _readable_version(conn: Any, meta: Any, where: str) -> int:
    """The recorded schema version (this one's where none is); exit 2 for a newer one, or
    one that is no number.

    Why before anything else of the schema is judged: `trtbuild_meta.schema` says which
    trtbuild wrote the file, and a newer one's tables (a column renamed, a table moved)
    read as another program's or a damaged history, whose fix is not the user's (a value
    that is not a version, a hand edit or another program's table, leaves nothing to
    upgrade from).
    """
    from sqlalchemy import select

    found = conn.execute(select(meta.c.value).where(meta.c.key == "schema")).scalar()
    if found is None:
        return SCHEMA_VERSION
    version = _version(found)
    if version is None:
        raise UsageError(
            f"the history database's schema version (trtbuild_meta.schema) is "
            f"{str(found)[:40]!r}, not a number",
            where=where,
            hint="give --history a database of its own (a new SQLite path or database), or "
            f"set trtbuild_meta.schema to {SCHEMA_VERSION} if the file is trtbuild's",
        )
    if version > SCHEMA_VERSION:
        raise UsageError(
            f"the history database has schema {version}, written by a newer trtbuild "
            f"(this one writes {SCHEMA_VERSION})",
            where=where,
            hint="upgrade trtbuild",
        )
    return version


def _version(value: Any) -> int | None:
    """`value` as a whole number, or None when it is none."""
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _sql_kind(kind: Any, dialect: str) -> str:
    """The SQL type of an added column, from its table's SQLAlchemy type."""
    from sqlalchemy import Float, Integer

    if isinstance(kind, Float):
        return "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    return "INTEGER" if isinstance(kind, Integer) else "TEXT"
