"""Reference input data: seeded distributions or an .npz file, checked against the model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from trtbuild.accuracy.evaluate import quiet_polygraphy
from trtbuild.errors import UsageError
from trtbuild.policy.model import InputSpec, Policy
from trtbuild.sizes import fmt_bytes

Feed = dict[str, np.ndarray]


def model_inputs(model: onnx.ModelProto) -> list[tuple[str, int, list[int | str | None]]]:
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        ]
        out.append((vi.name, tt.elem_type, dims))
    return out


def check_inputs(policy: Policy, model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Resolve the feed shape of every model input, or say which policy field to fix."""
    inputs = model_inputs(model)
    names = [n for n, _, _ in inputs]
    specs = {s.name: s for s in policy.inputs}
    for name in specs:
        if name not in names:
            raise UsageError(
                f"inputs.{name}: the model has no input '{name}'",
                where=str(policy.path),
                hint="its inputs are " + ", ".join(names),
            )
    shapes = {}
    for name, _, dims in inputs:
        spec = specs.get(name)
        shape = spec.feed_shape if spec else None
        if shape is None:
            if any(not isinstance(d, int) or d <= 0 for d in dims):
                raise UsageError(
                    f"inputs.{name}: the model's input '{name}' has dynamic shape "
                    f"{[d if d else '?' for d in dims]}",
                    where=str(policy.path),
                    hint=f"add 'inputs: {{{name}: {{shape: [...]}}}}' or a min/opt/max profile",
                )
            shape = tuple(dims)
        else:
            _check_fits(policy, name, shape, dims, spec)
        shapes[name] = tuple(shape)
    return shapes


def _check_fits(
    policy: Policy, name: str, shape, dims, spec: InputSpec, field: str | None = None
) -> None:
    field = field or f"inputs.{name}.shape"
    if len(shape) != len(dims):
        raise UsageError(
            f"{field}: rank {len(shape)} does not fit the model's rank-{len(dims)} input",
            where=str(policy.path),
            hint=f"the model expects {[d if d else '?' for d in dims]}",
        )
    for given, fixed in zip(shape, dims):
        if isinstance(fixed, int) and fixed > 0 and given != fixed:
            raise UsageError(
                f"{field}: {list(shape)} does not fit the model's {[d if d else '?' for d in dims]}",
                where=str(policy.path),
                hint="only dynamic dimensions may differ; if the model's shape is an export's "
                f"placeholder, set passes.override_input_shapes: {{{name}: [...]}} (a name for a "
                "dynamic dim)",
            )


def check_memory(policy: Policy, shapes: dict[str, tuple[int, ...]], dtypes: dict) -> None:
    """Refuse `accuracy.samples` whose feeds (and their outputs) cannot fit, before making any.

    Every feed is held for the whole run beside its outputs (reference and
    candidate), so the estimate is three times the inputs' bytes per sample, a
    lower bound, against the same `accuracy.memory_budget` the judge streams by.
    """
    per_sample = sum(math.prod(s) * np.dtype(dtypes[n]).itemsize for n, s in shapes.items())
    need, budget = 3 * per_sample * policy.accuracy.samples, policy.accuracy.budget().bytes
    if need > budget:
        fits = max(1, budget // max(3 * per_sample, 1))
        raise UsageError(
            f"accuracy.samples: {policy.accuracy.samples} samples of these inputs need about "
            f"{fmt_bytes(need)} ({fmt_bytes(per_sample)} of inputs per sample, held three "
            f"times); accuracy.memory_budget is {fmt_bytes(budget)}",
            where=str(policy.path),
            hint=f"lower accuracy.samples to at most {fits}, or raise accuracy.memory_budget",
        )


@dataclass(frozen=True)
class ShapePoint:
    """One set of input shapes a policy is judged at: a profile point, a named shape, or the
    shape the data files hold."""

    name: str  # shape | min | opt | max | a name of accuracy.shapes | the data's dims
    shapes: dict[str, tuple[int, ...]]  # every model input, in the model's order

    @property
    def label(self) -> str:
        """`max [1, 3, 256, 256]`: the name and the dims, of each input where there are several."""
        if len(self.shapes) == 1:
            return f"{self.name} {list(next(iter(self.shapes.values())))}"
        dims = ", ".join(f"{n}: {list(d)}" for n, d in self.shapes.items())
        return f"{self.name} {{{dims}}}"


def shape_points(policy: Policy, model: onnx.ModelProto) -> list[ShapePoint]:
    """Every input space point the policy is judged at, the primary one (`shape`/`opt`) first.

    Why every profile point: sums grow with the input, so a reduction that fits FP16 at
    `opt` can be inf at `max`, in the engine built for that whole profile. Data from
    files or images has one shape: it is judged there, named after it.
    """
    base = check_inputs(policy, model)
    specs = {s.name: s for s in policy.inputs}
    if any(s.data.file is not None or s.data.images for s in policy.inputs):
        first = next(s for s in policy.inputs if s.data.file is not None or s.data.images)
        return [ShapePoint("x".join(map(str, base[first.name])), base)]
    profiled = [s for s in policy.inputs if s.opt is not None]
    points = [ShapePoint("opt" if profiled else "shape", base)]
    for which in ("min", "max") if profiled else ():
        points.append(ShapePoint(which, {**base, **{s.name: getattr(s, which) for s in profiled}}))
    for name, dims in policy.accuracy.shapes:
        points.append(ShapePoint(name, _named_point(policy, model, base, specs, name, dict(dims))))
    unique: dict[tuple, ShapePoint] = {}
    for p in points:  # min == opt is judged once, under both names
        key = tuple(p.shapes.items())
        unique[key] = ShapePoint(f"{unique[key].name}={p.name}", p.shapes) if key in unique else p
    return list(unique.values())


def _named_point(policy: Policy, model, base: dict, specs: dict, name: str, dims: dict) -> dict:
    """A named point of `accuracy.shapes`: inputs it names take its dims, within the profile."""
    field = f"accuracy.shapes.{name}"
    inputs = {n: d for n, _, d in model_inputs(model)}
    for input_name, shape in dims.items():
        if input_name not in inputs:
            raise UsageError(
                f"{field}: the model has no input '{input_name}'",
                where=str(policy.path),
                hint="its inputs are " + ", ".join(inputs),
            )
        _check_fits(policy, input_name, shape, inputs[input_name], InputSpec(input_name), field)
        spec = specs.get(input_name)
        if spec is not None and spec.min is not None:
            inside = all(lo <= d <= hi for lo, d, hi in zip(spec.min, shape, spec.max))
            if not inside:
                raise UsageError(
                    f"{field}.{input_name}: {list(shape)} is outside the optimization profile "
                    f"{list(spec.min)} .. {list(spec.max)}",
                    where=str(policy.path),
                    hint="the engine runs only shapes within its profile: widen min/max or "
                    "choose a shape inside",
                )
    return {**base, **{n: tuple(d) for n, d in dims.items()}}


def make_feeds(
    policy: Policy, model: onnx.ModelProto, point: ShapePoint | None = None
) -> list[Feed]:
    """`accuracy.samples` feeds at `point` (default: the primary one), deterministic for
    `accuracy.seed`.

    Files and image folders are read as given; uniform data comes from Polygraphy's
    `DataLoader` (seeded per sample, as `polygraphy run --val-range` makes it), and
    only `normal` data, which it does not make, from numpy.
    """
    shapes = point.shapes if point is not None else check_inputs(policy, model)
    specs = {s.name: s for s in policy.inputs}
    dtypes = {n: helper.tensor_dtype_to_np_dtype(t) for n, t, _ in model_inputs(model)}
    check_memory(policy, shapes, dtypes)
    given = {
        n: _load_npz(policy, s, shapes[n], dtypes[n])
        for n, s in specs.items()
        if s.data.file is not None
    }
    given.update({n: load_images(policy, s, shapes[n]) for n, s in specs.items() if s.data.images})
    n_samples = min([policy.accuracy.samples, *(len(v) for v in given.values())])
    data = {n: specs.get(n, InputSpec(n)).data for n in shapes if n not in given}
    normal = {n for n, d in data.items() if d.distribution == "normal" and _is_float(dtypes[n])}
    uniform = _uniform(
        {n: (shapes[n], dtypes[n], data[n]) for n in data if n not in normal},
        policy.accuracy.seed,
        n_samples,
    )
    rng = np.random.default_rng(policy.accuracy.seed)
    feeds = []
    for i in range(n_samples):
        feed = {}
        for name in shapes:  # the model's input order
            if name in given:
                feed[name] = given[name][i].astype(dtypes[name], copy=False)
            elif name in normal:
                arr = rng.normal(data[name].mean, data[name].std, size=shapes[name])
                feed[name] = arr.astype(dtypes[name])
            else:
                feed[name] = np.asarray(uniform[i][name], dtype=dtypes[name])
        feeds.append(feed)
    return feeds


def _is_float(dtype) -> bool:
    return bool(np.issubdtype(dtype, np.floating))


def _uniform(inputs: dict, seed: int, n_samples: int) -> list[Feed]:
    """Polygraphy's `DataLoader` samples for the uniform inputs (none: empty feeds).

    The policy's integer range is half-open, `[low, high)` (token ids below the
    vocabulary size); Polygraphy's `val_range` is inclusive, so it gets `high - 1`.
    """
    if not inputs:
        return [{} for _ in range(n_samples)]
    from polygraphy.common import TensorMetadata
    from polygraphy.comparator import DataLoader

    meta, ranges = TensorMetadata(), {}
    for name, (shape, dtype, spec) in inputs.items():
        meta.add(name, dtype, shape)
        if _is_float(dtype):
            ranges[name] = (float(spec.low), float(spec.high))
        elif dtype == np.bool_:
            ranges[name] = (False, True)
        else:
            low = int(spec.low)
            ranges[name] = (low, max(int(spec.high) - 1, low))
    with quiet_polygraphy():  # it announces the metadata at info level
        loader = DataLoader(seed=seed, iterations=n_samples, input_metadata=meta, val_range=ranges)
        return [dict(loader[i]) for i in range(n_samples)]


def _load_npz(policy: Policy, spec: InputSpec, shape: tuple[int, ...], dtype) -> np.ndarray:
    field = f"inputs.{spec.name}.data.file"
    try:
        with np.load(spec.data.file) as data:
            if spec.name not in data:
                raise UsageError(
                    f"{field}: {spec.data.file.name} has no array '{spec.name}'",
                    where=str(policy.path),
                    hint="keys found: " + ", ".join(data.files),
                )
            arr = data[spec.name]
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"{field}: cannot read {spec.data.file}: {exc}", where=str(policy.path)
        ) from None
    arr = _checked_values(policy, field, spec, arr, np.dtype(dtype))
    if arr.shape == shape:
        return arr[None]
    if arr.shape[1:] == shape:
        return arr
    raise UsageError(
        f"{field}: array '{spec.name}' has shape {list(arr.shape)}; expected {list(shape)} "
        f"or [N, {', '.join(map(str, shape))}]",
        where=str(policy.path),
    )


def _checked_values(
    policy: Policy, field: str, spec: InputSpec, arr: np.ndarray, want
) -> np.ndarray:
    """The array in the input's dtype, or one message: a wrong kind of number, or NaN/inf.

    Converting within a kind (float64 to float32, int32 to int64) is what a
    deployment's preprocessing does; floats for an integer input or integers
    for a float one mean the file holds something else than the model expects.
    """
    kind = {"f": "floating-point", "i": "integer", "u": "integer", "b": "boolean"}
    if arr.dtype.kind not in kind or kind[arr.dtype.kind] != kind.get(want.kind):
        raise UsageError(
            f"{field}: array '{spec.name}' holds {arr.dtype} values; the model's input "
            f"'{spec.name}' takes {want} ({kind.get(want.kind, want.kind)})",
            where=str(policy.path),
            hint=f"save the array as {want} (e.g. arr.astype(np.{want}))",
        )
    if arr.dtype.kind == "f":
        bad = np.argwhere(~np.isfinite(arr))
        if bad.size:
            index = tuple(int(i) for i in bad[0])
            raise UsageError(
                f"{field}: array '{spec.name}' holds {len(bad)} NaN or infinite value(s), the "
                f"first at index {list(index)} ({arr[index]})",
                where=str(policy.path),
                hint="reference inputs must be finite; clean or regenerate the file",
            )
    return arr.astype(want, copy=False)


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def load_images(policy: Policy, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    """Images of the folder, sorted by name, as [samples, *shape] (batches of consecutive images).

    Why this preprocessing: it is what deployments of image models do (resize,
    scale to [0, 1], per-channel mean/std, NCHW or NHWC, RGB or BGR), so the
    reference data has the value ranges the engine will see in production.
    """
    img = spec.data.images
    field = f"inputs.{spec.name}.data"
    layout, (_, h, w) = _image_layout(policy, spec, shape, field)
    n, where = shape[0], str(policy.path)
    paths = sorted(p for p in img.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if len(paths) < n:
        raise UsageError(
            f"{field}.images: {img.folder} holds {len(paths)} image(s); one sample needs {n}",
            where=where,
            hint="add images (" + ", ".join(IMAGE_SUFFIXES[:4]) + ", ...)",
        )
    arrays = [
        _image(policy, spec, path, (h, w), field, layout) for path in paths[: (len(paths) // n) * n]
    ]
    stacked = np.stack(arrays).astype(np.float32)
    return stacked.reshape(len(arrays) // n, *shape)


def _image_layout(
    policy: Policy, spec: InputSpec, shape: tuple[int, ...], field: str
) -> tuple[str, tuple[int, int, int]]:
    """The layout and (channels, height, width) of an image input, or the field to fix."""
    img, where = spec.data.images, str(policy.path)
    if len(shape) != 4:
        raise UsageError(
            f"{field}.images: input '{spec.name}' has rank {len(shape)}; images need a rank-4 input",
            where=where,
            hint="use 'file' (.npz) or a distribution for this input",
        )
    layout = img.layout or _guess_layout(shape)
    if layout is None:
        raise UsageError(
            f"{field}.layout: cannot tell where the channels of {list(shape)} are",
            where=where,
            hint="add 'layout: NCHW' or 'layout: NHWC'",
        )
    c, h, w = (shape[1], shape[2], shape[3]) if layout == "NCHW" else shape[3:] + shape[1:3]
    want_c = 1 if img.channels == "GRAY" else 3
    if c != want_c:
        raise UsageError(
            f"{field}.channels: {img.channels} gives {want_c} channel(s); the input has {c} ({layout})",
            where=where,
            hint="set channels (RGB, BGR, GRAY) or layout to fit the model",
        )
    if img.resize is not None and tuple(img.resize) != (h, w):
        raise UsageError(
            f"{field}.resize: {list(img.resize)} does not fit the input's H, W = {[h, w]}",
            where=where,
            hint=f"set resize: [{h}, {w}] or change inputs.{spec.name}.shape",
        )
    for key, values in (("mean", img.mean), ("std", img.std)):
        if len(values) not in (1, c):
            raise UsageError(
                f"{field}.{key}: {len(values)} values for {c} channel(s)",
                where=where,
                hint=f"give one number or {c}",
            )
    return layout, (c, h, w)


def _image(
    policy: Policy, spec: InputSpec, path, size: tuple[int, int], field: str, layout: str
) -> np.ndarray:
    """One image, resized, scaled and normalised, in the input's layout."""
    from PIL import Image

    img, (h, w) = spec.data.images, size
    channels = 1 if img.channels == "GRAY" else 3
    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGB").resize((w, h), Image.BILINEAR)
            a = np.asarray(im, dtype=np.float32).reshape(h, w, channels)
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{field}.images: cannot read {path.name}: {exc}", where=str(policy.path)
        ) from None
    if img.channels == "BGR":
        a = a[..., ::-1]
    a = (a * img.scale - np.asarray(img.mean, np.float32)) / np.asarray(img.std, np.float32)
    return a.transpose(2, 0, 1) if layout == "NCHW" else a


def _guess_layout(shape: tuple[int, ...]) -> str | None:
    nchw, nhwc = shape[1] in (1, 3), shape[3] in (1, 3)
    if nchw != nhwc:
        return "NCHW" if nchw else "NHWC"
    return None
