"""Command line: argument parsing, the mapping of errors to exit codes, and what the
commands print (verdicts, `check`'s table, warnings); the work is the pipeline's.

`main(argv)` returns the exit code so tests can call it directly. Heavy modules
(onnx, onnxruntime, polygraphy, tensorrt) are imported inside the commands, so
`--help` and `schema` start instantly.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import NoReturn

from trtbuild import __version__, cores
from trtbuild.children import kept
from trtbuild.errors import (
    EXIT_BUG,
    EXIT_USAGE,
    Terminated,
    TrtbuildError,
    UsageError,
    exit_code_for,
    forget_stops,
    printable,
    raise_if_stopped,
    stop_raised,
)

_EPILOG = (
    "exit codes: 0 ok, 1 accuracy below tolerance, 2 bad usage/policy/model, 3 backend "
    "unavailable or build failed, 70 internal error (a bug: the traceback is kept), 130 "
    "interrupted, 143 terminated by SIGTERM (both: earlier artifacts left as they were), 141 "
    "the reader of stdout left"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's usage errors follow the contract too
        def say() -> None:
            self.print_usage(sys.stderr)
            print(f"trtbuild: error: {message}", file=sys.stderr)

        _last_word(say)
        raise SystemExit(EXIT_USAGE)


BACKEND_CHOICES = ["auto", "tensorrt", "tensorrt-rtx", "none"]


def parser() -> argparse.ArgumentParser:
    """The command line: one builder per command, in the order `--help` lists them.

    Public so the docs' CLI reference is generated from it (sphinx-argparse).
    """
    p = _Parser(
        prog="trtbuild",
        description="Build TensorRT engines under a per-layer precision policy, "
        "with an accuracy report against FP32.",
        epilog=_EPILOG,
    )
    p.add_argument("--version", action="version", version=f"trtbuild {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add in (
        _build_args,
        _check_args,
        _convert_args,
        _report_args,
        _prepare_args,
        _tune_args,
        _nightly_args,
        _summary_args,
        _schema_args,
        _cache_args,
    ):
        add(sub)
    return p


def _policy_args(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--policy",
        "-p",
        required=True,
        metavar="P",
        help="policy YAML; NAME.yaml (or NAME) is also looked up in ./policies/",
    )
    sp.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also show the log of Polygraphy, onnx-graphsurgeon and ONNX Runtime",
    )
    _no_cache_arg(sp)


def _no_cache_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--no-cache",
        action="store_true",
        help="compute the prepared graph and the FP32 reference afresh "
        "(cache: TRTBUILD_CACHE_DIR, default ~/.cache/trtbuild)",
    )


def _build_args(sub) -> None:
    b = sub.add_parser("build", help="prepare, assign, build and report into DIR", epilog=_EPILOG)
    _policy_args(b)
    b.add_argument("--out", "-o", type=Path, metavar="DIR", help="default: build/<policy stem>/")
    b.add_argument("--backend", choices=BACKEND_CHOICES, help="override build.backend")


def _check_args(sub) -> None:
    c = sub.add_parser(
        "check", help="validate a policy against its model; show each node's precision"
    )
    _policy_args(c)
    c.add_argument("--json", action="store_true", help="machine-readable output")


def _convert_args(sub) -> None:
    cv = sub.add_parser("convert", help="write only the mixed-precision model")
    _policy_args(cv)
    cv.add_argument("-o", "--output", required=True, type=Path, metavar="MIXED.onnx")


def _report_args(sub) -> None:
    r = sub.add_parser("report", help="the accuracy report without rebuilding", epilog=_EPILOG)
    _policy_args(r)
    r.add_argument("--engine", "-e", type=Path, metavar="E", help="engine to run (needs a GPU)")
    r.add_argument("--out", "-o", type=Path, metavar="DIR", help="default: build/<policy stem>/")


def _prepare_args(sub) -> None:
    pr = sub.add_parser("prepare", help="run the graph passes alone")
    pr.add_argument("model", type=Path, metavar="MODEL")
    pr.add_argument("-o", "--output", required=True, type=Path, metavar="OUT")
    pr.add_argument("--opset", type=int, metavar="N", help="upgrade to at least this opset")
    pr.add_argument("--no-fold", action="store_true", help="skip constant folding")
    pr.add_argument(
        "--no-fuse-layernorm",
        action="store_true",
        help="keep decomposed LayerNorms as they are (fusion needs opset >= 17)",
    )
    pr.add_argument(
        "--no-fold-batchnorm", action="store_true", help="keep BatchNormalization after Conv"
    )
    _no_cache_arg(pr)


def _tune_args(sub) -> None:
    t = sub.add_parser(
        "tune",
        help="search the smallest FP32 set that meets the tolerances; write it as a policy",
        epilog="exit codes: 0 the tuned policy passes, 1 no passing policy within the budget "
        "(the pins settled so far are written, marked as failing), 2 bad usage/policy/model",
    )
    _policy_args(t)
    t.add_argument("-o", "--output", required=True, type=Path, metavar="TUNED.yaml")
    t.add_argument(
        "--budget",
        type=int,
        default=100,
        metavar="N",
        help="evaluations at most (default: %(default)s)",
    )
    t.add_argument(
        "--objective",
        choices=["nodes", "flops"],
        default="nodes",
        help="what an FP32 pin costs: a node each, or its FLOPs (default: %(default)s)",
    )
    t.add_argument(
        "--seed",
        type=int,
        default=0,
        help="tie-breaking; same seed, same policy (default: %(default)s)",
    )
    t.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        metavar="N",
        help=f"candidates judged in parallel processes (same result as one job; default: "
        f"{cores.DEFAULT_JOBS})",
    )
    t.add_argument(
        "--force", action="store_true", help="allow -o to replace the policy being tuned"
    )
    t.add_argument(
        "--log",
        type=Path,
        metavar="FILE",
        help="JSON lines, one per evaluation (default: TUNED.log.jsonl)",
    )


def _nightly_args(sub) -> None:
    n = sub.add_parser(
        "nightly",
        help="build and report every policy, keep history, flag regressions",
        epilog="exit codes: 0 every policy passes with no regression, 1 some policy failed, "
        "errored or regressed (the summary names it), 2 bad arguments",
    )
    n.add_argument(
        "--policies",
        type=Path,
        default=Path("policies"),
        metavar="DIR",
        help="each .yaml or .yml file in it is a policy (default: %(default)s)",
    )
    _nightly_out_arg(n, "the summary, trends, JUnit and a folder per policy")
    _history_arg(n)
    n.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=1,
        metavar="N",
        help="policies in parallel (default: %(default)s)",
    )
    n.add_argument(
        "--shard",
        metavar="K/N",
        help="run shard K of N (a policy's shard follows from its name); needs --run-id",
    )
    n.add_argument(
        "--run-id",
        metavar="ID",
        help="the night's id, shared by its shards (in CI, the workflow's run id)",
    )
    n.add_argument(
        "--device",
        metavar="NAME",
        help="the lane's device (default: the GPU that ran the engines, or cpu-emulation)",
    )
    n.add_argument(
        "--backend", choices=BACKEND_CHOICES, help="override every policy's build.backend"
    )
    _margin_arg(n)
    _no_cache_arg(n)


def _margin_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--margin",
        type=float,
        default=0.25,
        metavar="F",
        help="error growth over the last passing night that counts as a regression "
        "(0.25 = 25%%; default: %(default)s)",
    )


def _check_margin(margin: float) -> None:
    """Exit 2 for a margin that is negative or not finite.

    Why: argparse's float takes `nan` and `inf`, and no error grows past either: every
    growth regression would be off without a word.
    """
    import math

    if not math.isfinite(margin) or margin < 0:
        raise UsageError(
            f"--margin {margin}: give a finite number, not negative (0.25 = 25% growth)"
        )


def _history_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--history",
        default="history/nightly.sqlite",
        metavar="PATH|URL",
        help="an SQLite path (default history/nightly.sqlite), sqlite:///PATH, or "
        "postgresql://USER@HOST/DB (postgresql://USER@/DB?host=/SOCKET/DIR for a socket)",
    )


def _nightly_out_arg(sp: argparse.ArgumentParser, what: str) -> None:
    """`--out` of `nightly` and `summary`: one folder for a night, whichever writes it."""
    sp.add_argument(
        "--out",
        "-o",
        type=Path,
        default=Path("build/nightly"),
        metavar="DIR",
        help=f"{what} (default: %(default)s)",
    )


def _summary_args(sub) -> None:
    n = sub.add_parser(
        "summary",
        help="the whole night from the history: every shard, every lane",
        epilog="exit codes: 0 every policy of every shard passes with no regression, 1 some "
        "policy failed, errored or regressed, or a shard or device did not report, 2 bad arguments "
        "or an unusable history",
    )
    _history_arg(n)
    n.add_argument("--run-id", required=True, metavar="ID", help="the night the shards ran as")
    _nightly_out_arg(n, "the summary and trends of the night, JUnit, nightly.json")
    n.add_argument(
        "--shards",
        type=int,
        default=0,
        metavar="N",
        help="shards each device was to run (default: as many as its shards recorded)",
    )
    n.add_argument(
        "--devices",
        type=int,
        default=0,
        metavar="N",
        help="devices (GPU kinds) the night was to run on; fewer that reported is a missing "
        "one (default: as many as reported)",
    )
    _margin_arg(n)


def _schema_args(sub) -> None:
    sub.add_parser("schema", help="print the policy's JSON Schema")


def _cache_args(sub) -> None:
    ca = sub.add_parser("cache", help="show or clear the cache of prepared graphs and references")
    ca.add_argument("action", choices=["info", "clear"])
    ca.add_argument("--json", action="store_true", help="machine-readable output (info)")


class _Once(logging.Filter):
    """Each warning once per command: a pass may meet the same model twice."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


# The library names its arguments (`budget`); the command line has flags for them.
LIBRARY_FLAGS = {
    "`budget`": "--budget",
    "`jobs`": "--jobs",
    "`objective`": "--objective",
    "`backend`": "--backend",
    "`output`": "-o",
    "`out`": "--out",
    "`policy`": "--policy",
}


def _flags(text: str) -> str:
    """A library message in the command line's words: each argument named as its flag."""
    for word, flag in LIBRARY_FLAGS.items():
        text = text.replace(word, flag)
    return text


class _Printable(logging.Formatter):
    """`trtbuild: warning: ...` with control characters escaped (a warning may quote the
    policy's keys and values), as `_warn` prints, the library's argument names as flags."""

    def format(self, record: logging.LogRecord) -> str:
        return f"trtbuild: warning: {_flags(printable(record.getMessage()))}"


def _warnings_handler() -> logging.Handler:
    """trtbuild's own log (its modules' `logging` warnings) as `trtbuild: warning:` lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_Printable())
    handler.addFilter(_Once())
    return handler


def _interrupted(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (or SIGTERM's `Terminated`) behind `exc`, if any (onnxruntime
    turns one that arrives while it initialises into `ImportError: initialization failed`)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _last_word(say: Callable[[], object]) -> None:
    """`say()` (the command's last lines on stderr), where stderr takes them: a full disk
    under a CI log, a reader gone. Why: its OSError, raised inside `main`'s handler, ended
    the process as Python's uncaught exception, exit 1 (the contract's 'accuracy below
    tolerance') for every error, stop or bug; the exit code is the one word left."""
    try:
        say()
        if sys.stderr is not None:
            sys.stderr.flush()
    except (OSError, ValueError):  # ValueError: the stream was closed
        pass


def _stopped(exc: KeyboardInterrupt) -> int:
    """Ctrl-C's exit (130), or SIGTERM's (143), said on one line."""
    sigterm = isinstance(exc, Terminated)
    what = "terminated (SIGTERM)" if sigterm else "interrupted"
    line = f"trtbuild: {what}; previous artifacts left as they were"
    _last_word(lambda: print(line, file=sys.stderr))
    return 143 if sigterm else 130


def _terminate(*_: object) -> None:
    if not kept(signal.SIGTERM):
        raise stop_raised(signal.SIGTERM)


def _interrupt(*_: object) -> None:
    if not kept(signal.SIGINT):
        raise stop_raised(signal.SIGINT)


def _on_stops() -> None:
    """SIGTERM ends the command as Ctrl-C does (`Terminated`): its children stopped, its
    staging folders removed. Why: `timeout`, `docker stop` and a cancelled CI job send
    SIGTERM, which killed the command where it stood (a staging folder left, a nightly's
    workers left running for good, one publishing after the night had ended). Both handlers
    leave a stop that comes while a staging folder is made or removed to that step's end
    (`fsutil.stop_kept`). The command's own process only (`run`), as `_standard_streams`:
    the library's caller keeps its own. A stop the parent left ignored (`trap '' INT`, a
    shell's background job) stays ignored, as Python leaves it."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


# Commands that read no model: they need not import onnx
_MODELLESS = frozenset({"schema", "summary", "cache"})


def _native_imports(command: str) -> None:
    """onnx (and numpy under it) imported with Ctrl-C and SIGTERM held (`stops_held`),
    for every command that reads a model: the stop comes once the import has ended.

    Why: a stop whose handler raised while onnx's native module was being made (pybind11's
    init) crashed the interpreter (SIGSEGV, exit 139 and `Fatal Python error`, about one
    SIGTERM in 40 sent in that third of a second) instead of ending it as a stop (143)."""
    if command in _MODELLESS:
        return
    from trtbuild.fsutil import stops_held

    with stops_held():
        import onnx  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code or 0)
    except KeyboardInterrupt as exc:  # a stop while the parser is made (argparse's imports)
        return _stopped(exc)
    handler = _warnings_handler()
    package_log = logging.getLogger("trtbuild")
    package_log.addHandler(handler)
    quiet = logging.NullHandler()  # Matplotlib's own notes (an unwritable HOME) are not ours
    logging.getLogger("matplotlib").addHandler(quiet)
    forget_stops()
    try:
        _native_imports(args.command)
        code = _COMMANDS[args.command](args)
        raise_if_stopped()  # a stop a library swallowed: the command says it was stopped
        return code
    except TrtbuildError as exc:
        line = f"trtbuild: error: {_flags(str(exc))}"
        _last_word(lambda: print(line, file=sys.stderr))
        return exc.exit_code
    except KeyboardInterrupt as exc:
        return _stopped(exc)
    except BrokenPipeError:  # `trtbuild ... | head`: the reader left; the work is done
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as exc:
        behind = _interrupted(exc)  # Ctrl-C inside a library's import, re-raised as its error
        return _stopped(behind) if behind is not None else _failed(exc)
    finally:
        forget_stops()  # this command's: a library call after it in this process is not stopped
        package_log.removeHandler(handler)  # main(argv) may run again in this process
        logging.getLogger("matplotlib").removeHandler(quiet)


def _standard_streams() -> None:
    """Closed standard descriptors (`2>&-`, a service's process) opened on the null device,
    Python's stderr made again where it had none, and a path's undecodable bytes (a Latin-1
    name on Linux) printed escaped, not raised.

    Why: with descriptor 2 closed, the next file opened takes it, and what ONNX Runtime and
    TensorRT print to it lands in that file (a report, the history's database); and every
    warning and error of trtbuild's, and a status line, raised on the missing stream (exit
    70). The process is the command's own here (`main` is not: the library and tests call it).
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the process's own stream
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    for stream in (sys.stdout, sys.stderr):  # undecodable bytes escaped, not raised
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")


def run() -> NoReturn:
    """The `trtbuild` command (and `python -m trtbuild`): `main`'s exit code, the process
    ended without the interpreter's teardown.

    Why: after a `convert` of a 10k-node model, freeing its objects one by one and
    tearing the modules down takes 60 to 80 ms of a 0.8 s rule edit, for a process about
    to end. What an exit must do still runs: the exit handlers (logging's flush, a
    temporary folder's cleanup, multiprocessing's children), then the streams are
    flushed (a reader of stdout that left: exit 141, as `main` says it). Where a thread
    still works, or a profiler or a debugger watches (`python -m cProfile -m trtbuild`
    writes its figures after the command returns), Python's own exit runs as usual.
    """
    _standard_streams()
    _on_stops()
    code = main()
    handlers = getattr(atexit, "_run_exitfuncs", None)  # what the interpreter's exit calls
    if handlers is None or _watched() or any(t.is_alive() and not t.daemon for t in _threads()):
        sys.exit(code)
    handlers()
    try:
        if sys.stdout is not None:  # None where the shell closed it (`>&-`)
            sys.stdout.flush()
    except BrokenPipeError:
        code = code or 141
    except (OSError, ValueError):
        code = code or 120  # what Python's own exit returns where a flush fails
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.flush()
    os._exit(code)


def _watched() -> bool:
    """Whether a profiler, a debugger or a coverage tool follows this process: they write
    what they saw at the interpreter's exit (since Python 3.12 through `sys.monitoring`,
    which `getprofile` and `gettrace` do not show)."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(i) for i in range(6))


def _threads() -> list[threading.Thread]:
    """The threads besides this one: Python's exit waits for those still working."""
    return [t for t in threading.enumerate() if t is not threading.main_thread()]


def _failed(exc: Exception) -> int:
    """The exit code for an exception no command caught (`errors.exit_code_for`): the
    surroundings' faults (a full disk, permissions, a symlink loop) are one line and exit
    2; anything else is a bug in trtbuild, with its traceback."""
    code, message = exit_code_for(exc)
    if code != EXIT_BUG:
        _last_word(lambda: print(f"trtbuild: error: {message}", file=sys.stderr))
        return code
    _last_word(traceback.print_exc)
    _last_word(
        lambda: print(
            "trtbuild: internal error: this is a bug in trtbuild; please report it with the "
            "traceback above",
            file=sys.stderr,
        )
    )
    return EXIT_BUG


def _warn(messages: list[str]) -> None:
    """Warnings as `trtbuild: warning:` lines, control characters escaped (they may quote
    the user's keys and values)."""
    for m in messages:
        print(f"trtbuild: warning: {printable(m)}", file=sys.stderr)


def _cache(args):
    from trtbuild.api import open_cache

    return open_cache(enabled=not args.no_cache, on_event=lambda message: _warn([message]))


def _out_dir(args, policy) -> Path:
    return args.out if args.out is not None else Path("build") / policy.name


def _cmd_build(args) -> int:
    from trtbuild import pipeline
    from trtbuild.policy import load_policy

    policy = load_policy(args.policy)
    outcome = pipeline.build(
        policy, _out_dir(args, policy), args.backend, args.verbose, cache=_cache(args)
    )
    _warn(outcome.report.warnings)
    _print_verdict(outcome)
    return outcome.exit_code


def _cmd_report(args) -> int:
    from trtbuild import pipeline
    from trtbuild.policy import load_policy

    policy = load_policy(args.policy)
    if args.engine is not None and not args.engine.is_file():
        raise _no_engine(args.engine)
    outcome = pipeline.report_only(
        policy, _out_dir(args, policy), args.engine, args.verbose, cache=_cache(args)
    )
    _warn(outcome.report.warnings)
    _print_verdict(outcome)
    return outcome.exit_code


def _no_engine(path: Path) -> UsageError:
    """`--engine` that names no regular file: not there, or a folder, FIFO or device (said as
    such: "not found" for a FIFO that is there read as a wrong path)."""
    from trtbuild.fsutil import file_kind

    kind = file_kind(path)
    if kind is None:
        return UsageError(
            "engine file not found", where=str(path), hint="build it first with trtbuild build"
        )
    return UsageError(
        f"{kind}, not an engine file",
        where=str(path),
        hint="pass the engine.plan a build wrote (trtbuild build)",
    )


def _print_verdict(outcome) -> None:
    from trtbuild.accuracy.render import summary

    print(summary(outcome.report))
    print(f"wrote {printable(str(outcome.out_dir))}/")


def _cmd_check(args) -> int:
    from trtbuild import api
    from trtbuild.accuracy.render import at_risk_lines, judged_line
    from trtbuild.accuracy.report import quantized_line
    from trtbuild.policy import load_policy

    policy = load_policy(args.policy)
    found = api.check(  # its warnings reach stderr through the `trtbuild` logger
        policy, cache=_cache(args), verbose=args.verbose
    )
    rows = [
        {"node": n.name, "op": n.op, "precision": n.precision, "rule": n.rule, "reason": n.reason}
        for n in found.nodes
    ]
    if args.json:
        from trtbuild.fsutil import dumps_json

        print(dumps_json(_check_json(found, rows), separators=(",", ":")))
        return 0
    header = ("node", "op", "precision", "rule", "reason")
    widths = [max(len(r[k]) for r in [*rows, dict.fromkeys(header, k)]) for k in header[:4]]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  reason")
    for r in rows:
        print("  ".join(r[k].ljust(w) for k, w in zip(header, widths)) + "  " + r["reason"])
    s = found.summary
    quantized = "".join(
        f", {n} {k}" for k, n in (("int8", s.int8_nodes), ("fp8", s.fp8_nodes)) if n
    )
    print(
        f"\n{s.fp16_nodes} fp16, {s.bf16_nodes} bf16, {s.fp32_nodes} fp32{quantized} compute nodes "
        f"({s.share_text()}); {found.casts} casts; rule hits: "
        + ", ".join(f"{k}={v}" for k, v in s.rule_hits.items())
    )
    if s.quantized.get("q_nodes") or s.quantized.get("dq_nodes"):
        print(quantized_line(s.quantized))
    risks = [asdict(r) for r in found.at_risk]
    print(at_risk_lines(risks, policy.accuracy.emulation, low=s.low_name))
    print(judged_line(found.front))
    return 0


def _check_json(found, rows: list) -> dict:
    """`check --json`: one compact line (the C encoder; indent is pure Python)."""
    return {
        "nodes": rows,
        "summary": found.summary.to_json(),
        "casts": found.casts,
        "at_risk": [asdict(r) for r in found.at_risk],
        "warnings": found.warnings,
        "points": [asdict(p) for p in found.points],
        "skipped_points": [asdict(p) for p in found.skipped_points],
    }


def _cmd_convert(args) -> int:
    from trtbuild import api
    from trtbuild.graph.model_io import save_model
    from trtbuild.policy import load_policy

    policy = load_policy(args.policy)
    _output_file(args.output, _policy_files(policy))
    front, data = api.convert_front(  # its warnings reach stderr through the `trtbuild` logger
        policy, cache=_cache(args), verbose=args.verbose
    )
    save_model(front.converted.model, args.output, data)
    s = front.assignment.summary()
    print(
        f"wrote {printable(str(args.output))}: {s.share_text()}, {s.fp32_nodes} FP32 nodes, "
        f"{len(front.converted.casts)} casts"
    )
    return 0


def _output_file(path: Path, reads: dict[str, Path | None] | None = None, flag: str = "-o") -> None:
    """Exit 2 before any work where `flag`'s file cannot be written: a folder, a device or a
    FIFO is there, a folder above it is a file or may not be written, or it is a file the
    command reads (`reads`: what each is, its path), which the write would replace (a policy
    or the FP32 model lost, and the command said `wrote`)."""
    from trtbuild.fsutil import replaceable

    for above in path.absolute().parents:
        if above.exists() and not above.is_dir():
            raise UsageError(
                "a part of the output path is a file, not a folder",
                where=str(above),
                hint=f"pass {flag} a path in a folder, not under the file {above}",
            )
    if path.is_dir():
        raise UsageError(
            "is a folder where a file goes",
            where=str(path),
            hint="move the folder away or name another path",
        )
    replaceable(path)  # a device, a FIFO, /dev/stdout: before the work, as the write would
    for what, read in (reads or {}).items():
        if read is not None and _same_file(path, read):
            raise UsageError(
                f"{flag} names {what} this command reads; writing there would replace it",
                where=str(path),
                hint="write to another path",
            )
    _may_create(path)


def _may_create(path: Path) -> None:
    """Create and remove a file where `path`'s write will (its nearest folder that exists):
    a read-only or forbidden folder is said now, as the write would say it (`OSError`, exit
    2 naming `path`), not after a search of minutes."""
    import tempfile

    from trtbuild.fsutil import creating

    folder = next(p for p in path.absolute().parents if p.exists())
    try:
        with creating(path):  # a folder that answers "no such file" (/proc): exit 2 too
            fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    os.close(fd)
    os.unlink(probe)


def _policy_files(policy) -> dict[str, Path | None]:
    """The files a command reads for `policy`, by what they are: none may be its output."""
    reference = policy.accuracy.reference_model
    return {
        "the policy": policy.path,
        "the policy's model": Path(policy.model),
        "the reference model": Path(reference) if reference else None,
    }


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (a link or another spelling of it too)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one is missing: the same file only if the same path
        return a.absolute() == b.absolute()


def _cmd_prepare(args) -> int:
    from trtbuild.front import prepared_graph
    from trtbuild.graph.model_io import check_model_file, save_model
    from trtbuild.policy.specs import OPSET_RANGE, Passes

    check_model_file(args.model, field=None)  # a path of the command line, not a policy's
    _output_file(args.output, {"the model": args.model})
    low, high = OPSET_RANGE
    if args.opset is not None and not low <= args.opset <= high:
        raise UsageError(f"--opset must be between {low} and {high}, got {args.opset}")
    passes = Passes(
        opset=args.opset,
        fold_constants=not args.no_fold,
        fuse_layernorm=not args.no_fuse_layernorm,
        fold_batchnorm=not args.no_fold_batchnorm,
    )
    prepared, _ = prepared_graph(args.model, passes, _cache(args))
    save_model(prepared.model, args.output)
    for rec in prepared.records:
        print("\n".join(rec.summary()))
    print(f"wrote {printable(str(args.output))}")
    return 0


def _cmd_tune(args) -> int:
    from trtbuild import api, tuning
    from trtbuild.errors import EXIT_ACCURACY
    from trtbuild.fsutil import write_text
    from trtbuild.policy import load_policy

    jobs = args.jobs if args.jobs is not None else tuning.default_jobs()
    tuning.check_args(args.budget, args.objective, jobs)  # before anything is loaded
    policy = load_policy(args.policy)
    tuning.check_policy(policy)
    tuning.check_output(policy, args.output, args.force)  # before the search, not after
    log = args.log or args.output.with_name(args.output.stem + ".log.jsonl")
    reads = _policy_files(policy)
    _output_file(args.output, {k: v for k, v in reads.items() if k != "the policy"})  # --force's
    _output_file(log, {**reads, "the tuned policy (-o)": args.output}, "--log")
    bar = tuning.Progress()
    try:
        tuned = api.tune(
            policy,
            budget=args.budget,
            objective=args.objective,
            seed=args.seed,
            jobs=jobs,
            cache=_cache(args),
            output=args.output,
            progress=bar,
            verbose=args.verbose,
        )
    finally:
        bar.done()
    write_text(args.output, tuned.yaml)
    result = tuned.search
    tuning.write_log(log, result)
    for ranking in result.rankings:
        print(f"  {ranking.note}, in {ranking.seconds:.1f} s")
    for k in result.pinned:
        print(f"  pinned {result.groups[k].label}: {result.reasons[k]}")
    verdict = "passes" if result.passed else "DOES NOT PASS"
    print(
        f"{verdict} (emulated-fp16, {policy.accuracy.emulation} emulation): "
        f"{result.share}, {len(result.pinned)} group(s) "
        f"pinned beyond the policy's rules, {len(result.trials)} evaluation(s)"
    )
    print(f"wrote {printable(str(args.output))} and {printable(str(log))}")
    return 0 if result.passed else EXIT_ACCURACY


def _cmd_nightly(args) -> int:
    from trtbuild import nightly

    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    _check_margin(args.margin)
    _check_run_id(args.run_id)
    shard = _shard(args.shard, args.run_id)
    _claim_out(args.out)  # not a folder of the user's: exit 2 before anything runs

    said = [True]  # False once the reader of stdout left (`| grep -q FAIL`): the night goes on

    def progress(result) -> None:
        said[0] = nightly.say(f"  {result.policy}: {result.status}") and said[0]

    night = nightly.nightly(
        args.policies,
        args.out,
        args.history,
        jobs=args.jobs,
        backend=args.backend,
        margin=args.margin,
        progress=progress,
        use_cache=not args.no_cache,
        shard=shard,
        device=args.device,
    )
    _claim_out(args.out, mark="nightly")
    said[0] = _night_lines(night) and said[0]
    wrote = (
        f"wrote {printable(str(args.out))}/summary.md, summary.html, junit.xml, nightly.json; "
        f"history {printable(args.history)} (run {night.run_id})"
    )
    said[0] = nightly.say(wrote) and said[0]
    return night.exit_code or (0 if said[0] else 141)


def _cmd_summary(args) -> int:
    from trtbuild import nightly

    _check_margin(args.margin)
    _check_run_id(args.run_id)
    for flag, value in (("--shards", args.shards), ("--devices", args.devices)):
        if value < 0:
            raise UsageError(f"{flag} must not be negative")
    _claim_out(args.out)  # the nightly's files over a folder of the user's: exit 2 first
    night = nightly.summarize(
        args.history,
        args.run_id,
        args.out,
        margin=args.margin,
        shards=args.shards,
        devices=args.devices,
    )
    _claim_out(args.out, mark="summary")
    said = _night_lines(night)
    wrote = f"wrote {printable(str(args.out))}/summary.md, summary.html, junit.xml, nightly.json"
    said = nightly.say(wrote) and said
    return night.exit_code or (0 if said else 141)


# what a nightly writes into its --out, besides one build folder per policy


def _claim_out(folder: Path, mark: str | None = None) -> None:
    """Exit 2 where the nightly's or the summary's --out holds files trtbuild did not write
    (it would overwrite them); with `mark`, say it is trtbuild's (`.trtbuild-output`)."""
    from trtbuild.artifacts import BUILD_FILES
    from trtbuild.fsutil import MARKER, check_out_folder, write_marker
    from trtbuild.nightly.runner import NIGHT_FILES

    folder = folder.resolve()
    if mark is None:
        check_out_folder(folder, known=(*NIGHT_FILES, *BUILD_FILES, MARKER), nested=True)
    elif folder.is_dir():
        write_marker(folder, mark, [n for n in NIGHT_FILES if (folder / n).exists()])


def _check_run_id(run_id: str | None) -> None:
    """Exit 2 for a blank --run-id: an unset CI variable (`--run-id "$RUN_ID"`) made every
    such night one night, each recorded as a retry of the last, so `summary` judged only
    the latest and a failing night vanished behind a passing one. And for one holding a
    control character (a newline): the summary's title broke at it, its verdict on a line
    of its own, out of CI's heading."""
    if run_id is not None and not run_id.strip():
        raise UsageError(
            f"--run-id {run_id!r} is blank: nights with it would all be one night",
            hint="give the night's id: in CI, --run-id ${{ github.run_id }}",
        )
    if run_id is not None and not run_id.isprintable():  # a newline, a tab, an escape
        raise UsageError(
            f"--run-id {run_id!r} holds a control character: the summary's title (its first "
            "line, which CI shows) breaks at it",
            hint="give the night's id on one line: in CI, --run-id ${{ github.run_id }}",
        )


def _shard(text: str | None, run_id: str | None):
    """`--shard K/N` as a Shard, or one message naming the flag."""
    from trtbuild.nightly import Shard

    if text is None:
        return Shard(night=run_id)
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise UsageError(f"--shard {text!r}: give K/N with 1 <= K <= N, for example 2/4")
    if run_id is None:
        raise UsageError(
            "--shard needs --run-id: the shards of one night share it",
            hint="in CI, --run-id ${{ github.run_id }}",
        )
    return Shard(int(k), int(n), run_id)


def _night_lines(night) -> bool:
    """The night's verdict on the terminal: regressions, failures, missing shards; False
    where the reader of stdout left (`nightly.say`)."""
    from trtbuild.nightly import night_lines, say

    return all([say(line) for line in night_lines(night)])


def _cmd_cache(args) -> int:
    from trtbuild.cache import HOMELESS, Cache, homeless_why

    cache = Cache()
    if cache.root is HOMELESS:
        raise UsageError(homeless_why())
    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {printable(str(cache.root))}")
        return 0
    info = cache.info()
    if args.json:
        from trtbuild.fsutil import dumps_json

        print(dumps_json(info, indent=2))
        return 0
    from trtbuild.sizes import fmt_bytes

    kinds = ", ".join(
        f"{n} {k} {fmt_bytes(info['bytes_by_kind'][k])}" for k, n in info["by_kind"].items()
    )
    print(
        f"{printable(str(info['root']))}: {info['entries']} entries ({kinds}), "
        f"{fmt_bytes(info['bytes'])} of {fmt_bytes(info['max_bytes'])} (TRTBUILD_CACHE_MAX_MB)"
    )
    return 0


def _cmd_schema(args) -> int:
    from trtbuild.policy.schema import SCHEMA

    print(json.dumps(SCHEMA, indent=2))
    return 0


_COMMANDS = {
    "build": _cmd_build,
    "check": _cmd_check,
    "convert": _cmd_convert,
    "report": _cmd_report,
    "prepare": _cmd_prepare,
    "schema": _cmd_schema,
    "nightly": _cmd_nightly,
    "summary": _cmd_summary,
    "tune": _cmd_tune,
    "cache": _cmd_cache,
}
