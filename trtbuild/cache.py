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
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.errors import UsageError

MAGIC = b"trtbuild-cache/1\n"
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

    def get(self, kind: str, digest: str) -> Any | None:
        """The cached value, or None (a miss, a disabled cache or a corrupt entry)."""
        if not self.enabled:
            self.hits[kind] = "off"
            return None
        path = self._path(kind, digest)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self.hits[kind] = "miss"
            return None
        except OSError as exc:
            self._off(kind, f"cannot read {path}: {exc.strerror or exc}")
            return None
        value = _decode(blob)
        if value is None:
            self._warn("corrupt", f"dropped a corrupt cache entry {path}; it is recomputed")
            path.unlink(missing_ok=True)
            self.hits[kind] = "miss"
            return None
        _touch(path)
        self.hits[kind] = "hit"
        return value

    def put(self, kind: str, digest: str, value: Any) -> bool:
        """Store atomically, then evict least recently used entries beyond the cap.

        An entry larger than its share of the cap (`BULKY`, else the whole cap) is
        not written and evicts nothing; False says so.
        """
        if not self.enabled:
            return False
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) + 100 > self.max_bytes // BULKY.get(kind, 1):
            return False
        blob = MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
        path = self._path(kind, digest)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self._off(kind, f"cannot write to {self.root}: {exc.strerror or exc}")
            return False
        self.evict()
        return True

    def entries(self) -> list[Path]:
        return [p for p, _ in _stats(self.root)]

    def evict(self) -> int:
        """Remove least recently used entries until the folder fits `max_bytes`."""
        files = sorted(_stats(self.root), key=lambda e: e[1].st_mtime)
        total, removed = sum(st.st_size for _, st in files), 0
        for path, st in files:
            if total <= self.max_bytes:
                break
            total -= st.st_size
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def info(self) -> dict[str, Any]:
        """Entries and bytes, in all and per kind: which kind fills the folder."""
        sizes = [(p.parent.parent.name, st.st_size) for p, st in _stats(self.root)]
        return {
            "root": str(self.root),
            "entries": len(sizes),
            "by_kind": {k: sum(1 for kind, _ in sizes if kind == k) for k in KINDS},
            "bytes": sum(size for _, size in sizes),
            "bytes_by_kind": {k: sum(n for kind, n in sizes if kind == k) for k in KINDS},
            "max_bytes": self.max_bytes,
        }

    def clear(self) -> int:
        files = self.entries()
        for path in files:
            path.unlink(missing_ok=True)
        return len(files)

    def check_root(self) -> None:
        """Turn the cache off, with one warning, when its folder cannot be used."""
        if self.enabled and self.root.exists() and not self.root.is_dir():
            self._off("*", f"{self.root} is a file, not a folder; set TRTBUILD_CACHE_DIR")

    def _path(self, kind: str, digest: str) -> Path:
        return self.root / kind / digest[:2] / digest

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


def _stats(root: Path) -> list[tuple[Path, os.stat_result]]:
    """Finished entries with their stat; in-flight `.tmp` files and entries another process
    removes meanwhile are left out (several trtbuilds may share the folder)."""
    if not root.is_dir():
        return []
    found = []
    for kind in KINDS:
        for path in (root / kind).glob("*/*"):
            if path.name.endswith(".tmp"):
                continue
            with contextlib.suppress(OSError):
                st = path.stat()
                if not path.is_dir():
                    found.append((path, st))
    return found


def _decode(blob: bytes) -> Any | None:
    if not blob.startswith(MAGIC):
        return None
    end = blob.find(b"\n", len(MAGIC))
    digest, payload = blob[len(MAGIC) : end], memoryview(blob)[end + 1 :]  # no copy
    if end < 0 or hashlib.sha256(payload).hexdigest().encode() != digest:
        return None
    try:
        return pickle.loads(payload)
    except Exception:  # a payload of another trtbuild: treat as corrupt
        return None


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)  # least recently *used*: a hit counts
