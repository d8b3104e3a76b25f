"""Atomic file output: every artifact appears whole or not at all, and a set of artifacts
(an output folder) is published whole or not at all.

Why: a half-written engine or report that the next Makefile step loads is worse
than a clear failure, and an interrupted build must leave the previous
artifacts intact: not one new file beside two old ones.

Publication (`publish_folder`): the new set is written into a staging folder
`.NAME.staging-PID-*` beside the output folder, the files of the old folder that
the command does not own are hard-linked into it (so they survive), and the two
folders are swapped with one `renameat2(RENAME_EXCHANGE)` on Linux; elsewhere the
old folder is renamed aside (`.NAME.old-PID-*`) and the staged one into its place,
and a kill between those two renames is undone by the next publication, which
puts the old folder back. Staging and aside folders of processes that are gone
are removed by the next publication into the same parent folder.

An output folder carries `.trtbuild-output` (JSON: the command, the version, the
files trtbuild wrote); a folder that holds files trtbuild did not write and no
such marker is refused, so `--out ~` cannot replace a user's files.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from trtbuild.errors import UsageError

MARKER = ".trtbuild-output"
# tests only: "kill-at=N" SIGKILLs the process at step N of a publication, "portable"
# swaps without renameat2; unset, it costs one environment lookup per publication
TEST_HOOK = "TRTBUILD_TEST_PUBLICATION"
_READ_ONLY = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>staging|old)-(?P<pid>\d{1,12})-[a-z0-9_]+$")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it over `path` only on success.

    The temporary file lives in the same directory so the final rename is atomic
    on POSIX; on any exception (KeyboardInterrupt included) it is removed.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp's 0600 would make artifacts private
    try:
        yield tmp_path
        os.replace(tmp_path, final)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        if isinstance(exc, OSError) and exc.errno and exc.filename in (None, str(tmp_path)):
            # a write's ENOSPC names no file, a rename names the temporary one: name `path`
            raise OSError(exc.errno, exc.strerror, str(final)) from exc
        raise


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    # numpy scalars and paths show up in reports; everything else is a bug.
    if hasattr(value, "item"):
        return value.item()
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
    artifact name in `owns` that is a folder there.

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
    entries = sorted(os.listdir(out_dir))
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


def written_by_trtbuild(folder: Path) -> bool:
    """Whether `folder/build.json` is a record trtbuild wrote: a JSON object with the
    trtbuild version it was written by and the sha256 of its policy.

    Read without following a symlink or blocking on a FIFO, and bounded: the file is
    in a folder that may be anyone's.
    """
    try:
        fd = os.open(folder / RECORD, _READ_ONLY)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > RECORD_MAX_BYTES:
            return False
        with open(fd, "rb", closefd=False) as f:
            doc = json.loads(f.read(RECORD_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return False
    finally:
        os.close(fd)
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
        doc = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def staging_folder(out_dir: Path) -> Path:
    """A new staging folder beside `out_dir`, named after this process so that the next
    publication can tell it is orphaned once the process is gone."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(out_dir.parent)
    prefix = f".{out_dir.name}.staging-{os.getpid()}-"
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=out_dir.parent))
    except OSError as exc:  # the user knows the out folder, not the staging folder's name
        raise OSError(exc.errno, exc.strerror, str(out_dir)) from exc


def alive(pid: int) -> bool:
    """Whether a process `pid` runs here (signal 0 asks without sending anything): whose
    leftovers (staging folders, cache temporaries) may be removed."""
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


def clean_leftovers(parent: Path) -> None:
    """Remove the staging folders of processes that are gone, and put back an old output
    folder that a kill left aside (only where its place is still empty).

    Why: a SIGKILL skips every `finally`; without this, each one leaves a staging
    folder the size of a build that nothing removes.
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        found = _LEFTOVER.match(name)
        if found is None or alive(int(found["pid"])):
            continue
        path, home = parent / name, parent / found["name"]
        if found["kind"] == "old" and not os.path.lexists(home):
            with contextlib.suppress(OSError):
                os.rename(path, home)  # the portable swap was killed between its renames
                continue
        shutil.rmtree(path, ignore_errors=True)


class _Steps:
    """The steps of one publication; under `TEST_HOOK` "kill-at=N", SIGKILL at step N."""

    def __init__(self) -> None:
        hook = os.environ.get(TEST_HOOK, "")
        fields = dict(f.partition("=")[::2] for f in hook.split(",") if f)
        self.kill_at = int(fields.get("kill-at") or 0)
        self.portable = "portable" in fields
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
    time is not carried over (a stale engine beside a new report would lie).
    """
    step = _Steps()
    step()
    old = read_marker(out_dir)
    produced = set(os.listdir(staging))
    if out_dir.is_dir():
        for name in sorted(os.listdir(out_dir)):
            if name in owns or name == MARKER or name in produced:
                continue
            _carry(out_dir / name, staging / name)
            step()
    kept = set(old.get("files", [])) - set(owns)
    write_marker(staging, command, (produced | kept) & set(os.listdir(staging)))
    step()
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, mode if mode is not None else 0o777 & ~umask)  # mkdtemp's is 0700
    if not out_dir.is_dir():
        os.rename(staging, out_dir)
    elif not step.portable and _exchange(staging, out_dir):
        step()  # the staging path now holds the old set; the caller removes it
    else:
        aside = tempfile.mkdtemp(prefix=f".{out_dir.name}.old-{os.getpid()}-", dir=out_dir.parent)
        os.rename(out_dir, aside)  # onto the empty folder that reserved the name
        step()
        os.rename(staging, out_dir)
        step()
        shutil.rmtree(aside, ignore_errors=True)
    step()


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
