"""A content-addressed cache of the prepared graph, the FP32 reference and the mixed model.

Why: a user who edits one rule and runs `check` again would otherwise pay for
every graph pass and the reference run each time, though neither answer can
change. The key of an entry is everything its value depends on: the model's
bytes (external data included), the passes, the trtbuild code and the versions
of onnx, onnx-graphsurgeon, onnxruntime and Polygraphy; the reference also keys
on the feeds, the mixed model on every node's precision. So a hit returns exactly what a miss would compute.

Entries are written atomically and carry a sha256 of their payload: a corrupt
or truncated entry is dropped, recomputed and warned about once. The folder is
capped in size, least recently used first out. A folder that cannot be used
(read-only, a file) turns the cache off with one warning: it never fails a
command. The cache prints nothing itself: each warning is an event, kept in
`events` and handed to `on_event` (the CLI prints it, the nightly logs it).

What the cache trusts, and why:
- Its folders, and only while they are the user's alone: the root (followed if
  it is a symlink: the user chose it), `KIND/` and `KIND/XX/` (never followed)
  must be owned by the effective user and writable by no group or other user.
  Anyone else who can write there can choose what a later run reads, so such a
  folder turns the cache off for the run, with one warning. Folders the cache
  makes are mode 0o700. The folders above the root are not checked.
- Not the entries' bytes: an entry is data (`trtbuild.cache_codec`: JSON, ONNX
  protobuf, `.npy` read without pickle), decoded into exactly the value its kind
  names, so a planted or restored entry can at worst be wrong data, never run
  code. The sha256 an entry carries about itself detects damage, not intent.
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trtbuild.errors import UsageError
from trtbuild.fsutil import alive

HEADER = b"trtbuild-cache/"  # every version's entries start so: housekeeping knows its own
MAGIC = HEADER + b"2\n"  # 2: data codecs; a version 1 entry (a pickle) reads as corrupt
ENTRY_NAME = re.compile(r"[0-9a-f]{64}")
# `.DIGEST.PID.N.tmp` (and `.DIGEST.PID.tmp`, the name before version 2)
TEMP_NAME = re.compile(r"\.([0-9a-f]{64})\.([0-9]{1,12})(?:\.[0-9]+)?\.tmp")
TEMP_NAMES = 16  # temporary names a writer tries before it gives up
STALE_SECONDS = 3600  # a temporary this old is a dead writer's, whatever its pid says
# A temporary whose pid is gone is a dead writer's once it is this old: a writer in another
# pid namespace (a container sharing the folder) looks gone but is writing right now.
DEAD_GRACE_SECONDS = 60
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
DEFAULT_MAX_BYTES = 2 << 30
KINDS = ("prepared", "measures", "reference", "converted")
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


def default_root() -> Path:
    """`TRTBUILD_CACHE_DIR`, else `~/.cache/trtbuild` (XDG_CACHE_HOME respected)."""
    if os.environ.get("TRTBUILD_CACHE_DIR"):
        return Path(os.environ["TRTBUILD_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trtbuild"


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


def model_digest(path: Path) -> str:
    """sha256 of the model file and of every external-data file it names."""
    import onnx

    raw = path.read_bytes()
    h = hashlib.sha256(raw)
    if b"location" not in raw:  # every external-data entry names its file under this key
        return h.hexdigest()
    proto = onnx.load_model_from_string(raw)
    locations = sorted(
        {
            entry.value
            for t in proto.graph.initializer
            if t.data_location == onnx.TensorProto.EXTERNAL
            for entry in t.external_data
            if entry.key == "location"
        }
    )
    for location in locations:
        extra = path.parent / location
        h.update(location.encode() + b"\0")
        h.update(extra.read_bytes() if extra.is_file() else b"<missing>")
    return h.hexdigest()


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
    _trusted: set[Path] = field(default_factory=set)  # folders found to be the user's alone
    codec: Codec | None = None  # needed to store or read values; `info` and `clear` need none

    def get(self, kind: str, digest: str) -> Any | None:
        """The cached value, or None (a miss, a disabled cache or a corrupt entry)."""
        folder = self._folder(kind, digest, create=False) if self.enabled else None
        if folder is None:
            self.hits[kind] = "miss" if self.enabled else "off"
            return None
        path = folder / digest
        try:
            value = _load(kind, path, _needed(self.codec))
        except FileNotFoundError:
            self.hits[kind] = "miss"
            return None
        except _NotAnEntry as exc:
            return self._drop(kind, path, str(exc))
        except OSError as exc:
            self._off(kind, f"cannot read {path}: {exc.strerror or exc}")
            return None
        self.hits[kind] = "hit"
        return value

    def put(self, kind: str, digest: str, value: Any) -> bool:
        """Store atomically, then evict least recently used entries beyond the cap.

        An entry larger than its share of the cap (`BULKY`, else the whole cap) is
        not written and evicts nothing; nor is a value its kind's codec cannot
        express as data (never pickled instead). False says so.
        """
        if not self.enabled:
            return False
        parts = _encode(kind, value, _needed(self.codec))
        if isinstance(parts, str):
            self._warn("uncacheable", parts)
            return False
        if len(MAGIC) + 65 + sum(map(len, parts)) > self.max_bytes // BULKY.get(kind, 1):
            return False
        folder = self._folder(kind, digest, create=True)
        if folder is None:
            return False
        try:
            _write(folder, digest, parts)
        except OSError as exc:
            self._off(kind, f"cannot write to {self.root}: {exc.strerror or exc}")
            return False
        self.evict()
        return True

    def entries(self) -> list[Path]:
        """The entries (only the cache's own files; see `_scan`)."""
        return [path for path, _ in _scan(self.root)[0]]

    def evict(self) -> int:
        """Remove least recently used entries beyond `max_bytes`, and dead writers' temporaries."""
        return _evict(self.root, self.max_bytes)

    def info(self) -> dict[str, Any]:
        """Entries and bytes, in all and per kind: which kind fills the folder."""
        return _info(self.root, self.max_bytes)

    def clear(self) -> int:
        """Remove every entry and dead writers' temporaries; nothing else in the folder."""
        entries, temps = _scan(self.root)
        _remove_stale(temps)
        return sum(_remove(path) for path, _ in entries)

    def check_root(self) -> None:
        """Turn the cache off, with one warning, when its folder cannot be used or trusted."""
        if self.enabled:
            self._trust((self.root,), "*", create=False)

    def _folder(self, kind: str, digest: str, *, create: bool) -> Path | None:
        """The entry's folder once it and those above are the user's alone; else None."""
        if kind not in KINDS or not ENTRY_NAME.fullmatch(digest):
            raise ValueError(f"no cache entry {kind}/{digest}: a kind of {KINDS}, a sha256")
        folders = (self.root, self.root / kind, self.root / kind / digest[:2])
        return folders[-1] if self._trust(folders, kind, create=create) else None

    def _trust(self, folders: tuple[Path, ...], kind: str, *, create: bool) -> bool:
        for folder in (f for f in folders if f not in self._trusted):
            try:
                why = _distrust(folder, follow=folder == self.root, create=create)
            except FileNotFoundError:
                return False
            if why is not None:
                self._off(kind, why)
                return False
            self._trusted.add(folder)
        return True

    def _drop(self, kind: str, path: Path, why: str) -> None:
        with contextlib.suppress(OSError):
            path.unlink()  # a symlink itself, never its target
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


def _distrust(folder: Path, *, follow: bool, create: bool) -> str | None:
    """Why `folder` is not the user's alone to hold entries in; None when it is.

    Raises:
        FileNotFoundError: it is missing and not `create` (a miss, not a problem).
    """
    look = os.stat if follow else os.lstat  # the root may be a symlink the user made
    try:
        st = look(folder)
    except FileNotFoundError:
        if not create:
            raise
        st = None
    except OSError as exc:
        return f"cannot use {folder}: {exc.strerror or exc}"
    if st is None:
        try:
            folder.mkdir(mode=0o700, parents=follow, exist_ok=True)  # parents: the root's only
            st = look(folder)
        except OSError as exc:
            return f"cannot use {folder}: {exc.strerror or exc}"
    hint = "set TRTBUILD_CACHE_DIR to a folder of your own"
    if stat.S_ISLNK(st.st_mode):
        return f"{folder} is a symbolic link, which the cache never follows; remove it"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is a file, not a folder; set TRTBUILD_CACHE_DIR"
    if not hasattr(os, "geteuid"):  # Windows: access is by ACL, not by these modes
        return None
    if st.st_uid != os.geteuid():
        return f"{folder} belongs to another user (uid {st.st_uid}); {hint}"
    if st.st_mode & 0o022:
        return (
            f"{folder} is writable by others (mode {stat.S_IMODE(st.st_mode):o}), who could "
            f"choose what a run reads; `chmod go-w` it or {hint}"
        )
    return None


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


def _load(kind: str, path: Path, codec: Codec) -> Any:
    """The value of the entry at `path`.

    Raises:
        _NotAnEntry: no regular file, or a corrupt one (the message says which).
        OSError: it cannot be read (FileNotFoundError: a miss).
    """
    value = _decode(kind, _read_entry(path), codec)
    if value is None:
        raise _NotAnEntry(f"dropped a corrupt cache entry {path}")
    return value


def _read_entry(path: Path) -> bytes:
    """The entry's bytes, read without following a symlink; touched, for LRU order.

    Raises:
        _NotAnEntry: a symlink, a folder, a fifo or a device is there.
    """
    try:
        fd = os.open(path, _READ)  # O_NONBLOCK: a planted fifo does not hang the read
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # a symlink (Linux, BSD)
            raise _NotAnEntry(f"dropped {path}: a symbolic link, never followed") from None
        raise
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotAnEntry(f"dropped {path}: not a regular file, so no entry")
        blob = f.read()
        with contextlib.suppress(OSError):  # least recently *used*: a hit counts; the
            now = time.time_ns()  # clock's own ns, finer than the kernel's file timestamps
            os.utime(fd, ns=(now, now))
    return blob


def _write(folder: Path, digest: str, parts: list[bytes]) -> None:
    """Write the entry under a temporary name made exclusively, then rename it into place.

    Exclusive (O_EXCL, O_NOFOLLOW): a symlink or file already at a temporary name is
    never written through; the next name is tried.
    """
    sha = hashlib.sha256()
    for part in parts:
        sha.update(part)
    fd, tmp = _create_temp(folder, digest)
    try:
        with open(fd, "wb") as f:
            f.write(MAGIC + sha.hexdigest().encode() + b"\n")
            for part in parts:
                f.write(part)
        os.replace(tmp, folder / digest)  # replaces a name, never writes through a link
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _create_temp(folder: Path, digest: str) -> tuple[int, Path]:
    """A new file at the first free `.DIGEST.PID.N.tmp`: the pid tells a dead writer's apart.

    Raises:
        FileExistsError: every one of the `TEMP_NAMES` names is taken (planted, or left).
    """
    for n in range(TEMP_NAMES):
        tmp = folder / f".{digest}.{os.getpid()}.{n}.tmp"
        try:
            return os.open(tmp, _CREATE, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "every temporary name of the entry is taken", str(folder))


def _decode(kind: str, blob: bytes, codec: Codec) -> Any | None:
    """The entry's value, or None when its header, sha256 or payload is not right."""
    start = len(MAGIC) + 65  # MAGIC, the payload's sha256 in hex, a newline, the payload
    if not blob.startswith(MAGIC) or blob[start - 1 : start] != b"\n":
        return None
    sha = hashlib.sha256(memoryview(blob)[start:]).hexdigest().encode()
    if sha != blob[len(MAGIC) : start - 1]:
        return None
    try:
        return codec.decode(kind, blob, start)
    except Corrupt:  # another version's payload, or no value of the kind
        return None


Stats = list[tuple[Path, os.stat_result]]


def _scan(root: Path) -> tuple[Stats, list[tuple[Path, os.stat_result, int]]]:
    """The cache's own files: entries and writers' temporaries (with their pid).

    An entry carries the cache's header under `KIND/XX/DIGEST` (64 hex, starting
    with XX); a temporary is `KIND/XX/.DIGEST.PID[.N].tmp`. Nothing else is listed,
    so nothing else is evicted or cleared; no symlink is followed. Files another
    process removes meanwhile are left out (several trtbuilds may share the folder).
    """
    entries: Stats = []
    temps = []
    for folder in _entry_folders(root):
        try:
            with os.scandir(folder) as items:
                listed = [(i.name, i.path) for i in items if i.is_file(follow_symlinks=False)]
        except OSError:
            continue
        for name, path in listed:
            temp = TEMP_NAME.fullmatch(name)
            if ENTRY_NAME.fullmatch(name) and name[:2] == folder.name:
                st = _own_entry(path)
                if st is not None:
                    entries.append((Path(path), st))
            elif temp and temp[1][:2] == folder.name:
                with contextlib.suppress(OSError):
                    temps.append((Path(path), os.lstat(path), int(temp[2])))
    return entries, temps


def _entry_folders(root: Path) -> list[Path]:
    """`KIND/XX` folders under root, real folders only (a symlink is not descended)."""
    found = []
    for kind in KINDS:
        with contextlib.suppress(OSError):
            if not stat.S_ISDIR(os.lstat(root / kind).st_mode):
                continue
            with os.scandir(root / kind) as items:
                found += [
                    Path(i.path)
                    for i in items
                    if re.fullmatch(r"[0-9a-f]{2}", i.name) and i.is_dir(follow_symlinks=False)
                ]
    return found


def _own_entry(path: str) -> os.stat_result | None:
    """Its stat if `path` is a regular file that starts with the cache's header."""
    try:
        fd = os.open(path, _READ)
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


def _evict(root: Path, max_bytes: int) -> int:
    """`Cache.evict`: oldest use first; what is not the cache's own is never counted or removed."""
    entries, temps = _scan(root)
    _remove_stale(temps)
    files = sorted(entries, key=lambda e: e[1].st_mtime)
    total, removed = sum(st.st_size for _, st in files), 0
    for path, st in files:
        if total <= max_bytes:
            break
        total -= st.st_size
        removed += _remove(path)
    return removed


def _info(root: Path, max_bytes: int) -> dict[str, Any]:
    """`Cache.info`: entries only, so a user's file in the folder neither counts nor shows."""
    sizes = [(p.parent.parent.name, st.st_size) for p, st in _scan(root)[0]]
    return {
        "root": str(root),
        "entries": len(sizes),
        "by_kind": {k: sum(1 for kind, _ in sizes if kind == k) for k in KINDS},
        "bytes": sum(size for _, size in sizes),
        "bytes_by_kind": {k: sum(n for kind, n in sizes if kind == k) for k in KINDS},
        "max_bytes": max_bytes,
    }


def _remove_stale(temps: list[tuple[Path, os.stat_result, int]]) -> None:
    """Remove the temporaries of writers that are gone (a crash, a kill -9)."""
    now = time.time()
    for path, st, pid in temps:
        age = now - st.st_mtime
        if age > STALE_SECONDS or (age > DEAD_GRACE_SECONDS and not alive(pid)):
            _remove(path)


def _remove(path: Path) -> int:
    """1 if `path` was removed now, 0 if it was gone already or cannot be."""
    try:
        path.unlink()
    except OSError:
        return 0
    return 1
