"""The points of the input space a policy is judged at, checked against the model and profile.

Why every point: sums grow with the input, so a reduction that fits FP16 at `opt`
can be inf at `max`, in the engine built for that whole profile. This holds
whatever the data is: images are fit to each point, a file's arrays are used
where they fit and derived where they do not (`trtbuild.accuracy.data`), and a
point is left out only where the policy says why (`skip`), never silently.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild import words
from trtbuild.errors import UsageError
from trtbuild.policy.model import Policy
from trtbuild.policy.specs import InputSpec, PointSpec

if TYPE_CHECKING:
    import onnx

Dims = list[int | str | None]


@dataclass(frozen=True)
class InputData:
    """Where one input's data at one point comes from, said plainly in every report."""

    kind: str  # DATA_KINDS
    source: str  # `uniform [0, 1)`, `frames.npz tiled on axis 1 (299 -> 1000)`, ...

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.source}


# random: a distribution; images and file: the user's data as it is (images fit to the
# point from their originals); upsampled: images some of which are smaller than the point
# (detail above their size is interpolated, not real); padded: images cropped at a pixel
# scale some of which are smaller than the point (mirrored borders); derived: a file's
# arrays tiled or cropped to the point; synthetic: random values with a file's statistics.
# The last four are not wholly the user's data and are said so at every point they hold.
DATA_KINDS = {
    "random": "random data",
    "images": "image data",
    "upsampled": "upsampled image data",
    "padded": "mirror-padded image data",
    "file": "file data",
    "derived": "data derived from a file",
    "synthetic": "synthetic data",
}  # each kind, and how a verdict says it
MADE_UP = ("upsampled", "padded", "derived", "synthetic")


@dataclass(frozen=True)
class ShapePoint:
    """One set of input shapes a policy is judged at: a profile point or a named one."""

    name: str  # shape | min | opt | max | a name of accuracy.shapes (opt=min where equal)
    shapes: dict[str, tuple[int, ...]]  # every model input, in the model's order
    file: Path | None = None  # this point's own .npz (accuracy.shapes.NAME.data.file)
    skip: str | None = None  # why this point is not judged (accuracy.shapes.NAME.skip)

    @property
    def label(self) -> str:
        """`max [1, 3, 256, 256]`: the name and the dims, of each input where there are several."""
        return point_label(self.name, self.shapes)

    def skipped_json(self) -> dict[str, Any]:
        """report.json's `skipped_shapes` entry (and `check --json`'s `skipped_points`)."""
        inputs = {n: list(d) for n, d in self.shapes.items()}
        return {"name": self.name, "inputs": inputs, "reason": self.skip}


def point_label(name: str, shapes: dict[str, tuple[int, ...]]) -> str:
    """`max [1, 3, 256, 256]`, or `max {a: [..], b: [..]}` for several inputs (`shape (no
    inputs)` for a model that takes none, not `shape {}`)."""
    if not shapes:
        return f"{name} (no inputs)"
    if len(shapes) == 1:
        return f"{name} {list(next(iter(shapes.values())))}"
    return f"{name} {{" + ", ".join(f"{n}: {list(d)}" for n, d in shapes.items()) + "}"


def model_inputs(model: onnx.ModelProto) -> list[tuple[str, int, Dims]]:
    """(name, elem_type, dims) of every graph input that is not a weight."""
    from trtbuild.graph.model_io import fed_inputs

    out = []
    for vi in fed_inputs(model):
        tt = vi.type.tensor_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        ]
        out.append((vi.name, tt.elem_type, dims))
    return out


def check_inputs(policy: Policy, model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Resolve the primary feed shape of every model input, or say which policy field to fix."""
    inputs = model_inputs(model)
    names = [n for n, _, _ in inputs]
    specs = {s.name: s for s in policy.inputs}
    for name in specs:
        if name not in names:
            from trtbuild.graph.model_io import no_input

            field = words.field("inputs", name)
            _not_frozen(policy, name, field, policy.where_of("inputs", name))
            raise no_input(field, name, names, policy.where_of("inputs", name))
    shapes = {}
    for name, _, dims in inputs:
        spec = specs.get(name)
        shape = spec.feed_shape if spec else None
        if shape is None:
            if all(isinstance(d, int) for d in dims) and 0 in dims:
                raise _empty_input(policy, name, dims)
            if any(not isinstance(d, int) or d <= 0 for d in dims):
                raise UsageError(
                    f"{words.field('inputs', name)}: the model's input '{name}' has dynamic shape "
                    f"{[d if d else '?' for d in dims]}",
                    where=policy.where_of("inputs", name),
                    hint=f"add 'inputs: {{{name}: {{shape: [...]}}}}' or a min/opt/max profile",
                )
            shape = tuple(dims)
        else:
            for key in ("shape", "min", "opt", "max"):
                if getattr(spec, key) is not None:
                    check_fits(policy, name, getattr(spec, key), dims, ("inputs", name, key))
        shapes[name] = tuple(shape)
    return shapes


def _empty_input(policy: Policy, name: str, dims: list) -> UsageError:
    """The error for an input the model declares with a dim of 0 (an empty tensor).

    Why its own: it was said as a dynamic shape, `[2, '?', 4]`, with the hint to give a
    `shape:`, which the policy then refuses for its 0 (`must be at least 1`): two errors, the
    first of them wrong about the model.
    """
    return UsageError(
        f"{words.field('inputs', name)}: the model's input '{name}' declares a dim of 0 "
        f"({list(dims)}: an empty tensor), which is not judged: ONNX Runtime, which runs the "
        "FP32 reference and the emulation, dies on some ops fed one",
        where=policy.where_of("inputs", name),
        hint="export the model with that dim at least 1 (a decoder's first step: the model "
        "exported without its cache inputs)",
    )


def _not_frozen(policy: Policy, name: str, field: str, where: str) -> None:
    """Exit 2 where `field` gives a shape or data to an input `passes.freeze_inputs` made a
    constant (the prepared model has no such input any more).

    Why: "the model has no input 'lengths' (name one of the model's inputs: mel)" for an
    input the model has, which the user froze in the same policy, sent them to the model.
    """
    if name in dict(policy.passes.freeze_inputs):
        raise UsageError(
            f"{field}: input '{name}' is frozen by passes.freeze_inputs: a constant of the "
            "prepared model, which no point feeds",
            where=where,
            hint=f"remove '{name}' here (the model computes with its frozen value), or take it "
            "out of passes.freeze_inputs to feed it",
        )


def check_fits(policy: Policy, name: str, shape, dims: Dims, at: tuple[str, ...]) -> None:
    """`shape` (the policy's field `at`) has the model input's rank and keeps every dimension
    the model fixes."""
    field = words.field(*at)
    if len(shape) != len(dims):
        raise UsageError(
            f"{field}: rank {len(shape)} does not fit the model's rank-{len(dims)} input",
            where=policy.where_of(*at),
            hint=f"the model expects {[d if d else '?' for d in dims]}",
        )
    for given, fixed in zip(shape, dims):
        if isinstance(fixed, int) and fixed > 0 and given != fixed:
            raise UsageError(
                f"{field}: {list(shape)} does not fit the model's {[d if d else '?' for d in dims]}",
                where=policy.where_of(*at),
                hint="only dynamic dimensions may differ; if the model's shape is an export's "
                f"placeholder, set passes.override_input_shapes: {{{name}: [...]}} (a name for a "
                "dynamic dim)",
            )


def shape_points(policy: Policy, model: onnx.ModelProto) -> list[ShapePoint]:
    """Every point of the input space, the primary one (`shape`/`opt`) first; skipped ones too.

    The profile's own points come from the inputs (min, opt, max; `shape` for a
    static policy); `accuracy.shapes` adds named points and may give any point its
    own data file or a reason to skip it. Points with equal shapes and the same data are
    judged once, under both names; where their data differ, each is judged on its own.
    """
    base = check_inputs(policy, model)
    profiled = [s for s in policy.inputs if s.opt is not None]
    points = [ShapePoint("opt" if profiled else "shape", base)]
    for which in ("min", "max") if profiled else ():
        points.append(ShapePoint(which, {**base, **{s.name: getattr(s, which) for s in profiled}}))
    own = {p.name for p in points}
    for spec in policy.accuracy.shapes:
        if spec.name in own:
            i = next(k for k, p in enumerate(points) if p.name == spec.name)
            _same_dims(policy, spec, points[i])
            points[i] = replace(points[i], file=spec.file, skip=spec.skip)
        else:
            shapes = _named_point(policy, model, base, spec)
            points.append(ShapePoint(spec.name, shapes, spec.file, spec.skip))
    return _merged(points)


def _merged(points: list[ShapePoint]) -> list[ShapePoint]:
    """Points of equal shapes and the same data as one (`opt=min`): judged unless every one
    of them is skipped. Two whose data differ stay two points, each judged on its own: each
    with a file of its own, or one with its own file and one with the inputs' data.

    Why not merged into the one with a file: the inputs' data at that shape then went
    unread. `opt` and a named point of its shape with its own file were judged on that file
    alone, and the inputs' file, which overflowed FP16 at opt, was judged nowhere: PASS,
    where the policy without the named point failed.
    """
    merged: list[ShapePoint] = []
    for p in points:
        same = (k for k, q in enumerate(merged) if q.shapes == p.shapes and q.file == p.file)
        i = next(same, None)
        if i is None:
            merged.append(p)
            continue
        q = merged[i]
        skip = q.skip if q.skip is not None and p.skip is not None else None  # judged if any is
        merged[i] = ShapePoint(f"{q.name}={p.name}", q.shapes, q.file, skip)
    return merged


def _same_dims(policy: Policy, spec: PointSpec, point: ShapePoint) -> None:
    """A profile point named in `accuracy.shapes` takes its dims from the inputs."""
    for input_name, dims in spec.dims:
        if point.shapes.get(input_name) != tuple(dims):
            raise UsageError(
                f"{words.field('accuracy', 'shapes', spec.name, input_name)}: {list(dims)} differs from the "
                f"profile's {spec.name} {list(point.shapes.get(input_name, ()))}",
                where=policy.where_of("accuracy", "shapes", spec.name, input_name),
                hint=f"'{spec.name}' is the profile's own point: give only data or skip there, "
                f"change {words.field('inputs', input_name, spec.name)}, or name the extra point otherwise",
            )


def _named_point(
    policy: Policy, model: onnx.ModelProto, base: dict, spec: PointSpec
) -> dict[str, tuple[int, ...]]:
    """A named point of `accuracy.shapes`: inputs it names take its dims, within the profile."""
    at = ("accuracy", "shapes", spec.name)
    where = words.field(*at)
    if spec.name in ("min", "opt", "max"):
        raise UsageError(
            f"{where}: this policy has no min/opt/max profile, so '{spec.name}' names no point",
            where=policy.where_of(*at),
            hint="name the extra point otherwise, or give the inputs a min/opt/max profile",
        )
    inputs = {n: d for n, _, d in model_inputs(model)}
    specs = {s.name: s for s in policy.inputs}
    for input_name, shape in spec.dims:
        if input_name not in inputs:
            from trtbuild.graph.model_io import no_input

            _not_frozen(policy, input_name, where, policy.where_of(*at, input_name))
            raise no_input(where, input_name, inputs, policy.where_of(*at, input_name))
        check_fits(policy, input_name, shape, inputs[input_name], (*at, input_name))
        _within_profile(policy, specs.get(input_name), tuple(shape), (*at, input_name))
    return {**base, **{n: tuple(d) for n, d in spec.dims}}


def _within_profile(
    policy: Policy, spec: InputSpec | None, shape: tuple[int, ...], at: tuple[str, ...]
) -> None:
    """The engine runs only shapes its profile holds: a point outside it is the user's to fix."""
    if spec is None:
        return  # a static model input: check_fits held it to the model's own dims
    if spec.min is not None:
        if all(lo <= d <= hi for lo, d, hi in zip(spec.min, shape, spec.max)):
            return
        profile = f"the optimization profile {list(spec.min)} .. {list(spec.max)}"
        hint = (
            "the engine runs only shapes within its profile: widen min/max or choose a shape inside"
        )
    else:
        if spec.shape is None or tuple(spec.shape) == shape:
            return
        profile = f"the static shape {list(spec.shape)} the engine is built for"
        hint = (
            f"give {words.field('inputs', spec.name)} a min/opt/max profile that holds this shape"
        )
    raise UsageError(
        f"{words.field(*at)}: {list(shape)} is outside {profile}",
        where=policy.where_of(*at),
        hint=hint,
    )
