"""A folder of images as input tensors at each point's H x W, preprocessed as deployments do.

Why per point, and from the original: the engine serves every shape of its profile, and a
restoration model's statistics grow with the image; so each image is decoded once and
brought to each point's H, W straight from the original (resized, or centre-cropped with
mirrored padding to keep the pixel scale; with fit: crop, `resize` sets that scale once).
No point starts from a smaller intermediate: a matting policy judged at 1024² on a 512²
image blown up passed at 0.0200 and was 0.053 off on the same photo at full size. Where a
point is still larger than an original, its data says so (`upsampled 2x from 512x512`,
`mirror-padded from ...`), in the verdict, the reports and the history.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trtbuild import words
from trtbuild.accuracy.points import InputData
from trtbuild.errors import UsageError
from trtbuild.numerics import holds, not_held
from trtbuild.policy.model import Policy
from trtbuild.policy.specs import InputSpec

if TYPE_CHECKING:
    from PIL import Image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def image_paths(
    policy: Policy, spec: InputSpec, per_sample: int, count: int | None = None
) -> list[Path]:
    """The folder's images, sorted by name: whole samples of `per_sample` each, at most
    `accuracy.samples` (and `count`) of them (no image is decoded that no sample uses)."""
    at = ("inputs", spec.name, "data", "images")
    img, field = spec.data.images, words.field(*at)
    try:
        files = sorted(p for p in img.folder.iterdir() if p.is_file())
    except OSError as exc:
        raise UsageError(
            f"{field}: cannot list {img.folder}: {exc.strerror or exc}", where=policy.where_of(*at)
        ) from None
    paths = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if len(paths) < per_sample:
        others = [p.name for p in files if p.suffix.lower() not in IMAGE_SUFFIXES]
        skipped = f" (not read: {', '.join(others[:3])}{', ...' if len(others) > 3 else ''})"
        raise UsageError(
            f"{field}: {img.folder} holds {len(paths)} image(s){skipped if others else ''}; "
            f"one sample needs {per_sample}",
            where=policy.where_of(*at),
            hint="add images of a type trtbuild reads: " + ", ".join(IMAGE_SUFFIXES),
        )
    samples = min(len(paths) // per_sample, policy.accuracy.samples, count or len(paths))
    return paths[: samples * per_sample]


@dataclass(frozen=True)
class Source:
    """One image as every point starts from it: decoded once, converted to the input's
    channels and, with `resize` (fit: crop), scaled once to that pixel scale."""

    name: str
    original: tuple[int, int]  # (H, W) as the file holds it
    base: Image.Image  # what each point is fit from: the original, or it at `resize`


class Decoded:
    """The images of one run, each decoded once and kept for every point.

    Why a value the caller holds: each point brings the same original to its own
    H x W, so a 1024² point never starts from the pixels of a 512² one, and a
    photo is not decoded again for every point of the profile.
    """

    def __init__(self) -> None:
        self._sources: dict[tuple, Source] = {}
        self._sizes: dict[Path, tuple[int, int]] = {}  # (W, H) from each header

    def nbytes(self, policy: Policy, spec: InputSpec, paths: list[Path]) -> int:
        """What decoding `paths` holds, from their headers alone (each image's pixel count
        checked there, before anything is decoded): the original and its `resize`."""
        from PIL import Image

        img, at = spec.data.images, ("inputs", spec.name, "data")
        channels = 1 if img.channels == "GRAY" else 3
        scaled = img.resize[0] * img.resize[1] if img.fit == "crop" and img.resize else 0
        total = 0
        for path in paths:
            if path not in self._sizes:
                try:
                    with Image.open(path) as im:
                        self._sizes[path] = im.size
                except (Image.DecompressionBombError, OSError, ValueError) as exc:
                    raise _unreadable(policy, at, path, exc) from None
            w, h = self._sizes[path]
            _check_pixels(policy, at, path, (w, h))
            total += (w * h + scaled) * channels
        return total

    def source(self, policy: Policy, spec: InputSpec, path: Path, at: tuple[str, ...]) -> Source:
        """`path` decoded once for every point (`at`: the policy field its errors name)."""
        img = spec.data.images
        key = (path, img.channels == "GRAY", img.resize if img.fit == "crop" else None)
        if key not in self._sources:
            self._sources[key] = _decode(policy, spec, path, at)
        return self._sources[key]


@dataclass(frozen=True)
class _Fitted:
    """How one image met one point: upsampled by `factor` (> 1), mirror-padded from `padded`."""

    name: str
    original: tuple[int, int]
    factor: float
    padded: tuple[int, int] | None


def point_images(
    policy: Policy,
    spec: InputSpec,
    shape: tuple[int, ...],
    decoded: Decoded | None = None,
    count: int | None = None,
    dtype=np.float32,
) -> tuple[np.ndarray, InputData]:
    """The folder's images as [samples, *shape] (batches of consecutive images; at most
    `count` samples), each brought to this point's H x W from its original, and how
    (upsampled or padded said plainly)."""
    at = ("inputs", spec.name, "data")
    layout, (_, h, w) = image_layout(policy, spec, shape, at, dtype)
    raw = not np.issubdtype(dtype, np.floating)  # an integer input: the pixels, 0 to 255
    decoded = decoded if decoded is not None else Decoded()
    arrays, fitted = [], []
    per_sample = images_per_sample(shape)
    for path in image_paths(policy, spec, per_sample, count):
        source = decoded.source(policy, spec, path, at)
        a, how = _fit(spec, source, (h, w))
        arrays.append(_normalised(spec, a, layout, raw))
        fitted.append(how)
    stacked = np.stack(arrays).astype(dtype if raw else np.float32, copy=False)
    if not raw:
        _held(policy, spec, stacked, np.dtype(dtype), at)
    return stacked.reshape(len(arrays) // per_sample, *shape), _said(spec, (h, w), fitted)


def _held(
    policy: Policy, spec: InputSpec, pixels: np.ndarray, dtype: np.dtype, at: tuple[str, ...]
) -> None:
    """Exit 2 where the normalised pixels pass what a float input's type holds (FP16's 65504,
    from 65520 on: below it they round to 65504).

    Why: `scale: 1000` on an FP16 input made pixels of 255000, inf once fed, and the verdict
    blamed the model ("the FP32 reference holds inf: a broken checkpoint's weights?").
    """
    if not_held(pixels, dtype).any():  # below 65520 a pixel rounds to 65504, as a file's does
        peak = float(np.abs(pixels).max())
        scale = "1/255" if spec.data.images.scale is None else f"{spec.data.images.scale:g}"
        raise UsageError(
            f"{words.field(*at, 'images')}: the pixels times scale {scale}, less mean, over "
            f"std reach {peak:.6g}, past what the model's input '{spec.name}' ({dtype}) holds "
            f"({holds(dtype)})",
            where=policy.where_of(*at, "images"),
            hint="give the scale, mean and std the model's preprocessing uses",
        )


def _fit(spec: InputSpec, source: Source, size: tuple[int, int]) -> tuple[np.ndarray, _Fitted]:
    """One image at `size` from its source: resized from the original, or centre-cropped."""
    from PIL import Image

    img, (h, w), base = spec.data.images, size, source.base
    h0, w0 = source.original
    channels = 1 if img.channels == "GRAY" else 3
    if img.fit == "resize":
        sized = base if base.size == (w, h) else base.resize((w, h), Image.BILINEAR)
        a = np.asarray(sized, dtype=np.float32).reshape(h, w, channels)
        return a, _Fitted(source.name, (h0, w0), max(h / h0, w / w0), None)
    bh, bw = base.height, base.width  # cropped as `centre_fit` crops, before it is float
    top, left = max(0, (bh - h) // 2), max(0, (bw - w) // 2)
    box = (left, top, left + min(w, bw), top + min(h, bh))
    kept = base if box == (0, 0, bw, bh) else base.crop(box)
    a = np.asarray(kept, dtype=np.float32).reshape(kept.height, kept.width, channels)
    factor = max(base.height / h0, base.width / w0)
    padded = (base.height, base.width) if h > base.height or w > base.width else None
    return centre_fit(a, h, w), _Fitted(source.name, (h0, w0), factor, padded)


def _said(spec: InputSpec, size: tuple[int, int], fitted: list[_Fitted]) -> InputData:
    """`images portraits/ resized to 1024x1024; upsampled 2x from 512x512 (astronaut.png):
    detail above that is not real data`: how the images met the point, its made-up part named."""
    img, (h, w) = spec.data.images, size
    if img.fit == "resize":
        how = f"resized to {h}x{w}"
    else:
        first = f"resized to {img.resize[0]}x{img.resize[1]}, " if img.resize else ""
        how = f"{first}centre-cropped to {h}x{w}"
    text, kind = f"images {img.folder.name}/ {how}", "images"
    up = [f for f in fitted if f.factor > 1.0]
    if up:
        worst = max(up, key=lambda f: f.factor)
        some = f"{len(up)} of {len(fitted)} images " if len(fitted) > 1 else ""
        most = " up to" if len(up) > 1 else ""
        text += (
            f"; {some}upsampled{most} {_times(worst.factor)}x from {_hw(worst.original)} "
            f"({worst.name}): detail above that is not real data"
        )
        kind = "upsampled"
    pad = [f for f in fitted if f.padded is not None]
    if pad:
        worst = min(pad, key=lambda f: f.padded[0] * f.padded[1])
        some = f"{len(pad)} of {len(fitted)} images " if len(fitted) > 1 else ""
        text += (
            f"; {some}mirror-padded from {_hw(worst.padded)} ({worst.name}): the border "
            "repeats the image, it is not real data"
        )
        kind = "upsampled" if up else "padded"
    return InputData(kind, text)


def _times(factor: float) -> str:
    """`2`, `1.71`, `1.004`: enough digits that a factor above 1 never reads as 1."""
    for digits in (2, 3, 4, 6):
        text = f"{factor:.{digits}f}".rstrip("0").rstrip(".")
        if text != "1":
            return text
    return text


def _hw(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def image_layout(
    policy: Policy, spec: InputSpec, shape: tuple[int, ...], at: tuple[str, ...], dtype=np.float32
) -> tuple[str, tuple[int, int, int]]:
    """The layout and (channels, height, width) of an image input, or the field to fix (`at`:
    the input's `data`)."""
    img = spec.data.images
    if not np.issubdtype(dtype, np.floating):
        _raw_pixels(policy, spec, np.dtype(dtype), at)
    if len(shape) not in (3, 4):
        raise UsageError(
            f"{words.field(*at, 'images')}: input '{spec.name}' has rank {len(shape)}; images "
            "need a rank-4 input ([N, C, H, W] or [N, H, W, C]) or one image of rank 3",
            where=policy.where_of(*at, "images"),
            hint="use 'file' (.npz) or a distribution for this input",
        )
    batched = shape if len(shape) == 4 else (1, *shape)  # [C, H, W]: a batch of one
    layout = img.layout or guess_layout(batched)
    if layout is None:
        raise UsageError(
            f"{words.field(*at, 'layout')}: cannot tell where the channels of {list(shape)} are",
            where=policy.where_of(*at, "layout"),
            hint="add 'layout: NCHW' or 'layout: NHWC' (for a rank-3 input, [C, H, W] or "
            "[H, W, C])",
        )
    c, h, w = _chw(batched, layout)
    want_c = 1 if img.channels == "GRAY" else 3
    if c != want_c:  # a rank-3 input is one image: its layout said without the batch
        shown = layout if len(shape) == 4 else f"{layout[1:]}, one image"
        raise UsageError(
            f"{words.field(*at, 'channels')}: {img.channels} gives {want_c} channel(s); the input "
            f"{list(shape)} has {c} ({shown})",
            where=policy.where_of(*at, "channels"),
            hint="set channels (RGB, BGR, GRAY) or layout to fit the model",
        )
    for key, values in (("mean", img.mean), ("std", img.std)):
        if len(values) not in (1, c):
            raise UsageError(
                f"{words.field(*at, key)}: {len(values)} values for {c} channel(s)",
                where=policy.where_of(*at, key),
                hint=f"give one number or {c}",
            )
    return layout, (c, h, w)


def images_per_sample(shape: tuple[int, ...]) -> int:
    """How many images one sample of an image input takes: its batch, or one where the input
    is a single image of rank 3 (`[C, H, W]`, as torchvision's detection models take it)."""
    return shape[0] if len(shape) == 4 else 1


def _raw_pixels(policy: Policy, spec: InputSpec, dtype: np.dtype, at: tuple[str, ...]) -> None:
    """An integer input (a uint8 image the model normalises itself) takes the pixels as they
    are: a scale, mean or std would make fractions it cannot hold, and a type that cannot hold
    0 to 255 would wrap them."""
    img = spec.data.images
    if not np.issubdtype(dtype, np.integer) or np.iinfo(dtype).max < 255:  # bool, int8
        raise UsageError(
            f"{words.field(*at, 'images')}: input '{spec.name}' is {dtype.name}, which cannot hold "
            "pixels 0 to 255",
            where=policy.where_of(*at, "images"),
            hint="use 'file' (.npz) of the values the model takes, or a distribution",
        )
    given = {
        "scale": img.scale not in (None, 1.0),
        "mean": any(img.mean),
        "std": any(v != 1.0 for v in img.std),
    }
    key = next((k for k, changes in given.items() if changes), None)
    if key is not None:
        raise UsageError(
            f"{words.field(*at, key)}: input '{spec.name}' is {dtype.name}: the pixels are fed as "
            "they are (0 to 255), and a scale, mean or std would make fractions it cannot hold",
            where=policy.where_of(*at, key),
            hint=f"remove {key} (the model normalises the pixels itself)",
        )


def _chw(shape: tuple[int, ...], layout: str) -> tuple[int, int, int]:
    return (shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2])


def _normalised(spec: InputSpec, a: np.ndarray, layout: str, raw: bool) -> np.ndarray:
    """[H, W, C] pixels scaled and normalised (`raw`: as they are, for an integer input), in
    the input's channel order and layout."""
    img = spec.data.images
    if img.channels == "BGR":
        a = a[..., ::-1]
    if not raw:
        scale = 1.0 / 255.0 if img.scale is None else img.scale
        a = (a * scale - np.asarray(img.mean, np.float32)) / np.asarray(img.std, np.float32)
    return a.transpose(2, 0, 1) if layout == "NCHW" else a


def _decode(policy: Policy, spec: InputSpec, path: Path, at: tuple[str, ...]) -> Source:
    """The image decoded (after its pixel count is checked) in the input's channels, and with
    `resize` under fit: crop, scaled once from the original to that pixel scale."""
    from PIL import Image

    img = spec.data.images
    base = _opened(policy, at, path, "L" if img.channels == "GRAY" else "RGB")
    original = (base.height, base.width)
    if img.fit == "crop" and img.resize is not None:
        base = base.resize((img.resize[1], img.resize[0]), Image.BILINEAR)
    return Source(path.name, original, base)


# Pillow's modes of samples wider than 8 bits ("I;16", "I;16B", "I", "F"): `convert` to
# "L" or "RGB" clips them to 255
WIDE_MODES = ("I", "F")


def _opened(policy: Policy, at: tuple[str, ...], path: Path, mode: str) -> Image.Image:
    """The image read whole in `mode` (its pixel count checked first), held once: converted
    only where the file's mode is another (a copy of an RGB photo as RGB doubled what
    decoding holds, past what the `samples` check counts for it). The file is ours to
    close: Pillow keeps a multi-frame one (TIFF, GIF, a camera's MPO) open after `load`."""
    from PIL import Image

    try:
        with open(path, "rb") as f:  # Pillow does not close a file it was handed
            im = Image.open(f)
            _check_pixels(policy, at, path, im.size)
            im.load()  # the pixels read while the file is open
    except (Image.DecompressionBombError, OSError, ValueError) as exc:
        raise _unreadable(policy, at, path, exc) from None
    if im.mode.startswith(WIDE_MODES):
        raise UsageError(
            f"{words.field(*at, 'images')}: {path.name} holds samples wider than 8 bits "
            f"(Pillow's mode {im.mode}: 16-bit, 32-bit or float), which `images` reads as 0 to "
            "255: Pillow's conversion would clip them (a 16-bit PNG came out 99% white, a float "
            "TIFF black)",
            where=policy.where_of(*at, "images"),
            hint=f"save {path.name} as an 8-bit image, or give the pixels the model takes as "
            "an .npz (`data: {file: X.npz}`)",
        )
    return im if im.mode == mode else im.convert(mode)


def _unreadable(policy: Policy, at: tuple[str, ...], path: Path, exc: Exception) -> UsageError:
    from PIL import Image

    where = policy.where_of(*at, "images")
    if isinstance(exc, Image.DecompressionBombError):
        return UsageError(
            f"{words.field(*at, 'images')}: {path.name} is refused by Pillow: {exc}",
            where=where,
            hint="downscale the image; Pillow decodes no image past twice its limit",
        )
    return UsageError(
        f"{words.field(*at, 'images')}: cannot read {path.name}: {exc}",
        where=where,
        hint=f"save {path.name} again whole (PNG, JPEG, ...), or move it out of the folder",
    )


def _check_pixels(policy: Policy, at: tuple[str, ...], path: Path, size: tuple[int, int]) -> None:
    """An image larger than `accuracy.max_image_pixels` is refused before it is decoded."""
    limit, count = policy.accuracy.max_image_pixels, size[0] * size[1]
    if count > limit:
        raise UsageError(
            f"{words.field(*at, 'images')}: {path.name} has {count:,} pixels "
            f"({size[0]}x{size[1]}), more than "
            f"accuracy.max_image_pixels {limit:,}",
            where=policy.where_of(*at, "images"),
            hint="downscale the image, or raise accuracy.max_image_pixels if you trust it",
        )


def centre_fit(a: np.ndarray, h: int, w: int) -> np.ndarray:
    """[H, W, C] centre-cropped to h x w, mirrored outward where it is smaller (no new edges)."""
    out = a
    for axis, want in ((0, h), (1, w)):
        have = out.shape[axis]
        if have > want:
            start = (have - want) // 2
            out = np.take(out, range(start, start + want), axis=axis)
        elif have < want:
            before = (want - have) // 2
            pad = [(0, 0)] * out.ndim
            pad[axis] = (before, want - have - before)
            out = np.pad(out, pad, mode="symmetric")
    return out


def guess_layout(shape: tuple[int, ...]) -> str | None:
    nchw, nhwc = shape[1] in (1, 3), shape[3] in (1, 3)
    if nchw != nhwc:
        return "NCHW" if nchw else "NHWC"
    return None
