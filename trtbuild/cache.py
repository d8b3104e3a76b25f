"""A content-addressed cache of the prepared graph, the FP32 reference and the mixed model.

Why: a user who edits one rule and runs `check` again would otherwise pay for
every graph pass and the reference run each time, though neither answer can
change. The key of an entry is everything its value depends on: the model's
bytes (external data included: `graph.model_io.model_digest`), the passes, the trtbuild code and the versions
of onnx, onnx-graphsurgeon, onnxruntime and Polygraphy; the reference also keys
on the feeds, the mixed model on every node's precision. So a hit returns exactly what a miss would compute.

Entries are written atomically and carry a sha256 of their name and payload: a
corrupt or truncated entry, or one moved under another key, is dropped, recomputed
and warned about once. The folder is
capped in size, least recently used first out. A folder that cannot be used
(read-only, a file) turns the cache off with one warning: it never fails a
command. The cache prints nothing itself: each warning is an event, kept in
`events` and handed to `on_event` (the CLI prints it, the nightly logs it).

What the cache trusts, and why:
- Its folders, and only while they are the user's alone: the root (followed if
  it is a symlink of the user's or root's: the user chose it), `KIND/` and
  `KIND/XX/` (never followed) must be owned by the effective user and writable by
  no group or other user, and every folder above the root must be the user's or
  root's and writable by no one else unless sticky (OpenSSH's StrictModes): anyone
  who can rename an ancestor can swap the root. Such a folder turns the cache off
  for the run, with one warning. The root is opened once and checked on its
  descriptor, which every later read, write and removal goes through (`Entry`): no
  path is resolved again between the check and the use. Folders the cache makes
  are mode 0o700.
- Not the entries' bytes: an entry is data (`trtbuild.cache_codec`: JSON, ONNX
  protobuf, `.npy` read without pickle), decoded into exactly the value its kind
  names and of its shape (`cache_codec.conforms`), so a planted or restored entry
  can at worst be wrong data, never run code nor crash a stage. The sha256 an entry
  carries about itself (of its name and payload: `seal`) detects damage and an entry
  moved under another key, not intent. An entry larger than its kind's
  share of the cap is never written, so it is never read either.
- Not the names in its folders: an entry is read and written without following
  a symlink (a write goes to a temporary name created exclusively, then is
  renamed), and eviction and `clear` remove only files that carry the cache's
  header under a name it makes (`KIND/XX/` and a 64-hex digest that starts
  with XX), and the temporaries of writers that are gone. Anything else there
  is the user's and is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trtbuild.errors import UsageError
from trtbuild.fsutil import FOLDER, NOFOLLOW, READ_NOFOLLOW, alive, lock

HEADER = b"trtbuild-cache/"  # every version's entries start so: housekeeping knows its own
# 3: the sha256 covers the entry's name (KIND/XX/DIGEST) with its payload; 2: data codecs.
# An entry of another version (1: a pickle) reads as corrupt.
MAGIC = HEADER + b"3\n"
ENTRY_NAME = re.compile(r"[0-9a-f]{64}")
# `.DIGEST.PID.N.tmp` (and `.DIGEST.PID.tmp`, the name before version 2)
TEMP_NAME = re.compile(r"\.([0-9a-f]{64})\.([0-9]{1,12})(?:\.[0-9]+)?\.tmp")
TEMP_NAMES = 16  # temporary names a writer tries before it gives up
STALE_SECONDS = 3600  # where locks tell nothing: a temporary this old is a dead writer's
# A temporary is a dead writer's once it is this old and no writer holds its lock (a writer
# in another PID namespace, a container sharing the folder, holds it as well as any).
DEAD_GRACE_SECONDS = 60
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
DEFAULT_MAX_BYTES = 2 << 30
# "neighbourhoods": what ONNX Runtime's check said of each neighbourhood it loaded (one
# small entry per ONNX Runtime version; `precision.neighbourhoods`)
KINDS = ("prepared", "measures", "reference", "converted", "neighbourhoods")
# Tensors (the reference's outputs of every feed) grow with the input: an entry of
# them is kept only while it takes at most this share of the cap, so one large
# input never evicts every small entry (the measures are always kept).
BULKY = {"reference": 8}

# What computes a cached value; versions read from the installed metadata, so a warm
# `check` does not import onnxruntime only to learn its version.
DEPENDENCIES = (
    ("onnx",),
    ("onnx-graphsurgeon", "onnx_graphsurgeon"),
    ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino"),
    ("polygraphy",),
)


# The root where no home folder is known (`default_root`): never opened (`open_root` says
# why, and the cache turns itself off)
HOMELESS = Path("~", ".cache", "trtbuild")


def default_root() -> Path:
    """`TRTBUILD_CACHE_DIR`, else `~/.cache/trtbuild` (XDG_CACHE_HOME respected);
    `HOMELESS` where `~` names no folder.

    Why not raise there: HOME unset for a user the password database does not know (a
    container run as `--user 12345` under `env -i`, a CI step) has no home, and pathlib's
    RuntimeError ended every command, `--no-cache` too, as a bug (exit 70). A cache that
    has no folder is off for the run with one warning (`open_root`), as one it cannot use is.
    """
    try:
        if os.environ.get("TRTBUILD_CACHE_DIR"):
            return Path(os.environ["TRTBUILD_CACHE_DIR"]).expanduser()
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:  # pathlib's "Could not determine home directory."
        return HOMELESS
    return Path(base) / "trtbuild"


def homeless_why() -> str:
    """Why the cache has no folder (`HOMELESS`), and the fix."""
    uid = os.getuid() if hasattr(os, "getuid") else "?"
    return (
        f"no folder for the cache: ~ names none (HOME is unset and user {uid} has no home "
        "in the password database); set TRTBUILD_CACHE_DIR to a folder of your own, or HOME"
    )


def default_max_bytes() -> int:
    """`TRTBUILD_CACHE_MAX_MB`, else 2 GiB; a value that is no size is the user's to fix."""
    raw = os.environ.get("TRTBUILD_CACHE_MAX_MB", "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        megabytes = float(raw)
    except ValueError:
        megabytes = -1.0
    if not 0 <= megabytes <= 1 << 30:  # NaN fails too
        raise UsageError(
            f"TRTBUILD_CACHE_MAX_MB={raw!r} is not a size in megabytes",
            hint="set it to a number of megabytes such as 2048, or unset it",
        )
    return int(megabytes * (1 << 20))


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The trtbuild sources and the versions of what computes a cached value.

    The sources, not just the version number: an editable install changes code
    without changing `__version__`, and a stale prepared graph must never be served.
    """
    h = hashlib.sha256()
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    for dist in DEPENDENCIES:
        h.update(f"{dist}={_installed_version(dist)};".encode())
    h.update(sys.version.encode())
    return h.hexdigest()


def _installed_version(names: tuple[str, ...]) -> str:
    """The version of the first distribution of `names` that is installed."""
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "absent"


def key(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def feeds_digest(feeds: Iterable[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for feed in feeds:
        for name in sorted(feed):
            arr = feed[name]
            h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
            h.update(arr.tobytes())
    return h.hexdigest()


class Uncacheable(ValueError):
    """A value a codec cannot express exactly: the cache refuses it rather than approximate."""


class Corrupt(ValueError):
    """A payload that is no value of its kind: the cache drops it as a corrupt entry."""


class Codec(Protocol):
    """How each kind's values become bytes and back (`trtbuild.cache_codec`).

    Given by whoever knows the kinds (the CLI, the nightly), not imported here:
    the values are the stages' (a prepared graph, a mixed model, the reference's),
    which sit above the cache, and the arrows point down.
    """

    def encode(self, kind: str, value: Any) -> list[bytes]: ...

    def decode(self, kind: str, blob: bytes, start: int) -> Any: ...


@dataclass
class Cache:
    """One cache folder; `enabled=False` (`--no-cache`) computes everything."""

    root: Path = field(default_factory=default_root)
    enabled: bool = True
    max_bytes: int = field(default_factory=default_max_bytes)
    on_event: Callable[[str], None] | None = None  # told each warning as it happens
    hits: dict[str, str] = field(default_factory=dict)  # kind -> hit | miss | off
    events: list[str] = field(default_factory=list)  # the warnings, once per problem
    _warned: set[str] = field(default_factory=set)
    _trusted: set[str] = field(default_factory=set)  # folders (under the root) found sound
    codec: Codec | None = None  # needed to store or read values; `info` and `clear` need none
    _fd: int | None = field(default=None, repr=False)  # the root, opened once it was checked

    def get(self, kind: str, digest: str) -> Any | None:
        """The cached value, or None (a miss, a disabled cache or a corrupt entry)."""
        folder = self._folder(kind, digest, create=False) if self.enabled else None
        if folder is None:
            self.hits[kind] = "miss" if self.enabled else "off"
            return None
        entry = Entry(self._fd, f"{folder}/{digest}", self.root)  # type: ignore[arg-type]
        try:
            value = _load(kind, entry, _needed(self.codec), _largest(self.max_bytes, kind))
        except FileNotFoundError:
            self.hits[kind] = "miss"
            return None
        except _NotAnEntry as exc:
            return self._drop(kind, entry, str(exc))
        except OSError as exc:
            self._off(kind, f"cannot read {entry.shown}: {exc.strerror or exc}")
            return None
        self.hits[kind] = "hit"
        return value

    def put(self, kind: str, digest: str, value: Any) -> bool:
        """Store atomically, then evict least recently used entries beyond the cap. An
        entry larger than its share of the cap (`BULKY`, else the whole cap) is not written
        and evicts nothing; nor is a value its codec cannot express as data (never
        pickled instead). False says so."""
        if not self.enabled:
            return False
        parts = _encode(kind, value, _needed(self.codec))
        if isinstance(parts, str):
            self._warn("uncacheable", parts)
            return False
        if len(MAGIC) + 65 + sum(map(len, parts)) > _largest(self.max_bytes, kind):
            return False
        folder = self._folder(kind, digest, create=True)
        if folder is None:
            return False
        try:
            _write(Entry(self._fd, f"{folder}/{digest}", self.root), parts)  # type: ignore[arg-type]
        except OSError as exc:
            self._off(kind, f"cannot write to {self.root}: {exc.strerror or exc}")
            return False
        self.evict()
        return True

    def entries(self) -> list[Path]:
        """The entries (only the cache's own files; see `_scan`)."""
        return _at_root(self, lambda fd: [e.path for e, _ in _scan(fd, self.root)[0]], [])

    def evict(self) -> int:
        """Remove least recently used entries beyond `max_bytes`, and dead writers' temporaries."""
        return _at_root(self, lambda fd: _evict(fd, self.root, self.max_bytes), 0)

    def info(self) -> dict[str, Any]:
        """Entries and bytes, in all and per kind: which kind fills the folder."""
        empty = _info(None, self.root, self.max_bytes)
        return _at_root(self, lambda fd: _info(fd, self.root, self.max_bytes), empty)

    def clear(self) -> int:
        """Remove every entry and dead writers' temporaries; nothing else in the folder."""
        return _at_root(self, lambda fd: _clear(fd, self.root), 0)

    def check_root(self) -> None:
        """Turn the cache off, with one warning, when its folder cannot be used or trusted."""
        if self.enabled:
            self._trust((), "*", create=False)

    def __del__(self) -> None:  # the root's descriptor goes with the cache
        with contextlib.suppress(Exception):
            os.close(self._fd)  # type: ignore[arg-type]

    def _folder(self, kind: str, digest: str, *, create: bool) -> str | None:
        """The entry's folder (under the root) once it and those above are the user's alone."""
        if kind not in KINDS or not ENTRY_NAME.fullmatch(digest):
            raise ValueError(f"no cache entry {kind}/{digest}: a kind of {KINDS}, a sha256")
        folders = (kind, f"{kind}/{digest[:2]}")
        return folders[-1] if self._trust(folders, kind, create=create) else None

    def _trust(self, folders: tuple[str, ...], kind: str, *, create: bool) -> bool:
        """Open and check the root (once), then each folder under it, by descriptor."""
        try:
            why = _untrusted(self, folders, create=create)
        except FileNotFoundError:  # missing and not to be made: a miss, not a problem
            return False
        if why is not None:
            self._off(kind, why)
        return why is None

    def _drop(self, kind: str, entry: Entry, why: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(entry.name, dir_fd=entry.fd)  # a symlink itself, never its target
        self._warn("corrupt", f"{why}; it is recomputed")
        self.hits[kind] = "miss"

    def _off(self, kind: str, why: str) -> None:
        self.enabled = False
        self.hits[kind] = "off"
        self._warn("off", f"cache off for this run: {why}")

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:  # once per problem and run
            self._warned.add(what)
            self.events.append(message)
            if self.on_event is not None:
                self.on_event(message)


def _largest(max_bytes: int, kind: str) -> int:
    """Bytes an entry of `kind` may take (its share of the cap): none larger is written,
    so none larger is read."""
    return max_bytes // BULKY.get(kind, 1)


def _untrusted(cache: Cache, folders: tuple[str, ...], *, create: bool) -> str | None:
    """Why the cache's root or a folder of `folders` under it is not the user's alone; None
    when all are.

    Raises:
        FileNotFoundError: one is missing and not `create`.
    """
    if cache._fd is None:
        cache._fd, why = open_root(cache.root, create=create)
        if why is not None:
            return why
    for folder in (f for f in folders if f not in cache._trusted):
        why = _distrust(cache._fd, folder, cache.root / folder, create=create)  # type: ignore[arg-type]
        if why is not None:
            return why
        cache._trusted.add(folder)
    return None


def _at_root(cache: Cache, work: Callable[[int], Any], default: Any) -> Any:
    """`work` on the root's descriptor (for listing and removing the cache's own files);
    `default` where there is no folder."""
    with _housekeeping(cache) as fd:
        return work(fd) if fd is not None else default


def _clear(fd: int, root: Path) -> int:
    entries, temps = _scan(fd, root)
    _remove_stale(temps)
    return sum(_remove(e) for e, _ in entries)


@dataclass(frozen=True)
class Entry:
    """A file under the cache's root: `name` relative to the root's descriptor `fd`, so no
    path above it is resolved again between the root's check and the file's use."""

    fd: int
    name: str
    root: Path

    @property
    def path(self) -> Path:
        return self.root / self.name

    @property
    def shown(self) -> str:
        return str(self.path)


_HINT = "set TRTBUILD_CACHE_DIR to a folder of your own"


def open_root(root: Path, *, create: bool) -> tuple[int | None, str | None]:
    """The cache root opened, once it is the user's alone: (its descriptor, None), or
    (None, why not).

    Checked the way OpenSSH's StrictModes checks a user's files: every folder above the
    root (as resolved) must belong to the user or to root and be writable by no one
    else unless sticky (/tmp), since anyone who can rename an ancestor can swap the
    root; a symbolic link on the way must be the user's or root's; the root itself,
    checked on the descriptor that every later use goes through, must be the user's
    and writable by no one else.

    Raises:
        FileNotFoundError: it is missing and not `create` (a miss, not a problem).
    """
    if root is HOMELESS:  # never a folder `~` of the working folder
        return None, homeless_why()
    absolute = Path(os.path.abspath(root))
    try:
        if create:
            _make_private(absolute)
        why = _unsafe_way(absolute)
        if why is not None:
            return None, why
        fd = os.open(absolute, FOLDER)  # follows a symlink the user made (checked above)
    except FileNotFoundError:
        if create:  # made above, so a symbolic link on the way points nowhere
            return None, f"cannot use {root}: it is a symbolic link to nothing; {_HINT}"
        raise
    except NotADirectoryError:
        return None, f"{root} is a file, not a folder; set TRTBUILD_CACHE_DIR"
    except OSError as exc:
        return None, f"cannot use {root}: {exc.strerror or exc}"
    why = _not_own(os.fstat(fd), root)
    if why is not None:
        os.close(fd)
        return None, why
    return fd, None


def _make_private(absolute: Path) -> None:
    """Each missing folder down to `absolute`, made 0700. Why not `os.makedirs(mode=)`: it
    gives the mode to the last folder only, the others umask's (775 under umask 002, the
    default of many distributions), which `_unsafe_way` then rightly refuses."""
    missing = []
    step = absolute
    while not os.path.lexists(step) and step != step.parent:
        missing.append(step)
        step = step.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another run made it meanwhile
            os.mkdir(folder, 0o700)


def _unsafe_way(absolute: Path) -> str | None:
    """Why the way to `absolute` could be changed by someone else; None where it cannot."""
    if not hasattr(os, "geteuid"):  # Windows: access is by ACL, not by these modes
        return None
    me = os.geteuid()
    for step in (absolute, *absolute.parents):
        st = os.lstat(step)
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, me):
            return f"{step} is a symbolic link of another user (uid {st.st_uid}); {_HINT}"
    real = Path(os.path.realpath(absolute))
    for folder in real.parents:
        st = os.stat(folder)
        if st.st_uid not in (0, me):
            return f"{folder}, above the cache, belongs to another user (uid {st.st_uid}); {_HINT}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return (
                f"{folder}, above the cache, is writable by others (mode "
                f"{stat.S_IMODE(st.st_mode):o}) without the sticky bit, so they could swap "
                f"the cache folder; `chmod go-w` it or {_HINT}"
            )
    return None


def _not_own(st: os.stat_result, folder: Path) -> str | None:
    """Why a folder with status `st` is not the user's alone; None when it is."""
    if stat.S_ISLNK(st.st_mode):
        return f"{folder} is a symbolic link, which the cache never follows; remove it"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is a file, not a folder; set TRTBUILD_CACHE_DIR"
    if not hasattr(os, "geteuid"):
        return None
    if st.st_uid != os.geteuid():
        return f"{folder} belongs to another user (uid {st.st_uid}); {_HINT}"
    if st.st_mode & 0o022:
        return (
            f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o}), who could "
            f"choose what a run reads; `chmod go-w` it or {_HINT}"
        )
    return None


def _distrust(fd: int, name: str, shown: Path, *, create: bool) -> str | None:
    """Why the folder `name` under the root's descriptor is not the user's alone; None
    when it is. It is never followed if a symlink.

    Raises:
        FileNotFoundError: it is missing and not `create` (a miss, not a problem).
    """
    try:
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # another trtbuild made it meanwhile
                os.mkdir(name, 0o700, dir_fd=fd)
            st = os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        return f"cannot use {shown}: {exc.strerror or exc}"
    return _not_own(st, shown)


@contextlib.contextmanager
def _housekeeping(cache: Cache) -> Iterator[int | None]:
    """The root's descriptor for listing and removing the cache's own files: the checked
    one where the cache opened it, else one opened for this (None: no folder)."""
    if cache._fd is not None:
        yield cache._fd
        return
    if cache.root is HOMELESS:  # never opened: a folder named `~` of the working folder
        yield None
        return
    try:
        fd = os.open(cache.root, FOLDER)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


class _NotAnEntry(Exception):
    """No entry where one should be: a symlink, no regular file, or a corrupt one."""


def _needed(codec: Codec | None) -> Codec:
    if codec is None:
        raise ValueError("a Cache that stores values needs a codec (trtbuild.cache_codec)")
    return codec


def _encode(kind: str, value: Any, codec: Codec) -> list[bytes] | str:
    """The payload's parts, or why the value is not cached (never pickled instead)."""
    try:
        return codec.encode(kind, value)
    except Uncacheable as exc:
        return f"not cached: the {kind} entry would hold {exc}"


def _load(kind: str, entry: Entry, codec: Codec, largest: int) -> Any:
    """The value of `entry`.

    Raises:
        _NotAnEntry: no regular file, or a corrupt one (the message says which).
        OSError: it cannot be read (FileNotFoundError: a miss, or another version's entry).
    """
    blob = _read_entry(entry, largest)
    if blob.startswith(HEADER) and not blob.startswith(MAGIC):
        # another version's (an earlier trtbuild's, under a key that did not change): a
        # miss, replaced by the put that follows, not a corrupt entry warned of once each
        raise FileNotFoundError(entry.shown)
    value = _decode(kind, entry.name, blob, codec)
    if value is None:
        raise _NotAnEntry(f"dropped a corrupt cache entry {entry.shown}")
    return value


def _read_entry(entry: Entry, largest: int) -> bytes:
    """The entry's bytes, read without following a symlink; touched, for LRU order.

    Raises:
        _NotAnEntry: a symlink, a folder, a fifo or a device is there, a file the user may
            not read, or a file larger than any entry of its kind (`largest` bytes), which
            is not read. Why a file the user may not read is no entry (it was the cache off
            on every run, for good): its folder is the user's alone (`_untrusted`), so it is
            another user's file at an entry's name (a `sudo trtbuild` that kept HOME wrote it
            as root's), dropped from that folder and recomputed like a damaged one.
    """
    try:
        fd = os.open(entry.name, READ_NOFOLLOW, dir_fd=entry.fd)  # O_NONBLOCK: a fifo does not hang
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # a symlink (Linux, BSD)
            raise _NotAnEntry(f"dropped {entry.shown}: a symbolic link, never followed") from None
        if exc.errno in (errno.EACCES, errno.EPERM):  # in a folder that is the user's alone
            raise _NotAnEntry(
                f"dropped {entry.shown}: you may not read it (another user's file: a run "
                "under sudo?)"
            ) from None
        raise
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotAnEntry(f"dropped {entry.shown}: not a regular file, so no entry")
        if st.st_size > largest:
            raise _NotAnEntry(f"dropped {entry.shown}: larger than any entry of its kind")
        blob = f.read(largest + 1)
        if len(blob) > largest:  # grew while read
            raise _NotAnEntry(f"dropped {entry.shown}: larger than any entry of its kind")
        with contextlib.suppress(OSError):  # least recently *used*: a hit counts; the
            now = time.time_ns()  # clock's own ns, finer than the kernel's file timestamps
            os.utime(fd, ns=(now, now))
    return blob


def _write(entry: Entry, parts: list[bytes]) -> None:
    """Write the entry under a temporary name made exclusively, then rename it into place.

    Exclusive (O_EXCL, O_NOFOLLOW): a symlink or file already at a temporary name is
    never written through; the next name is tried.
    """
    header = seal(entry.name, parts)
    fd, tmp = _create_temp(entry)
    lock(fd)  # held while it is written: a cleaner in any PID namespace leaves it alone
    try:
        with open(fd, "wb") as f:
            f.write(header)
            for part in parts:
                f.write(part)
        # replaces a name, never writes through a link
        os.replace(tmp, entry.name, src_dir_fd=entry.fd, dst_dir_fd=entry.fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=entry.fd)
        raise


def seal(name: str, parts: Iterable[bytes | memoryview]) -> bytes:
    """The header of the entry `name` (`KIND/XX/DIGEST` under the root) holding `parts`:
    `MAGIC`, then the sha256 of the name and the payload, in hex, and a newline.

    Why the name: a payload's own sha256 proves it whole, not that it is this key's. An
    entry copied or renamed under another key (a restored CI cache, a sync tool, a hand)
    would pass as that key's value: another policy's mixed model written by `convert`,
    another feed's reference judged against. Hashed with its name, it reads as corrupt.
    """
    sha = hashlib.sha256(name.encode() + b"\n")
    for part in parts:
        sha.update(part)
    return MAGIC + sha.hexdigest().encode() + b"\n"


def _create_temp(entry: Entry) -> tuple[int, str]:
    """A new file at the first free `.DIGEST.PID.N.tmp`: the pid tells a dead writer's apart.

    Raises:
        FileExistsError: every one of the `TEMP_NAMES` names is taken (planted, or left).
    """
    folder, _, digest = entry.name.rpartition("/")
    for n in range(TEMP_NAMES):
        tmp = f"{folder}/.{digest}.{os.getpid()}.{n}.tmp"
        try:
            return os.open(tmp, _CREATE, 0o600, dir_fd=entry.fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(
        errno.EEXIST, "every temporary name of the entry is taken", str(entry.root / folder)
    )


def _decode(kind: str, name: str, blob: bytes, codec: Codec) -> Any | None:
    """The value of the entry `name`, or None when its header, sha256 (of `name` and the
    payload: `seal`) or payload is not right."""
    start = len(MAGIC) + 65  # MAGIC, the sha256 in hex, a newline, the payload
    if blob[:start] != seal(name, [memoryview(blob)[start:]]):
        return None
    try:
        return codec.decode(kind, blob, start)
    except Corrupt:  # another version's payload, or no value of the kind
        return None


Stats = list[tuple[Entry, os.stat_result]]


def _scan(fd: int, root: Path) -> tuple[Stats, list[tuple[Entry, os.stat_result, int]]]:
    """The cache's own files under the root's descriptor: entries and writers' temporaries
    (with their pid).

    An entry carries the cache's header under `KIND/XX/DIGEST` (64 hex, starting
    with XX); a temporary is `KIND/XX/.DIGEST.PID[.N].tmp`. Nothing else is listed,
    so nothing else is evicted or cleared; no symlink is followed. Files another
    process removes meanwhile are left out (several trtbuilds may share the folder).
    """
    entries: Stats = []
    temps = []
    for folder in _entry_folders(fd):
        try:
            listed = _files(fd, folder)
        except OSError:
            continue
        xx = folder[-2:]
        for name in listed:
            temp = TEMP_NAME.fullmatch(name)
            entry = Entry(fd, f"{folder}/{name}", root)
            if ENTRY_NAME.fullmatch(name) and name[:2] == xx:
                st = _own_entry(entry)
                if st is not None:
                    entries.append((entry, st))
            elif temp and temp[1][:2] == xx:
                with contextlib.suppress(OSError):
                    temps.append((entry, os.lstat(entry.name, dir_fd=fd), int(temp[2])))
    return entries, temps


def _files(fd: int, folder: str) -> list[str]:
    """The names of the regular files in `folder` under `fd` (a symlink is not a file)."""
    sub = os.open(folder, FOLDER | NOFOLLOW, dir_fd=fd)
    try:
        with os.scandir(sub) as items:
            return [i.name for i in items if i.is_file(follow_symlinks=False)]
    finally:
        os.close(sub)


def _entry_folders(fd: int) -> list[str]:
    """`KIND/XX` folders under the root, real folders only (a symlink is not descended)."""
    found = []
    for kind in KINDS:
        with contextlib.suppress(OSError):
            sub = os.open(kind, FOLDER | NOFOLLOW, dir_fd=fd)
            try:
                with os.scandir(sub) as items:
                    found += [
                        f"{kind}/{i.name}"
                        for i in items
                        if re.fullmatch(r"[0-9a-f]{2}", i.name) and i.is_dir(follow_symlinks=False)
                    ]
            finally:
                os.close(sub)
    return found


def _own_entry(entry: Entry) -> os.stat_result | None:
    """Its stat if `entry` is a regular file that starts with the cache's header."""
    try:
        fd = os.open(entry.name, READ_NOFOLLOW, dir_fd=entry.fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        ok = stat.S_ISREG(st.st_mode) and os.read(fd, len(HEADER)) == HEADER
        return st if ok else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _evict(fd: int, root: Path, max_bytes: int) -> int:
    """`Cache.evict`: oldest use first; what is not the cache's own is never counted or removed."""
    entries, temps = _scan(fd, root)
    _remove_stale(temps)
    files = sorted(entries, key=lambda e: e[1].st_mtime)
    total, removed = sum(st.st_size for _, st in files), 0
    for entry, st in files:
        if total <= max_bytes:
            break
        total -= st.st_size
        removed += _remove(entry)
    return removed


def _info(fd: int | None, root: Path, max_bytes: int) -> dict[str, Any]:
    """`Cache.info`: entries only, so a user's file in the folder neither counts nor shows."""
    found = _scan(fd, root)[0] if fd is not None else []
    sizes = [(e.name.partition("/")[0], st.st_size) for e, st in found]
    return {
        "root": str(root),
        "entries": len(sizes),
        "by_kind": {k: sum(1 for kind, _ in sizes if kind == k) for k in KINDS},
        "bytes": sum(size for _, size in sizes),
        "bytes_by_kind": {k: sum(n for kind, n in sizes if kind == k) for k in KINDS},
        "max_bytes": max_bytes,
    }


def _remove_stale(temps: list[tuple[Entry, os.stat_result, int]]) -> None:
    """Remove the temporaries of writers that are gone (a crash, a kill -9): a minute old
    and no writer holds its lock; where locks tell nothing, its pid is gone too; over an
    hour old and unlocked, whatever its pid says."""
    now = time.time()
    for entry, st, pid in temps:
        age = now - st.st_mtime
        if age <= DEAD_GRACE_SECONDS:
            continue
        held = _held(entry)
        if held is False or (held is None and (age > STALE_SECONDS or not alive(pid))):
            _remove(entry)


def _held(entry: Entry) -> bool | None:
    """Whether a writer holds `entry`'s lock: True, False, or None where locks tell nothing."""
    try:
        fd = os.open(entry.name, READ_NOFOLLOW, dir_fd=entry.fd)
    except OSError:
        return None
    try:
        got = lock(fd)
        return None if got is None else not got
    finally:
        os.close(fd)


def _remove(entry: Entry) -> int:
    """1 if `entry` was removed now, 0 if it was gone already or cannot be."""
    try:
        os.unlink(entry.name, dir_fd=entry.fd)
    except OSError:
        return 0
    return 1
