"""Atomic file output: every artifact appears whole or not at all, and a set of artifacts
(an output folder) is published whole or not at all.

Why: a half-written engine or report that the next Makefile step loads is worse
than a clear failure, and an interrupted build must leave the previous
artifacts intact: not one new file beside two old ones.

Publication (`publish_folder`): the new set is written into a staging folder
`.NAME.staging-*` beside the output folder, held by an exclusive flock while its
build lives, the files of the old folder that the command does not own are
hard-linked into it (so they survive), and the two folders are swapped with one
`renameat2(RENAME_EXCHANGE)` on Linux; elsewhere the old folder is renamed aside
(`.NAME.old-*`) and the staged one into its place, and a kill between those two
renames is undone by the next publication, which puts the old folder back. Leftovers
of this user's that no process holds are settled by the next publication into the
same parent folder (`clean_leftovers`): by lock, never by PID, which another PID
namespace cannot see. A mount point or a folder no rename can replace (EBUSY, EXDEV)
is published into, entry by entry, the marker last (`_publish_in_place`).

An output folder carries `.trtbuild-output` (JSON: the command, the version, the
files trtbuild wrote); a folder that holds files trtbuild did not write and no
such marker is refused, so `--out ~` cannot replace a user's files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from trtbuild.errors import UsageError, raise_if_stopped

try:
    import fcntl
except ImportError:  # Windows: no flock; no leftover is ever taken for a dead one's
    fcntl = None  # type: ignore[assignment]

MARKER = ".trtbuild-output"
# tests only: "kill-at=N" SIGKILLs the process at step N of a publication, "portable"
# swaps without renameat2; unset, it costs one environment lookup per publication
TEST_HOOK = "TRTBUILD_TEST_PUBLICATION"
# Reads of the out folder a check makes while other publications replace it (each one is
# quick, and they take turns under `_publishing`'s lock): a few are plenty.
_CHECK_ATTEMPTS = 20
# How a file others may have placed is opened: never through a symlink at its end, never
# waiting on a FIFO (O_NONBLOCK), never inherited by a child; a folder, following a symlink.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
ACCESS_BY_FD = os.access in os.supports_dir_fd  # an access check of a folder's descriptor
READ_NOFOLLOW = os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
# `.NAME.staging-*`, `.NAME.old-*` (an older trtbuild put its PID first: `-PID-*`)
# mkdtemp's 8 characters, token_hex(8)'s 16 (a user's `.site.staging-eu` is no leftover)
_LEFTOVER = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>staging|old)-(?:[0-9]+-)?(?:[a-z0-9_]{8}|[0-9a-f]{16})$"
)
_DIRECTORY = FOLDER | NOFOLLOW


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it over `path` only on success.

    The temporary file lives in the same directory so the final rename is atomic
    on POSIX; on any exception (KeyboardInterrupt included) it is removed. A `path` that
    is (or links to) a device, FIFO or socket is refused (`replaceable`).
    """
    final = Path(path)
    replaceable(final)
    with creating(final):
        make_parents(final)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        except OSError as exc:  # refused: said of `path`, not of a temporary name
            raise OSError(exc.errno, exc.strerror, str(final)) from exc
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~current_umask())  # mkstemp's 0600 would make artifacts private
    try:
        yield tmp_path
        raise_if_stopped()  # a stop swallowed while it was written: the old file stays
        os.replace(tmp_path, final)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if isinstance(exc, OSError) and exc.errno and exc.filename in (None, str(tmp_path)):
            # a write's ENOSPC names no file, a rename names the temporary one: name `path`
            raise OSError(exc.errno, exc.strerror, str(final)) from exc
        raise


# what a path is that is no regular file, by its stat type
FILE_KINDS = {
    stat.S_IFDIR: "is a folder",
    stat.S_IFIFO: "is a FIFO (named pipe)",
    stat.S_IFCHR: "is a character device",
    stat.S_IFBLK: "is a block device",
    stat.S_IFSOCK: "is a socket",
}


def current_umask() -> int:
    """The process's umask, read without setting it where the system says it (Linux's
    `/proc/self/status`, from 4.7); elsewhere swapped for the strictest mask and back.

    Why: `os.umask(0)` then `os.umask(old)` is the portable read, and between the two calls
    every file or folder another thread made (the library caller's own, ONNX Runtime's)
    got umask 0: writable by anyone.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)  # for that instant, what others make is private, not open to all
    os.umask(old)
    return old


def file_kind(path: Path) -> str | None:
    """What `path` is, following links, as messages say it ("is a FIFO (named pipe)"); ""
    for a regular file, None where nothing is there. Other OSErrors (a loop, a permission)
    are the surroundings' (exit 2)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    return "" if stat.S_ISREG(mode) else FILE_KINDS.get(stat.S_IFMT(mode), "is not a regular file")


def replaceable(path: Path) -> None:
    """Exit 2 where `path` is, or links to, a device, a FIFO or a socket: a file written
    whole is renamed over its path, which puts a regular file in the device's place.

    Why: `convert -o /dev/null` (to discard the model) replaced the system's /dev/null with a
    regular file when run as root, and every later `> /dev/null` of the machine wrote into
    it (found by random command lines); `-o /dev/stdout` would replace that link. A folder
    is left to the rename's own refusal, a symlink to a file is replaced, not followed.
    """
    kind = file_kind(path)  # follows a link: /dev/stdout is one, to a pipe or a tty
    if kind == "" and _to_descriptor(path):  # /dev/stdout with stdout a file
        kind = "names an open file of this process (a link into /proc or /dev/fd)"
    elif kind in (None, "", FILE_KINDS[stat.S_IFDIR]):
        return  # a new file or a dangling link (replaced), a file, a folder (the rename's)
    raise UsageError(
        f"{kind}, not a file trtbuild can write: it writes a new file whole and renames it "
        "over the path",
        where=str(path),
        hint="name a file for the output (to discard it, write it to a temporary folder)",
    )


def _to_descriptor(path: Path) -> bool:
    """Whether `path` is a link that leads through /proc or /dev/fd (/dev/stdout, /dev/fd/1):
    renamed over, the link itself would be replaced."""
    for _ in range(40):  # the kernel's own limit of links followed
        if not path.is_symlink():
            return False
        target = Path(os.readlink(path))
        path = target if target.is_absolute() else path.parent / target
        if str(path).startswith(("/proc/", "/dev/fd/")):
            return True
    return False


@contextlib.contextmanager
def creating(path: Path) -> Iterator[None]:
    """`path` made inside: a folder that answers a new file or folder with "no such file"
    (`/proc`, a FUSE mount) is the surroundings' fault, exit 2 naming `path`.

    Why here and not for every ENOENT: a file trtbuild itself expects and does not find is
    its bug, with the traceback; only where it creates is the missing one the folder's.
    """
    try:
        yield
    except FileNotFoundError as exc:
        raise UsageError(
            "the folder refuses new files there (no such file or folder)",
            where=str(path),
            hint=f"write to a folder that takes new files instead of {path.parent}",
        ) from exc


def make_parents(path: Path) -> None:
    """The folders above `path`, made where missing; ENOTDIR naming the file where one
    of them is a file (`-o notes.txt/x.onnx`), not mkdir's FileExistsError."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        file = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        if file is None:
            raise
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(file)) from exc


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """`text` as UTF-8, a path's undecodable bytes (a policy named in Latin-1 on Linux)
    written as the bytes they are (`errors.undecoded`): a report names its policy."""
    from trtbuild.errors import undecoded

    with atomic_path(path) as tmp:
        tmp.write_text(undecoded(text), encoding="utf-8", errors="backslashreplace")


# How every JSON file trtbuild writes holds a non-finite figure: JSON has no inf or NaN, and
# Python's `json` writes `Infinity` and `NaN`, which no strict parser reads.
NONFINITE_TEXT = ("inf", "-inf", "nan")


def json_figure(value: Any) -> Any:
    """A number as trtbuild's JSON holds it: itself, or `NONFINITE_TEXT`'s word for it."""
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (math.inf, -math.inf):
        return "inf" if value > 0 else "-inf"
    return value


def strict_json(obj: Any) -> Any:
    """`obj` with every non-finite float, at any depth (a check's `worst: {abs, rel}`), as
    `json_figure` writes it, and numpy scalars as Python's."""
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if hasattr(obj, "dtype") and hasattr(obj, "item"):  # a numpy scalar (or a one-value array)
        obj = obj.item()
    return json_figure(obj)


def dumps_json(obj: Any, **kwargs: Any) -> str:
    """`json.dumps` of `strict_json(obj)`: strict JSON, which `allow_nan=False` holds it to."""
    return json.dumps(strict_json(obj), allow_nan=False, default=_json_default, **kwargs)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, dumps_json(obj, indent=2, sort_keys=False) + "\n")


def _json_default(value: Any) -> Any:
    # paths show up in reports; everything else is a bug.
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_out_folder(
    out_dir: Path, known: Collection[str], owns: Collection[str] = (), *, nested: bool = False
) -> None:
    """Exit 2 unless `out_dir` is absent, empty, or an earlier trtbuild output; and for an
    artifact name in `owns` that is a folder there (`_check_out_folder`).

    The check holds only where the folder it read stayed in place: another publication
    may replace it meanwhile (the portable swap leaves no folder between its two
    renames), and a read of a folder gone half-way says nothing about it, or the wrong
    thing ("write-protected", where `access` found no folder). It is read again then.
    """
    for _ in range(_CHECK_ATTEMPTS):
        before = _identity(_folder_stat(out_dir))
        try:
            _check_out_folder(out_dir, known, owns, nested=nested)
        except (OSError, UsageError):
            if _identity(_folder_stat(out_dir)) == before:
                raise
            continue
        if _identity(_folder_stat(out_dir)) == before:
            return
    _check_out_folder(out_dir, known, owns, nested=nested)  # replaced at every read: once more


def folder_mode(path: Path) -> int | None:
    """The permission bits of the folder at `path`, None where there is none (or it is
    being replaced right now)."""
    st = _folder_stat(path)
    return None if st is None else stat.S_IMODE(st.st_mode)


def _folder_stat(path: Path) -> os.stat_result | None:
    """The folder at `path`, in one `stat`; None where there is none (or not a folder)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st if stat.S_ISDIR(st.st_mode) else None


def _identity(st: os.stat_result | None) -> tuple[int, int, int] | None:
    """(device, inode, change time): a folder another publication renamed into the place is
    another, and so is the same folder renamed away and back (a rename changes its ctime):
    two swaps during one read left the inode as it was, and a check that had found no
    folder half-way ("write-protected") was taken for the folder's own verdict."""
    return None if st is None else (st.st_dev, st.st_ino, st.st_ctime_ns)


def _check_out_folder(
    out_dir: Path, known: Collection[str], owns: Collection[str], *, nested: bool
) -> None:
    """`check_out_folder`'s check of the folder as it is now.

    Why: publication replaces what the folder holds; a folder of the user's (`--out ~`)
    must be refused before anything is written, naming what would be lost. A folder
    without the marker is an earlier trtbuild's output only when its entries all bear
    names trtbuild writes (`known`, or a subfolder that is trtbuild's) and its
    `build.json` is one trtbuild wrote (`written_by_trtbuild`); with `nested` (the
    nightly's --out, a folder of build folders) a subfolder that is trtbuild's proves it
    too. Names alone prove nothing: a user's own `engine.plan` or `report.md` bears one.
    """
    if out_dir.parent == out_dir:
        raise UsageError("the root folder cannot be an output folder", where=str(out_dir))
    if not out_dir.is_dir():
        return
    for name in owns:
        if (out_dir / name).is_dir() and not (out_dir / name).is_symlink():
            raise UsageError(
                "is a folder where trtbuild writes a file",
                where=str(out_dir / name),
                hint="move the folder away, or pass --out another folder",
            )
    _writable(out_dir)
    entries = sorted(e for e in os.listdir(out_dir) if not _LEFTOVER.match(e))
    if MARKER in entries or not entries:
        return
    ours = {e for e in entries if e not in known and _trtbuilds(out_dir / e, known)}
    foreign = [e for e in entries if e not in known and e not in ours]
    proven = written_by_trtbuild(out_dir) or (nested and bool(ours))
    if foreign or not proven:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if foreign[3:] else "")
        stake = [e for e in entries if e in owns]
        replaced = f"; publishing into it would replace {', '.join(stake)}" if stake else ""
        what = (
            f"holds files trtbuild did not write ({shown})"
            if foreign
            else f"has no {MARKER} and no build.json trtbuild wrote, so its files may be yours"
        )
        raise UsageError(
            f"the output folder {what}{replaced}",
            where=str(out_dir),
            hint="pass --out a new or empty folder, or one trtbuild wrote (it holds "
            f"{MARKER}); or move those files away",
        )


def _writable(out_dir: Path) -> None:
    """Exit 2 where the out folder is write-protected (no owner write bit, or no access):
    publication would replace it anyway (a rename needs only its parent), against the
    protection its owner chose.

    Read through one descriptor of the folder: its mode, its file system and the access
    check all of the one folder, whatever another publication renames meanwhile (an
    `access` of the path found no folder half-way through a swap: "write-protected").
    """
    fd = os.open(out_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if hasattr(os, "fstatvfs") and os.fstatvfs(fd).f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(out_dir))  # the disk's
        if ACCESS_BY_FD:
            allowed = os.access(".", os.W_OK, dir_fd=fd)
        else:  # no access check by descriptor here: the path's
            allowed = os.access(out_dir, os.W_OK)
    finally:
        os.close(fd)
    if not mode & stat.S_IWUSR or not allowed:
        raise UsageError(
            f"the output folder is write-protected (mode {mode:o})",
            where=str(out_dir),
            hint="make it writable (chmod u+w), or pass --out another folder",
        )


def _trtbuilds(folder: Path, known: Collection[str]) -> bool:
    """Whether a subfolder is trtbuild's: it holds a marker, or only names trtbuild writes
    and a build.json trtbuild wrote (a nightly's build folder of a trtbuild that wrote no
    markers)."""
    try:
        entries = os.listdir(folder)
    except OSError:  # a file, or a folder it may not read
        return False
    if MARKER in entries:
        return True
    return bool(entries) and all(e in known for e in entries) and written_by_trtbuild(folder)


RECORD = "build.json"  # what every build writes; its keys prove a marker-less folder trtbuild's
RECORD_MAX_BYTES = 256 << 20  # a build.json of a 100k-layer engine is a few MB


def read_small(path: Path, limit: int = RECORD_MAX_BYTES) -> bytes:
    """The bytes of a small file in a folder that may be anyone's: not through a symlink
    at its end, never waiting on a FIFO, at most `limit` bytes.

    Raises:
        OSError: it cannot be opened, is no regular file (EINVAL) or is larger (EFBIG).
    """
    fd = os.open(path, READ_NOFOLLOW)
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB", str(path))
        return f.read(limit)


def written_by_trtbuild(folder: Path) -> bool:
    """Whether `folder/build.json` is a record trtbuild wrote: a JSON object with the
    trtbuild version it was written by and the sha256 of its policy (read by
    `read_small`: the folder may be anyone's)."""
    try:
        doc = json.loads(read_small(folder / RECORD))
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    versions, hashes = doc.get("versions"), doc.get("hashes")
    return (
        isinstance(doc.get("policy"), str)
        and isinstance(versions, dict)
        and isinstance(versions.get("trtbuild"), str)
        and isinstance(hashes, dict)
        and isinstance(hashes.get("policy"), str)
        and re.fullmatch(r"[0-9a-f]{64}", hashes["policy"]) is not None
    )


def write_marker(folder: Path, command: str, files: Collection[str]) -> None:
    """`.trtbuild-output`: this folder is trtbuild's, written by `command`, holding `files`."""
    from trtbuild import __version__

    doc = {"trtbuild": __version__, "command": command, "files": sorted(files)}
    write_json(folder / MARKER, doc)


def read_marker(folder: Path) -> dict[str, Any]:
    """The folder's marker, or {} where there is none (or none this trtbuild can read)."""
    try:
        doc = json.loads(read_small(folder / MARKER))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict):
        return {}
    files = doc.get("files", [])  # a damaged or foreign marker names no files, not a crash
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        doc = {**doc, "files": []}
    return doc


def alive(pid: int) -> bool:
    """Whether a process `pid` runs here (signal 0 asks without sending anything): whose
    cache temporaries may be removed (the cache also waits for their age)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    except (OverflowError, ValueError, OSError):  # no pid this system can have
        return False
    return True


@contextlib.contextmanager
def staging_folder(out_dir: Path) -> Iterator[Path]:
    """A new staging folder for `out_dir`, held by an exclusive lock (flock) while it lives
    and removed when the block ends.

    Beside `out_dir` (so one rename publishes it), or inside it where `out_dir` is a
    mount point (`-v host/build:/work/build`), which no rename can replace and whose
    parent may not even be writable. Why a lock and not the PID in the name: a build
    in another PID namespace (a container sharing the folder) sees no such PID and
    would take a running build's staging folder for a dead one's.
    """
    home = out_dir if is_mount(out_dir) else out_dir.parent
    held = None
    try:  # from the folder's making on: a stop (Ctrl-C, SIGTERM) waits for it (`stops_held`)
        with creating(out_dir):
            home.mkdir(parents=True, exist_ok=True)
            clean_leftovers(home, out_dir.name)
            try:
                with stops_held():  # made and held whole: a stop comes after, in the `try`
                    held = _held_folder(home, f".{out_dir.name}.staging-")
            except OSError as exc:  # the user knows the out folder, not the staging folder's
                raise OSError(exc.errno, exc.strerror, str(out_dir)) from exc
            if held is None:  # not EAGAIN: that is a process refused (`errors`), not this race
                raise UsageError(
                    "no staging folder could be held beside it: other runs kept taking it",
                    where=str(out_dir),
                    hint="run one build per output folder at a time",
                )
        yield held[0]
    finally:
        if held is not None:
            with stops_held():
                _removed(*held)  # after an exchange: the old set


def _removed(path: Path, fd: int) -> None:
    """A held staging folder removed, then let go. Why twice where a stop comes during the
    removal (where `stops_held` cannot hold it: another thread took the signal, or no
    POSIX signal masks): a nightly worker is stopped once (`children.worker_signals`), and
    a stop that cut the removal of a finished build's folder short left it behind."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except BaseException:  # KeyboardInterrupt, Terminated: finish, then stop
        shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        os.close(fd)


# The main thread's `stops_held` blocks open, and the stops trtbuild's own handlers took
# meanwhile (`stop_kept`), raised again as the outermost block ends.
_HOLDING = [0]
_KEPT: list[int] = []


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back while the block runs, and delivered as it ends: what
    the block makes or removes is made or removed whole (a staging folder: a stop between
    its making and the code that removes it left it behind).

    Two holds, because a process's signal goes to any thread that does not block it:
    - this thread's signal mask: a stop sent to it waits, whatever handler is installed
      (Python's, a library caller's);
    - in the main thread, trtbuild's own handlers (`cli`'s, a pool worker's) keep a stop
      they take (`stop_kept`): one another thread took (ONNX Runtime's pool, after a
      session) runs its handler in the main thread, which no mask of it holds.
    Where neither holds (another handler, another thread), the removal's own guard
    (`_removed`) is what is left.
    """
    main = threading.current_thread() is threading.main_thread()
    if main and not _HOLDING[0]:
        _KEPT.clear()  # a stop kept by a block a second stop cut short: raised by that one
    mask = getattr(signal, "pthread_sigmask", None)  # none on Windows
    before = mask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if mask else None
    _HOLDING[0] += main
    try:
        yield
    finally:
        try:
            if mask:  # a stop sent to this thread meanwhile: its handler runs now, still held
                mask(signal.SIG_SETMASK, before)
        finally:
            _HOLDING[0] -= main
        kept = list(_KEPT) if main and not _HOLDING[0] else []
        if kept:
            _KEPT.clear()
            signal.raise_signal(kept[0])  # its handler again, holding nothing now


def stop_kept(number: int) -> bool:
    """Whether trtbuild's handler of stop `number` (SIGINT, SIGTERM), running now, leaves it
    to the end of the main thread's `stops_held` block, which raises it then. Read by the
    handlers: a handler that raises anyway would cut the block short."""
    if not _HOLDING[0] or threading.current_thread() is not threading.main_thread():
        return False
    if number not in _KEPT:
        _KEPT.append(number)
    return True


def is_mount(path: Path) -> bool:
    """Whether `path` is a mount point, bind mounts of a folder of the same file system
    included (which `os.path.ismount` misses: they share their parent's device)."""
    return os.path.ismount(path) or os.path.abspath(path) in _mount_points()


def holds_mounts(folder: Path) -> bool:
    """Whether a mount point lies inside `folder` (a file or folder mounted into it): a
    rename of `folder` would carry the mount away with the old set."""
    inside = os.path.abspath(folder) + os.sep
    return any(point.startswith(inside) for point in _mount_points())


def _mount_points() -> set[str]:
    """The mount points this process sees (Linux's mountinfo; none elsewhere)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            return {_unescape(line.split()[4]) for line in f if len(line.split()) > 4}
    except OSError:  # not Linux
        return set()


def _unescape(field: str) -> str:
    """A mountinfo path: a space, tab, newline and backslash are written as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _held_folder(parent: Path, prefix: str) -> tuple[Path, int] | None:
    """A new folder `parent/prefix*` and a descriptor of it holding its exclusive lock;
    None where cleaners took eight in a row.

    A cleaner may lock and remove the folder between its creation and our lock: then
    the lock fails, or holds a folder no longer at the path, and another name is tried.
    """
    for _ in range(8):
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        try:
            fd = os.open(path, _DIRECTORY)
        except FileNotFoundError:  # a cleaner took it for a dead one's
            continue
        except BaseException:  # a stop before it is held: the new folder is not left
            shutil.rmtree(path, ignore_errors=True)
            raise
        try:
            if lock(fd) is not False and _same(fd, path):
                return path, fd
        except BaseException:
            _removed(path, fd)
            raise
        os.close(fd)
    return None


def lock(fd: int, wait: bool = False) -> bool | None:
    """Take the exclusive flock of `fd`: True; False where another process holds it; None
    where the file system (or the platform) has no such locks."""
    if fcntl is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK, EOPNOTSUPP, EINVAL: no locks here, so none tells anything
        return None
    return True


def _same(fd: int, path: Path) -> bool:
    """Whether the folder open as `fd` is still the one at `path`."""
    try:
        return os.path.samestat(os.fstat(fd), os.lstat(path))
    except OSError:
        return False


def clean_leftovers(parent: Path, name: str) -> None:
    """Settle the staging and aside folders that dead publications of `parent/name` left
    in `parent` (only that output's: a folder of another name is not this run's to judge).

    Dead means: ours (owned by this user), and no process holds its lock, whichever
    PID namespace it runs in. A staging folder is removed; an aside folder (`.NAME.old-*`,
    the portable swap's) is put back where its place is empty and it holds a
    trtbuild set, and removed only where the set now in its place names it as the one
    it replaced. A leftover of another user (planted in a shared folder) is never
    touched, linked or put back.

    Why: a SIGKILL skips every `finally`; without this, each one leaves a staging
    folder the size of a build that nothing removes.
    """
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        found = _LEFTOVER.match(entry)
        if found is None or found["name"] != name:
            continue
        path = parent / entry
        fd = _dead(path)
        if fd is None:
            continue
        try:
            if found["kind"] == "staging":
                shutil.rmtree(path, ignore_errors=True)
            else:
                _settle_aside(path, parent / found["name"])
        finally:
            os.close(fd)


def _dead(path: Path) -> int | None:
    """A descriptor holding the lock of leftover folder `path` where it is ours and no
    process holds it; None where it is alive, another user's, or cannot be told."""
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "geteuid") and st.st_uid != os.geteuid()):
            return None
        fd = os.open(path, _DIRECTORY)
    except OSError:
        return None
    if lock(fd) and _same(fd, path):
        return fd
    os.close(fd)
    return None


def _settle_aside(path: Path, home: Path) -> None:
    """An aside folder whose publication died: put back, removed, or left as it is."""
    with contextlib.suppress(OSError):
        os.rmdir(path)  # an empty reservation of the name
        return
    if not os.path.lexists(home):
        if os.path.isfile(path / MARKER) or written_by_trtbuild(path):
            with contextlib.suppress(OSError):
                os.rename(path, home)  # the portable swap was killed between its renames
        return
    if read_marker(home).get("replaced") == path.name:
        shutil.rmtree(path, ignore_errors=True)  # the set `home` replaced: moved there by it


class _Steps:
    """The steps of one publication; under `TEST_HOOK` "kill-at=N", SIGKILL at step N."""

    def __init__(self) -> None:
        hook = os.environ.get(TEST_HOOK, "")
        fields = dict(f.partition("=")[::2] for f in hook.split(",") if f)
        self.kill_at = int(fields.get("kill-at") or 0)
        self.portable = "portable" in fields
        self.in_place = "in-place" in fields
        self.done = 0

    def __call__(self) -> None:
        self.done += 1
        if self.done == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def publish_folder(
    staging: Path, out_dir: Path, owns: Collection[str], command: str, mode: int | None = None
) -> None:
    """Make `staging` the output folder in one step, keeping the files of `out_dir` that
    the command does not own (a report's publication keeps the build's engine, and a
    user's notes in a trtbuild folder stay).

    `owns` names the artifacts the command answers for: one it did not produce this
    time is not carried over (a stale engine beside a new report would lie). Where no
    rename can replace `out_dir` (a mount point: EBUSY; a folder in an overlay's lower
    layer: EXDEV), or one would carry a file mounted into it away with the old set, the
    set is published into it instead (`_publish_in_place`).
    """
    raise_if_stopped()  # a stop swallowed while the set was made: the old set stays
    with _publishing(staging.parent):
        _publish(staging, out_dir, owns, command, mode)


@contextlib.contextmanager
def _publishing(home: Path) -> Iterator[None]:
    """One publication at a time into the folders of `home` (the output folder's parent, or
    the mount point that holds its staging folder): an exclusive lock on `home` held from
    reading the old set to the swap. Why: a `report` carrying the old set's engine while
    a `build` publishes its new set would swap the new set away, and the build be lost."""
    fd = os.open(home, _DIRECTORY)
    try:
        lock(fd, wait=True)
        yield
    finally:
        os.close(fd)


def _publish(
    staging: Path, out_dir: Path, owns: Collection[str], command: str, mode: int | None
) -> None:
    """`publish_folder`'s work, under its lock."""
    step = _Steps()
    step()
    kept = set(read_marker(out_dir).get("files", [])) - set(owns)
    produced = set(os.listdir(staging))
    if staging.parent == out_dir or step.in_place or holds_mounts(out_dir):
        _publish_in_place(staging, out_dir, produced, owns, command, kept, step)
        return
    if out_dir.is_dir():
        for name in sorted(os.listdir(out_dir)):
            if name in owns or name == MARKER or name in produced:
                continue
            _carry(out_dir / name, staging / name)
            step()
    write_marker(staging, command, (produced | kept) & set(os.listdir(staging)))
    step()
    os.chmod(staging, mode if mode is not None else 0o777 & ~current_umask())  # mkdtemp's: 0700
    try:
        _swap(staging, out_dir, step)
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.EXDEV) or not out_dir.is_dir():
            raise
        _publish_in_place(staging, out_dir, produced, owns, command, kept, step)
    step()


def _swap(staging: Path, out_dir: Path, step: _Steps) -> None:
    """Put `staging` where `out_dir` is: a rename where there is none, one exchange, or
    (portable) the old set renamed aside under its lock and the new one into its place.

    Another publication into the same folder may get there first (two builds, or a
    cleaner putting back a killed one's set): a rename that finds the place taken tries
    again, against what is there now.
    """
    for _ in range(8):
        try:
            if not out_dir.is_dir():
                os.rename(staging, out_dir)
            elif not step.portable and _exchange(staging, out_dir):
                step()  # the staging path now holds the old set; the caller removes it
            else:
                _swap_aside(staging, out_dir, step)
            return
        except (FileNotFoundError, FileExistsError) as exc:  # moved meanwhile
            found = exc
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:  # renamed onto a set that arrived meanwhile
                raise
            found = exc
    raise found


def _swap_aside(staging: Path, out_dir: Path, step: _Steps) -> None:
    """The portable swap: the old set, held by its lock (so a cleaner leaves it alone),
    renamed to an unguessable `.NAME.old-*` that the new set's marker names as the one it
    replaced; the new set renamed into its place; the old one removed."""
    fd = _held_set(out_dir)
    try:
        aside = out_dir.with_name(f".{out_dir.name}.old-{secrets.token_hex(8)}")
        marker = read_marker(staging)
        write_json(staging / MARKER, {**marker, "replaced": aside.name})
        step()
        try:
            os.rename(out_dir, aside)
        except OSError:
            write_json(staging / MARKER, marker)
            raise
        step()
        os.rename(staging, out_dir)  # ENOTEMPTY: another set arrived; the old one stays aside
        step()
        shutil.rmtree(aside, ignore_errors=True)
    finally:
        os.close(fd)


def _held_set(out_dir: Path) -> int:
    """A descriptor of the folder at `out_dir` holding its lock (waited for: another
    publication may be swapping it right now).

    Raises:
        FileNotFoundError: it was moved away meanwhile (the caller tries again).
    """
    for _ in range(8):
        fd = os.open(out_dir, _DIRECTORY)
        lock(fd, wait=True)
        if _same(fd, out_dir):
            return fd
        os.close(fd)
    raise FileNotFoundError(errno.ENOENT, "the output folder keeps being replaced", str(out_dir))


def _publish_in_place(
    source: Path,
    out_dir: Path,
    produced: set[str],
    owns: Collection[str],
    command: str,
    kept: set[str],
    step: _Steps,
) -> None:
    """Publish into `out_dir` entry by entry: its marker first says a publication is under
    way (`"partial": true`), each new file is renamed (or copied, across devices) over
    the old one, the owned files not produced are removed, and the marker is written
    whole last.

    Not one step: killed midway, the folder holds a mix under a partial marker, which
    the next publication makes whole again.
    """
    points = _mount_points()
    for name in sorted(produced | set(owns)):  # refused before anything changes
        if os.path.abspath(out_dir / name) in points:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(out_dir / name))
    partial = {"command": command, "files": [], **read_marker(out_dir), "partial": True}
    write_json(out_dir / MARKER, partial)
    step()
    for name in sorted(produced - {MARKER}):
        _move(source / name, out_dir / name)
        step()
    for name in sorted(set(owns) - produced):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(out_dir / name)
    write_marker(out_dir, command, (produced | kept) & set(os.listdir(out_dir)) - {MARKER})


def _move(src: Path, dst: Path) -> None:
    """`src` at `dst`, atomically: a rename, or a copy renamed into place across devices."""
    try:
        os.replace(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV or src.is_dir():
            raise
        with atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)


# What a publication can meet that no retry mends: the user's to change, exit 2 naming the fix.
_UNPUBLISHABLE = {
    errno.EBUSY: "it, or a file in it, is a mount point that no rename can replace",
    errno.EXDEV: "it lies on another device than its staging folder",
    errno.ENOTEMPTY: "another publication into it kept replacing it",
    errno.EEXIST: "another publication into it kept replacing it",
    errno.EAGAIN: "another publication into it kept replacing it",
}


def unpublishable(exc: OSError, out_dir: Path) -> UsageError | None:
    """Exit 2 for an error of publication that the surroundings cause (a file mounted into
    the output folder, a publication racing this one); None for any other.

    Why: such a failure is not a bug in trtbuild, and the user can fix it: mount the
    folder, not files in it; run one build per output folder at a time.
    """
    what = _UNPUBLISHABLE.get(exc.errno or 0)
    if what is None:
        return None
    where = os.fsdecode(exc.filename) if exc.filename is not None else str(out_dir)
    return UsageError(
        f"cannot publish the output folder {out_dir}: {what}",
        where=where,
        hint="pass --out a folder that is not a mount point and holds no mounted file "
        "(a mounted folder itself is fine), and run one build per output folder at a time",
    )


def _carry(src: Path, dst: Path) -> None:
    """`src` at `dst` without copying its bytes where the file system allows (hard links)."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(src, dst)


def _link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux's renameat2(RENAME_EXCHANGE); False where the
    system or the file system cannot, so the caller swaps with two renames."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # glibc before 2.28, musl
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))
