"""An .npz (or one .npy) read the way the judge needs it: every header first, then only the
samples used.

Why not `np.load(...)[name]`: that inflates the whole array before anything can be
checked, so a file of 10,000 frames costs all of them in memory (and time) when a
point is judged on four, and a wrong dtype or a sample axis of length 0 is found only
after the file is read. Here each member's `.npy` header (shape, dtype, order) is read
from the zip without inflating its data; the checks and the memory budget work from
those, and then only the first samples a point needs are inflated. Nothing is
unpickled: an object array is listed from its header (`Member.objects`) and refused where an
input would take it (`refuse_objects`) or its data would be read; one beside the arrays the
inputs take (a file's labels saved with them) is left alone. A bare `.npy` (ModelOpt's
calibration data for a one-input model) is one array, the input's that names the file.
"""

from __future__ import annotations

import math
import struct
import tokenize
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


class NpzError(Exception):
    """The file is not an .npz the judge can read; the caller names the policy field."""


@dataclass(frozen=True)
class Member:
    """One array of an .npz, as its header says: nothing of its data is read."""

    name: str  # the key `np.load` gives it (the member's name without `.npy`)
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool  # column-major: its leading axis is not contiguous
    bare: bool = False  # the file is this one `.npy`, not a member of an .npz
    stored: tuple[int, ...] | None = None  # the header's shape, where `shape` splits its axis 0

    @property
    def objects(self) -> bool:
        """It holds Python objects: never read (`refuse_objects`)."""
        return self.dtype.hasobject

    def sample_bytes(self) -> int:
        """Bytes of one entry of the leading axis (of the whole array if it is 0-d)."""
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    def nbytes(self, count: int | None = None) -> int:
        """Bytes of the first `count` entries of the leading axis (all: None or 0-d)."""
        if count is None or not self.shape:
            return math.prod(self.shape) * self.dtype.itemsize
        return min(count, self.shape[0]) * self.sample_bytes()


# What to do with a file `members` or `read` cannot read (NpzError)
UNREADABLE_FIX = (
    "save it again whole with numpy.save or numpy.savez, numbers only (trtbuild never loads "
    "pickles: no object arrays, in any key)"
)
# The key of a bare `.npy`'s one array: whichever input names the file takes it
BARE = "*"
# What reading a damaged file raises besides `zipfile.BadZipFile` (found by mutating the bytes
# of real .npz and .npy files): the zip's or zlib's refusals (a compression method or an
# encryption zipfile does not read, a stream cut short). Each is the file's fault, said as
# such, not an internal error; a header numpy cannot parse is `_header`'s ValueError.
UNREADABLE = (OSError, ValueError, EOFError, KeyError, zlib.error, struct.error)
UNREADABLE += (NotImplementedError, RuntimeError)
# What numpy's header parser raises on a mangled header besides ValueError (it tokenizes and
# evaluates the header's dict literal)
_MANGLED_HEADER = (TypeError, SyntaxError, tokenize.TokenError)


def members(path: Path) -> dict[str, Member]:
    """Every array of the .npz by its key (a bare `.npy`'s under `BARE`), from the headers
    alone."""
    try:
        with open(path, "rb") as f:
            if f.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX:
                f.seek(0)  # its one array is the input's: refused now if it holds objects
                return {BARE: replace(refuse_objects(_header(f, BARE)), bare=True)}
        with zipfile.ZipFile(path) as zf:
            found = {}
            for info in zf.infolist():
                if info.filename.endswith(".npy"):
                    with zf.open(info) as f:
                        found[info.filename[:-4]] = _header(f, info.filename[:-4])
            return found
    except zipfile.BadZipFile:
        raise NpzError("it is neither an .npz (a zip of arrays) nor an .npy") from None
    except UNREADABLE as exc:
        raise NpzError(str(exc) or type(exc).__name__) from None


def read(path: Path, member: Member, count: int | None = None) -> np.ndarray:
    """The array, or only the first `count` entries of its leading axis (None: all of it).

    Only what is returned is inflated, save for a column-major array cut to fewer
    entries (its samples are not contiguous): that one is read whole, then cut.
    """
    whole = count is None or not member.shape or count >= member.shape[0]
    try:
        if member.bare:
            with open(path, "rb") as f:
                return _after_header(f, member, whole, count)
        with zipfile.ZipFile(path) as zf, zf.open(member.name + ".npy") as f:
            return _after_header(f, member, whole, count)
    except (zipfile.BadZipFile, *UNREADABLE) as exc:
        raise NpzError(str(exc) or type(exc).__name__) from None


def _after_header(f, member: Member, whole: bool, count: int | None) -> np.ndarray:
    refuse_objects(_header(f, member.name))
    if member.fortran:  # read whole in the header's shape, then split and cut as asked
        arr = _rest(f, replace(member, shape=member.stored or member.shape), None)
        arr = arr.reshape(member.shape)
        return arr if whole else arr[:count]
    return _rest(f, member, None if whole else count)


def _header(f, name: str) -> Member:
    """The `.npy` header at the stream's start; the stream is left at the data."""
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"array '{name}' is stored in .npy format {version}, not 1.0 or 2.0")
    parse = np.lib.format.read_array_header_1_0 if version == (1, 0) else None
    try:
        shape, fortran, dtype = (parse or np.lib.format.read_array_header_2_0)(f)
    except _MANGLED_HEADER as exc:
        raise ValueError(f"array '{name}' has a header numpy cannot parse ({exc})") from None
    return Member(name, tuple(int(d) for d in shape), dtype, bool(fortran))


def refuse_objects(member: Member) -> Member:
    """`member`, or NpzError where it holds Python objects: pickles are never loaded."""
    if member.objects:
        raise NpzError(f"array '{member.name}' holds Python objects (pickles are never loaded)")
    return member


def _rest(f, member: Member, count: int | None) -> np.ndarray:
    """The data after the header: the first `count` entries, or everything."""
    size = member.nbytes(count)
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = f.readinto(view[got:])
        if not n:
            raise EOFError(f"array '{member.name}' ends after {got} of {size} bytes")
        got += n
    shape = member.shape if count is None or not member.shape else (count, *member.shape[1:])
    if member.fortran:
        return np.frombuffer(buf, member.dtype).reshape(shape[::-1]).T
    return np.frombuffer(buf, member.dtype).reshape(shape)
