"""The .npz inputs of one point: planned from the files' headers, read once the count is known.

Why two steps: a point is judged on at most `accuracy.samples` samples, and fewer
where another input holds fewer; so every file is first known by its headers
(names, dtypes, shapes, checked there, before a byte is inflated), the point's
sample count and the memory its data takes follow from those, and only then is
each array read, and only the samples the point uses (every sample only where
synthetic data needs the file's statistics).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from trtbuild import words
from trtbuild.accuracy import derive, npz
from trtbuild.accuracy.points import ShapePoint
from trtbuild.errors import UsageError
from trtbuild.numerics import holds, not_held
from trtbuild.policy.model import Policy


@dataclass(frozen=True)
class FileInput:
    """One input's array in an .npz, known from its header."""

    name: str  # the model input
    path: Path
    at: tuple[str, ...]  # the policy field that names the file (its path's parts)
    member: npz.Member
    own: (
        bool  # the point's own file (its exact shapes), else the input's (derived where it differs)
    )
    rank: int  # the input's rank at this point
    every: bool = False  # synthetic data at another shape: its statistics take every sample

    @property
    def constant(self) -> bool:
        """No sample axis: the same array in every sample (a 0-d sample rate, one state)."""
        return len(self.member.shape) == self.rank

    def nbytes(self, count: int) -> int:
        """What reading it for `count` samples inflates."""
        return self.member.nbytes(None if self.every or self.constant else count)


def plan(
    policy: Policy,
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict,
    model_dims: dict,
    point: ShapePoint | None,
) -> dict[str, FileInput]:
    """Every input this point takes from a file (its own first), checked from the headers."""
    found = _own(policy, point, shapes, dtypes) if point is not None and point.file else {}
    for spec in policy.inputs:
        if spec.name in found or spec.name not in shapes or spec.data.file is None:
            continue
        at, path = ("inputs", spec.name, "data", "file"), spec.data.file
        found_in = _members(policy, path, at)
        member = found_in.get(spec.name) or found_in.get(npz.BARE)
        if member is None:
            keys = ", ".join(found_in)
            raise UsageError(
                f"{words.field(*at)}: {path.name} has no array '{spec.name}'",
                where=policy.where_of(*at),
                hint=f"keys found: {keys}",
            )
        with _readable(policy, at, path):  # an .npz's other keys may hold objects
            npz.refuse_objects(member)
        _check_kind(policy, at, spec.name, member.dtype, np.dtype(dtypes[spec.name]))
        shape = shapes[spec.name]
        member = batched(member, shape, model_dims[spec.name])
        every = derive.check(policy, spec, member.shape, shape, model_dims[spec.name], point)
        found[spec.name] = FileInput(spec.name, path, at, member, False, len(shape), every)
    return found


def batched(member: npz.Member, shape: tuple[int, ...], model_dims: list) -> npz.Member:
    """An array of the input's rank whose first axis is k times the batch the model fixes
    (k > 1), its other axes the point's (or on axes the model leaves free), read as k
    samples of that batch: ModelOpt's calibration layout (`[N*B, C, H, W]`, N batches)."""
    have, fixed = member.shape, (model_dims[0] if model_dims else None)
    if len(have) != len(shape) or not isinstance(fixed, int) or fixed < 1 or not have[0]:
        return member
    if have[0] == fixed or have[0] % fixed:
        return member
    rest = zip(have[1:], shape[1:], model_dims[1:])
    if any(h != s and isinstance(d, int) for h, s, d in rest):
        return member  # another axis the model fixes differs: the user's to fix, as given
    return replace(member, shape=(have[0] // fixed, fixed, *have[1:]), stored=have)


def read(policy: Policy, f: FileInput, count: int, dtype) -> np.ndarray:
    """The array, cut to `count` samples where it has a sample axis and needs no more, in the
    input's dtype; NaN refused in what is read (±inf is a mask's data)."""
    cut = None if f.every or f.constant else count
    with _readable(policy, f.at, f.path):
        arr = npz.read(f.path, f.member, cut)
    return _held(policy, f.at, f.name, _finite(policy, f.at, f.name, arr), np.dtype(dtype))


def _own(
    policy: Policy, point: ShapePoint, shapes: dict[str, tuple[int, ...]], dtypes: dict
) -> dict[str, FileInput]:
    """A point's own .npz: arrays keyed by input name, at exactly this point's shapes."""
    at = ("accuracy", "shapes", point.name.split("=")[-1], "data", "file")
    field, where = words.field(*at), policy.where_of(*at)
    members = _members(policy, point.file, at)
    if npz.BARE in members:
        raise UsageError(
            f"{field}: {point.file.name} is one array (.npy); a point's own file holds one "
            "array per model input, keyed by its name",
            where=where,
            hint="save it as an .npz: np.savez(path, **{input_name: array, ...})",
        )
    unknown = [k for k in members if k not in shapes]
    if unknown:
        raise UsageError(
            f"{field}: {point.file.name} holds array(s) {unknown} that name no model input",
            where=where,
            hint="the model's inputs are " + ", ".join(shapes),
        )
    out = {}
    for name, member in members.items():
        with _readable(policy, at, point.file):
            npz.refuse_objects(member)
        _check_kind(policy, at, name, member.dtype, np.dtype(dtypes[name]))
        shape, have = shapes[name], member.shape
        if have != shape and have[1:] != shape:
            raise UsageError(
                f"{field}: array '{name}' has shape {list(have)}; {point.label} needs "
                f"{list(shape)} or [N, {', '.join(map(str, shape))}]",
                where=where,
                hint="a point's own file holds that point's shapes",
            )
        if have != shape and have[0] == 0:
            raise derive.empty_file(policy, at, point.file, name, have)
        out[name] = FileInput(name, point.file, at, member, True, len(shape))
    return out


def _members(policy: Policy, path: Path, at: tuple[str, ...]) -> dict[str, npz.Member]:
    with _readable(policy, at, path):
        return npz.members(path)


@contextlib.contextmanager
def _readable(policy: Policy, at: tuple[str, ...], path: Path) -> Iterator[None]:
    """A file the judge cannot read (`npz.NpzError`: corrupt, truncated, an array of Python
    objects an input takes) said as the policy field's fault, with how to save it again."""
    try:
        yield
    except npz.NpzError as exc:
        raise UsageError(
            f"{words.field(*at)}: cannot read {path}: {exc}",
            where=policy.where_of(*at),
            hint=npz.UNREADABLE_FIX,
        ) from None


_KINDS = {"f": "floating-point", "i": "integer", "u": "integer", "b": "boolean"}


def _check_kind(
    policy: Policy, at: tuple[str, ...], name: str, have: np.dtype, want: np.dtype
) -> None:
    """Converting within a kind (float64 to float32, int32 to int64) is what a deployment's
    preprocessing does; floats for an integer input or integers for a float one mean the
    file holds something else than the model expects."""
    if have.kind not in _KINDS or _KINDS[have.kind] != _KINDS.get(want.kind):
        raise UsageError(
            f"{words.field(*at)}: array '{name}' holds {have} values; the model's input "
            f"'{name}' takes {want} ({_KINDS.get(want.kind, want.kind)})",
            where=policy.where_of(*at),
            hint=f"save the array as {want} (e.g. arr.astype(np.{want}))",
        )


def _held(
    policy: Policy, at: tuple[str, ...], name: str, arr: np.ndarray, want: np.dtype
) -> np.ndarray:
    """`arr` in the input's dtype, where that dtype holds every value: the first value it
    cannot hold is exit 2, naming the array and the index.

    Why: numpy's cast does not refuse, it wraps or overflows. A float64 1e39 (or a float32
    70000 for an FP16 input) turned inf and was blamed on the model ("the FP32 reference
    holds inf: a broken checkpoint's weights?"), and an int64 token id 2**32 + 1 for an
    int32 input was fed as 1: judged, both sides alike, on data the file does not hold.
    """
    if arr.dtype == want:
        return arr
    bad = not_held(arr, want)
    if arr.dtype.kind == "f" and want.kind == "f":  # an inf of the file is inf in any float
        bad &= np.isfinite(arr)
    bad = np.argwhere(bad)
    if bad.size:
        index = tuple(int(i) for i in bad[0])
        raise UsageError(
            f"{words.field(*at)}: array '{name}' holds {len(bad)} value(s) that the model's "
            f"input '{name}' ({want}) cannot hold, the first at index {list(index)} "
            f"({arr[index]}; {want} holds {holds(want)})",
            where=policy.where_of(*at),
            hint=f"save values {want} holds: the values the deployment feeds",
        )
    return arr.astype(want, copy=False)


def _finite(policy: Policy, at: tuple[str, ...], name: str, arr: np.ndarray) -> np.ndarray:
    """`arr`, where it holds no NaN: a NaN is exit 2, naming the array and its index.

    Why not inf too: an additive attention mask holds -inf where it masks (PyTorch's
    `generate_square_subsequent_mask`, a causal mask saved as the deployment feeds it), a
    value of the data, not a broken file; a reference that turns NaN or inf on it is
    refused at its output (`reference.check_finite`), as for any data. A NaN is no value:
    every comparison with it is false.
    """
    if arr.dtype.kind == "f":
        bad = np.argwhere(np.isnan(arr))
        if bad.size:
            index = tuple(int(i) for i in bad[0])
            raise UsageError(
                f"{words.field(*at)}: array '{name}' holds {len(bad)} NaN value(s), "
                f"the first at index {list(index)}",
                where=policy.where_of(*at),
                hint="reference inputs hold no NaN (±inf, a mask's, is data); clean or "
                "regenerate the file",
            )
    return arr
