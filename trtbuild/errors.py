"""One error family whose members carry the exit code of the CLI contract.

Why: a builder runs unattended in Makefiles and nightly jobs, so every failure a
user can fix must end as one line that names the file, the field and the fix,
with the documented exit code, while a bug keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from trtbuild import words

T = TypeVar("T")

EXIT_OK = 0
EXIT_ACCURACY = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3
EXIT_BUG = 70  # an internal error: the traceback is kept, reported as a bug


def undecoded(text: str) -> str:
    """`text` with the bytes Python could not decode (a Latin-1 file name on Linux, read as
    lone surrogates) as `\\xfe`, the byte it is: what every file and terminal takes, and
    one spelling of the name wherever it goes (a report, the history, a message)."""
    if text.isascii() or not any("\udc80" <= ch <= "\udcff" for ch in text):
        return text
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def printable(text: str) -> str:
    """`text` with what does not print escaped (ESC as \\x1b, a newline as \\n, U+202E).

    Why: keys, values and paths in a message come from the user's files; an ESC
    sequence from a policy must not recolour or rewrite the terminal, and a newline
    must not forge a second `trtbuild: error:` line.
    """
    text = undecoded(text)
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


class TrtbuildError(Exception):
    """A failure the user can act on; `cli.main` prints it as one message.

    `field` is the policy field a layer below the policy found wrong (a pass's
    `passes.opset`, the engine's `build.compute_capabilities`): it knows the field, not the
    file; the caller that holds the policy adds the file and line (`fields_located`).
    """

    exit_code = EXIT_USAGE

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        hint: str | None = None,
        field: tuple[str | int, ...] = (),
    ):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint
        self.field = tuple(field)

    def __str__(self) -> str:
        message = f"{words.field(*self.field)}: {self.message}" if self.field else self.message
        text = f"{self.where}: {message}" if self.where else message
        if self.hint:
            text += f" ({self.hint})"
        return printable(text)


@contextlib.contextmanager
def fields_located(where_of: Callable[..., str]) -> Iterator[None]:
    """A `TrtbuildError` naming a policy field and no file, raised inside the block, raised
    again with `where_of(*field)` (the policy's `file:line`): the fix is in that file."""
    try:
        yield
    except TrtbuildError as exc:
        if not exc.field or exc.where:
            raise
        where = where_of(*exc.field)
        raise type(exc)(exc.message, where=where, hint=exc.hint, field=exc.field) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, `docker stop`, a CI job cancelled), raised where the command
    runs so that it ends as Ctrl-C does: children stopped, nothing half-written left, the
    previous artifacts kept; exit 143 (128 + SIGTERM)."""


# The stops (SIGINT, SIGTERM) trtbuild's own handlers raised in this process, kept for good:
# code between the handler and the command's end may swallow the exception or make it an
# error of its own (a nightly worker's SIGTERM, raised inside numpy's imports, was lost, and
# the worker published two policies after the night had ended)
_STOPS_RAISED: list[int] = []


def stop_raised(number: int) -> KeyboardInterrupt:
    """The exception trtbuild's handler of stop `number` raises (SIGTERM's `Terminated`,
    else KeyboardInterrupt), recorded for `raise_if_stopped`."""
    _STOPS_RAISED.append(number)
    return Terminated() if number == signal.SIGTERM else KeyboardInterrupt()


def raise_if_stopped() -> None:
    """Raise again a stop raised before in this process, where the work would be committed
    (a folder published, a file put in place, a worker's result handed back): one swallowed
    on the way must not end in a publication after the command said it was stopped."""
    if _STOPS_RAISED:
        raise Terminated if _STOPS_RAISED[0] == signal.SIGTERM else KeyboardInterrupt


def forget_stops() -> None:
    """A new command in this process (`cli.main` runs again, as the tests and the library
    run it): the last one's stop is not this one's."""
    _STOPS_RAISED.clear()


class UsageError(TrtbuildError):
    """Bad command line, policy, model or data: exit 2."""

    exit_code = EXIT_USAGE


def check_argument(
    name: str, value: object, kinds: tuple[type, ...], what: str, optional: bool = True
) -> None:
    """Refuse a library argument of a type it cannot be (exit 2, before any work).

    Why: `build(policy, out=3)`, `load_policy(b"p.yaml")`, `tune(progress=3)` or
    `check(cache="x")` failed deep inside as a TypeError or an AttributeError (exit 70
    where the CLI's words wrap them), some after the whole reference had run, where the
    documented promise is a `UsageError` naming the argument.

    Args:
        name: the argument as the library names it (`out`).
        value: what was given.
        kinds: the types it may be.
        what: what it must be, in words (`a path (str or Path)`).
        optional: None passes.
    """
    if (value is not None or not optional) and not (
        isinstance(value, kinds) and not isinstance(value, bool)
    ):
        raise UsageError(f"`{name}` must be {what}, not {type(value).__name__} {value!r:.80}")


PATH = (str, os.PathLike)  # what `check_argument` takes for a path


class BackendError(TrtbuildError):
    """Backend missing or engine build failed: exit 3."""

    exit_code = EXIT_BACKEND


_LIMITS = "raise {raise_}: trtbuild runs child processes and threads beside its own work"
_MEMORY = "free memory, raise the address-space limit (ulimit -v), or lower accuracy.memory_budget"

# What the machine around trtbuild can refuse: the user fixes these, not trtbuild's authors.
# errno -> (what happened, the fix; {path} is the file's name, {folder} its folder)
_SURROUNDINGS = {
    errno.ENOSPC: ("no space left on the device", "free space on the disk that holds {folder}"),
    errno.EDQUOT: ("disk quota exceeded", "free space in your quota on the disk of {folder}"),
    errno.EACCES: ("permission denied", "check permissions of {path}"),
    errno.EPERM: ("operation not permitted", "check permissions of {path}"),
    errno.EROFS: ("read-only file system", "write to a writable folder instead of {folder}"),
    errno.ELOOP: ("a symlink loop", "fix or remove the symlink {path}"),
    errno.EISDIR: ("is a folder where a file goes", "move the folder away or name another path"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "fix the path {path}"),
    errno.ENAMETOOLONG: ("file name too long", "use a shorter path"),
    errno.EIO: ("an input/output error of the device", "check the disk that holds {path}"),
    # `ulimit -f` (a CI job's, a container's), or a file system's largest file (FAT's 4 GiB)
    errno.EFBIG: (
        "file too large: past the file-size limit (ulimit -f) or the file system's largest file",
        "raise the file-size limit (ulimit -f), or write to another file system than {folder}",
    ),
    errno.EBUSY: ("the device or file is busy", "retry once {path} is free"),
    # the process's limits: a container's pids.max, `ulimit -n` or `-u` set low
    errno.EMFILE: ("too many open files", _LIMITS.format(raise_="the open-file limit (ulimit -n)")),
    errno.ENFILE: ("the system's open-file table is full", "close files, then retry"),
    errno.ENOMEM: ("not enough memory", _MEMORY),
    errno.EAGAIN: (
        "a new process or thread was refused",
        _LIMITS.format(raise_="the process limit (ulimit -u, a container's pids.max)"),
    ),
}


# Where a fault names no file (a write's ENOSPC, a full stdout): what it may be
_NAMELESS = "the output folder, or the file stdout or stderr is written to"


def surroundings_error(exc: BaseException) -> UsageError | None:
    """A fault of the surroundings (full disk, permissions, a symlink loop) as exit 2, naming
    the path and the fix; None for anything else.

    Why: a full disk under --out is the user's to fix, and a traceback that calls it a bug
    in trtbuild sends them to the wrong place.
    """
    if isinstance(exc, RuntimeError) and str(exc).startswith("Symlink loop from "):
        path = str(exc).removeprefix("Symlink loop from ").strip("'")  # pathlib's resolve()
        exc = OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
    if isinstance(exc, RuntimeError) and str(exc) == "can't start new thread":
        exc = OSError(errno.EAGAIN, str(exc))  # threading's word for EAGAIN
    if _memory_refused(exc):  # numpy's "Unable to allocate 2 GiB", ONNX Runtime's arena
        exc = OSError(errno.ENOMEM, str(exc) or "MemoryError")
    if isinstance(exc, FileNotFoundError) and _cwd_removed(exc):
        return UsageError(
            "the working folder was removed (before or while trtbuild ran), so a relative "
            "path names nothing",
            where=os.fsdecode(exc.filename) if exc.filename is not None else None,
            hint="run trtbuild from a folder that exists, or pass absolute paths",
        )
    if not isinstance(exc, OSError) or exc.errno not in _SURROUNDINGS:
        return None
    what, fix = _SURROUNDINGS[exc.errno]
    path = os.fsdecode(exc.filename) if exc.filename is not None else None
    folder = os.path.dirname(os.path.abspath(path)) if path else _NAMELESS
    hint = fix.format(path=path or _NAMELESS, folder=folder)
    if exc.filename2 is not None:
        what += f" (renaming to {os.fsdecode(exc.filename2)})"
    return UsageError(what, where=path, hint=hint)


# ONNX Runtime's words for an allocation refused (its arena's, a C++ bad_alloc): it raises
# them as its own exception types (onnxruntime.capi...Fail), never as MemoryError
_ORT_MEMORY = ("Failed to allocate memory", "std::bad_alloc", "bad allocation")


def _memory_refused(exc: BaseException) -> bool:
    """Whether `exc` is memory refused: a MemoryError, or ONNX Runtime's own word for it
    (a session's run under `ulimit -v` or on a full machine was exit 70, a bug)."""
    if isinstance(exc, MemoryError):
        return True
    ort = type(exc).__module__.startswith("onnxruntime")
    return ort and any(word in str(exc) for word in _ORT_MEMORY)


def _cwd_removed(exc: FileNotFoundError) -> bool:
    """Whether `exc` (os.getcwd's, which names no file, or a relative path's) is the working
    folder's, removed under the process (a CI step's or a Makefile's temporary folder)."""
    if exc.filename is not None and os.path.isabs(os.fsdecode(exc.filename)):
        return False
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def surroundings_raised(func: Callable[..., T]) -> Callable[..., T]:
    """`func` raising the surroundings' faults (`surroundings_error`) as the `UsageError` the
    CLI exits 2 with: a library call's full disk is the user's to fix, as the command's is.

    Why: the CLI maps such an `OSError` to exit 2 (`exit_code_for`), while the library
    raised it bare, though every error a user can act on is a `TrtbuildError`.
    """

    @functools.wraps(func)
    def raising(*args: Any, **kwargs: Any) -> T:
        try:
            return func(*args, **kwargs)
        except Exception as exc:  # OSError, RuntimeError, MemoryError, ONNX Runtime's
            found = surroundings_error(exc)
            if found is None:
                raise
            raise found from exc

    return raising


def exit_code_for(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one-line message for an exception that ended a command.

    Why one mapping: the CLI and the nightly (which records each policy's outcome) must
    agree on what is the user's to fix (2, 3) and what is a bug in trtbuild (70).
    """
    if isinstance(exc, TrtbuildError):
        return exc.exit_code, str(exc)
    found = surroundings_error(exc)
    if found is not None:
        return found.exit_code, str(found)
    return EXIT_BUG, printable(f"internal error (a bug): {type(exc).__name__}: {exc}")
