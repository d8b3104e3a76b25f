"""A file's data at a point whose shape its arrays do not have: tiled, synthetic, or refused.

Why derive at all: an .npz holds one shape (299 frames), and the engine serves a
profile (1 to 1000 frames); judging only the file's shape would call the whole
profile good from one point. Tiling keeps the real values and their order along
the axes that differ (a sequence repeated to length, or its first frames);
synthetic data keeps their statistics. Either is said plainly, and `derive: none`
makes a point without data of its own the user's to fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trtbuild import words
from trtbuild.accuracy.points import InputData, ShapePoint
from trtbuild.errors import UsageError
from trtbuild.policy.model import Policy
from trtbuild.policy.specs import InputSpec


def check(
    policy: Policy,
    spec: InputSpec,
    file_shape: tuple[int, ...],
    shape: tuple[int, ...],
    model_dims: list,
    point: ShapePoint | None,
) -> bool:
    """From the array's shape alone (its header, before any of it is read): it fits this
    point as it is or derived, or one message names the field to fix. True where the point
    needs every sample the file holds: synthetic data at another shape takes their statistics."""
    at = ("inputs", spec.name, "data", "file")
    field = words.field(*at)
    have = _sample_shape(policy, at, spec, file_shape, shape)
    if have == shape:
        return False
    _check_axes(policy, at, spec.name, have, shape, model_dims)
    if spec.data.derive == "none":
        where = point.label if point is not None else str(list(shape))
        point_name = point.name.split("=")[-1] if point is not None else "opt"
        raise UsageError(
            f"{field}: array '{spec.name}' has shape {list(have)}; {where} needs {list(shape)} "
            "and derive is none",
            where=policy.where_of(*at),
            hint=f"give the point its own data ({words.field('accuracy', 'shapes', point_name, 'data', 'file')}), "
            f"skip it ({words.field('accuracy', 'shapes', point_name, 'skip')}: REASON), or set "
            "derive: tile or synthetic",
        )
    return spec.data.derive == "synthetic"


def fit(
    policy: Policy,
    spec: InputSpec,
    arr: np.ndarray,
    shape: tuple[int, ...],
    model_dims: list,
    point: ShapePoint | None,
) -> tuple[np.ndarray, InputData]:
    """`arr` (every sample the file holds, or the first ones the point uses) as [samples,
    *shape] (at most `accuracy.samples`), and where it comes from."""
    check(policy, spec, arr.shape, shape, model_dims, point)
    every = arr[None] if arr.ndim == len(shape) else arr
    samples, have, name = every[: policy.accuracy.samples], every.shape[1:], spec.data.file.name
    if have == shape:
        return samples, InputData("file", name)
    if spec.data.derive == "synthetic":  # the statistics of every sample the file holds
        _drawable(policy, spec, every)
        made = _synthetic(every, shape, policy.accuracy.seed, len(samples))
        said = _said(name, have, shape, synthetic=every.dtype.kind)
        return made, InputData("synthetic", said)
    return _tiled(samples, shape), InputData("derived", _said(name, have, shape, synthetic=""))


def _sample_shape(
    policy: Policy, at: tuple[str, ...], spec: InputSpec, file_shape: tuple[int, ...], shape: tuple
) -> tuple[int, ...]:
    """The dims of one sample: the array's where it has the input's rank, else after its
    leading axis (N > 0: a file without samples is the user's to fix, not an empty verdict)."""
    if len(file_shape) == len(shape):
        return tuple(file_shape)
    if len(file_shape) == len(shape) + 1:
        if file_shape[0] == 0:
            raise empty_file(policy, at, spec.data.file, spec.name, file_shape)
        return tuple(file_shape[1:])
    raise UsageError(
        f"{words.field(*at)}: array '{spec.name}' has shape {list(file_shape)}; the input takes "
        f"rank {len(shape)} ({list(shape)} here) or [N, ...] with a leading sample axis",
        where=policy.where_of(*at),
        hint="save one array per input, shaped like the input or with a sample axis first",
    )


def _check_axes(
    policy: Policy,
    at: tuple[str, ...],
    name: str,
    have: tuple[int, ...],
    shape: tuple[int, ...],
    model_dims: list,
) -> None:
    """Only axes the model leaves dynamic may differ: any other holds another input."""
    for axis, (a, b, fixed) in enumerate(zip(have, shape, model_dims)):
        if a != b and (a == 0 or (isinstance(fixed, int) and fixed > 0)):
            raise UsageError(
                f"{words.field(*at)}: array '{name}' has {a} on axis {axis} where the model's "
                f"input has {b}; only dynamic axes can be derived",
                where=policy.where_of(*at),
                hint=f"save the array with shape {list(shape)} (or [N, ...] of it)",
            )


def _tiled(samples: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Each differing axis cropped to its first entries, or repeated (wrapping) to length."""
    out = samples
    for axis, want in enumerate(shape, start=1):
        if out.shape[axis] != want:
            out = np.take(out, np.arange(want), axis=axis, mode="wrap")
    return out


def _drawable(policy: Policy, spec: InputSpec, every: np.ndarray) -> None:
    """Exit 2 where the file holds ±inf: synthetic data cannot keep its statistics.

    Why: an additive attention mask holds -inf where it masks; its mean is -inf and its
    std NaN, so the normal draws were NaN everywhere and the reference's NaN was blamed on
    the model. A mask is structure, not a distribution: tiling keeps it.
    """
    if every.dtype.kind != "f" or np.isfinite(every).all():
        return
    at = ("inputs", spec.name, "data", "file")
    raise UsageError(
        f"{words.field(*at)}: array '{spec.name}' holds ±inf (a mask's?), which has no "
        "mean or std to draw synthetic data from",
        where=policy.where_of(*at),
        hint="set derive: tile (the mask's own values, cropped or repeated), or give the "
        "point its own file",
    )


def _synthetic(samples: np.ndarray, shape: tuple[int, ...], seed: int, count: int) -> np.ndarray:
    """Random values with the data's mean, std and range per index of the axes that keep
    their size (a spectrogram's frequency bins, an image's channels)."""
    pooled = (0, *(i + 1 for i, (a, b) in enumerate(zip(samples.shape[1:], shape)) if a != b))
    lo, hi = samples.min(axis=pooled, keepdims=True), samples.max(axis=pooled, keepdims=True)
    rng = np.random.default_rng(seed)
    size = (count, *shape)
    if samples.dtype.kind == "f":
        x = samples.astype(np.float64)
        mean, std = x.mean(axis=pooled, keepdims=True), x.std(axis=pooled, keepdims=True)
        return np.clip(rng.normal(mean, std, size=size), lo, hi).astype(samples.dtype)
    drawn = rng.integers(lo.astype(np.int64), hi.astype(np.int64), size=size, endpoint=True)
    return drawn.astype(samples.dtype)


def _said(name: str, have: tuple, shape: tuple, *, synthetic: str) -> str:
    """`frames.npz tiled on axis 1 (299 -> 1000)`, or the synthetic data's statistics
    (`synthetic`: the data's numpy kind, as `_synthetic` draws by it; "" where tiled)."""
    changed = [(i, a, b) for i, (a, b) in enumerate(zip(have, shape)) if a != b]
    if synthetic:
        kept = [str(i) for i in range(len(shape)) if i not in {c[0] for c in changed}]
        per = f" per index of axis {', '.join(kept)}" if kept else ""
        drawn = {
            "f": "normal values with {}'s mean, std and range",
            "b": "uniform booleans as {} holds them",
        }.get(synthetic, "uniform integers in {}'s range").format(name)
        return f"synthetic: {drawn}{per} (it holds {list(have)})"
    steps = ", ".join(
        f"{'tiled' if b > a else 'cropped'} on axis {i} ({a} -> {b})" for i, a, b in changed
    )
    return f"{name} {steps}"


def empty_file(
    policy: Policy, at: tuple[str, ...], path: Path, name: str, shape: tuple[int, ...]
) -> UsageError:
    """A file whose array has a sample axis of length 0: nothing to judge with, said so (`at`:
    the policy field that names the file)."""
    return UsageError(
        f"{words.field(*at)}: {path.name} holds no samples of '{name}' (array shape {list(shape)})",
        where=policy.where_of(*at),
        hint=f"save at least one sample in {path}, or remove it from the policy",
    )
