"""Image folders fit to each point from their originals: resized, or centre-cropped with
mirrored padding; a point larger than an original says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

from tests.helpers import F, identity_policy, model, node
from trtbuild.accuracy.images import centre_fit, point_images
from trtbuild.cli import main
from trtbuild.errors import UsageError
from trtbuild.front import run_front
from trtbuild.policy import load_policy


def load_images(policy, spec, shape) -> np.ndarray:
    return point_images(policy, spec, shape)[0]


def _policy(tmp_path, data: str, extra: str = ""):
    folder = tmp_path / "images"
    folder.mkdir(exist_ok=True)
    pixels = np.arange(6 * 5 * 3, dtype=np.uint8).reshape(6, 5, 3)  # H 6, W 5
    Image.fromarray(pixels).save(folder / "a.png")
    profile = f"{{min: [1, 3, 2, 2], opt: [1, 3, 6, 5], max: [1, 3, 10, 9], data: {data}}}"
    path = identity_policy(tmp_path, [1, 3, "h", "w"], profile, extra)
    return load_policy(path), pixels.astype(np.float32) / 255.0


def test_crop_takes_the_centre_and_pads_by_mirroring(tmp_path):
    policy, pixels = _policy(tmp_path, "{images: images, fit: crop}")
    spec = policy.inputs[0]
    small = load_images(policy, spec, (1, 3, 2, 2))[0, 0]
    np.testing.assert_allclose(small, pixels[2:4, 1:3].transpose(2, 0, 1), atol=1e-6)
    big = load_images(policy, spec, (1, 3, 10, 9))[0, 0]
    assert big.shape == (3, 10, 9)
    np.testing.assert_allclose(big[:, 2:8, 2:7], pixels.transpose(2, 0, 1), atol=1e-6)
    np.testing.assert_allclose(big[:, 1, 2:7], big[:, 2, 2:7])  # mirrored, edge repeated


def test_resize_first_then_crop_keeps_that_scale(tmp_path):
    policy, _ = _policy(tmp_path, "{images: images, resize: [12, 10], fit: crop}")
    with Image.open(tmp_path / "images" / "a.png") as im:
        doubled = np.asarray(im.resize((10, 12), Image.BILINEAR), np.float32) / 255.0
    got = load_images(policy, policy.inputs[0], (1, 3, 6, 5))[0, 0]
    np.testing.assert_allclose(got, doubled[3:9, 2:7].transpose(2, 0, 1), atol=1e-6)


def test_resize_fit_brings_the_same_image_to_every_point(tmp_path):
    policy, _ = _policy(tmp_path, "{images: images}")
    for shape in ((1, 3, 2, 2), (1, 3, 6, 5), (1, 3, 10, 9)):
        with Image.open(tmp_path / "images" / "a.png") as im:
            sized = im.resize((shape[3], shape[2]), Image.BILINEAR)
        want = (np.asarray(sized, np.float32) / 255.0).transpose(2, 0, 1)[None]
        got = load_images(policy, policy.inputs[0], shape)  # [images, *shape]
        np.testing.assert_allclose(got, want[None], atol=1e-6)


def test_centre_fit_is_the_identity_at_the_image_size():
    a = np.random.default_rng(0).random((7, 4, 3), dtype=np.float32)
    assert centre_fit(a, 7, 4) is a


def test_a_folder_gone_after_loading_names_the_line_of_its_images_key(tmp_path):
    """Found when the data is read, not when the policy is: the error still names the line
    of `images` (not only the policy's path), as a loading error does."""
    import shutil

    _policy(tmp_path, "{images: images}")
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: [1, 3, 6, 5]\n    data:\n"
        "      mean: 0.5\n      images: images\n"
    )
    policy = load_policy(path)
    shutil.rmtree(tmp_path / "images")
    with pytest.raises(UsageError, match=r"inputs\.x\.data\.images: cannot list ") as info:
        load_images(policy, policy.inputs[0], (1, 3, 6, 5))
    assert info.value.where == f"{path.resolve()}:8"


def test_an_image_past_the_pixel_limit_is_refused_before_it_is_decoded(tmp_path):
    policy, _ = _policy(tmp_path, "{images: images}", "accuracy: {max_image_pixels: 20}\n")
    with pytest.raises(UsageError, match=r"a.png has 30 pixels \(5x6\), more than") as info:
        load_images(policy, policy.inputs[0], (1, 3, 6, 5))
    assert "accuracy.max_image_pixels" in str(info.value)
    assert info.value.where == f"{policy.path}:4"  # the line of the input's `images`


def test_a_point_larger_than_the_original_is_resized_from_it_and_says_upsampled(tmp_path):
    policy, _ = _policy(tmp_path, "{images: images}")
    spec = policy.inputs[0]
    _, small = point_images(policy, spec, (1, 3, 2, 2))
    assert small.kind == "images" and small.source == "images images/ resized to 2x2"
    _, big = point_images(policy, spec, (1, 3, 10, 9))
    assert big.kind == "upsampled"
    assert big.source == (
        "images images/ resized to 10x9; upsampled 1.8x from 6x5 (a.png): detail above that "
        "is not real data"
    )


def test_crop_at_a_resize_scale_says_where_a_point_is_padded(tmp_path):
    policy, _ = _policy(tmp_path, "{images: images, resize: [4, 4], fit: crop}")
    spec = policy.inputs[0]
    assert point_images(policy, spec, (1, 3, 2, 2))[1].kind == "images"  # a 6x5 image at 4x4
    _, big = point_images(policy, spec, (1, 3, 10, 9))
    assert big.kind == "padded"
    assert big.source == (
        "images images/ resized to 4x4, centre-cropped to 10x9; mirror-padded from 4x4 (a.png): "
        "the border repeats the image, it is not real data"
    )


def test_each_image_is_decoded_once_for_every_point(tmp_path, monkeypatch):
    from PIL import ImageFile

    policy, _ = _policy(tmp_path, "{images: images}")
    decoded = []  # Pillow decodes a file's pixels at its first `load`
    real_load = ImageFile.ImageFile.load

    def load(im):
        if getattr(im, "_im", None) is None:  # not decoded yet
            decoded.append(getattr(im.fp, "name", im.filename))
        return real_load(im)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    front = run_front(policy, reference="none")
    assert [r.point.name for r in front.shapes] == ["opt", "min", "max"]
    assert [Path(name).name for name in decoded] == ["a.png"]


def test_a_photo_is_held_once_as_decoded_where_its_mode_is_the_inputs(tmp_path, monkeypatch):
    """An RGB photo for an RGB input was decoded and then copied whole by `convert`: twice
    what the `samples` check counts for it. Converted only from another mode (RGBA here)."""
    policy, _ = _policy(tmp_path, "{images: images}")
    converted = []
    real_convert = Image.Image.convert
    monkeypatch.setattr(
        Image.Image,
        "convert",
        lambda im, *a, **k: converted.append(im.mode) or real_convert(im, *a, **k),
    )
    run_front(policy, reference="none")
    assert converted == []
    Image.new("RGBA", (5, 6), (1, 2, 3, 4)).save(tmp_path / "images" / "a.png")
    run_front(load_policy(policy.path), reference="none")
    assert converted == ["RGBA"]


def test_every_points_data_is_checked_against_the_budget_before_any_is_read(tmp_path, capsys):
    """A photo whose pixels fit the first point's budget was decoded for it, and only the
    larger point after it refused: the refusal comes first now, from the headers (this
    photo's data is cut short: decoding it would be another error)."""
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (1500, 1500), (200, 100, 50)).save(folder / "big.png")
    whole = (folder / "big.png").read_bytes()
    (folder / "big.png").write_bytes(whole[: len(whole) // 2])  # its header intact
    profile = (
        "{min: [1, 3, 8, 8], opt: [1, 3, 8, 8], max: [1, 3, 1024, 1024], data: {images: images}}"
    )
    path = identity_policy(
        tmp_path, [1, 3, "h", "w"], profile, "accuracy: {memory_budget: 12MiB}\n"
    )
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "accuracy.memory_budget is 12 MiB" in err and "cannot read" not in err, err
    assert f"{path.resolve()}:5: accuracy.samples: " in err, err  # `accuracy:`: samples unwritten


def test_a_static_point_larger_than_the_photo_says_so_in_every_report(tmp_path, capsys):
    _policy(tmp_path, "{images: images}")  # the 6x5 photo
    path = identity_policy(tmp_path, [1, 3, 12, 10], "{data: {images: images}}")
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    said = "upsampled 2x from 6x5 (a.png): detail above that is not real data"
    lines = capsys.readouterr().out.splitlines()
    assert "; upsampled image data)" in lines[0]
    assert f"  data at shape [1, 3, 12, 10]: images images/ resized to 12x10; {said}" in lines
    (shape,) = json.loads((out / "report.json").read_text())["shapes"]
    assert shape["data"]["x"] == {
        "kind": "upsampled",
        "source": f"images images/ resized to 12x10; {said}",
    }
    assert f"- data: images images/ resized to 12x10; {said}" in (out / "report.md").read_text()
    assert said in (out / "report.html").read_text()


def test_decoding_photos_past_the_budget_is_exit_2_before_any_is_decoded(tmp_path, capsys):
    """A 2000x2000 photo decodes to 12 MB, judged at 8x8 or not: over a 4 MiB budget."""
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (2000, 2000), (200, 100, 50)).save(folder / "big.png")
    path = identity_policy(
        tmp_path, [1, 3, 8, 8], "{data: {images: images}}", "accuracy: {memory_budget: 4MiB}\n"
    )
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "reading the data 11.4 MiB: images/ 11.4 MiB" in err
    assert "accuracy.memory_budget is 4 MiB" in err
    assert "one sample does not fit: raise accuracy.memory_budget, or use smaller images" in err


def _uint8_policy(tmp_path, data: str, dtype: int = onnx.TensorProto.UINT8) -> Path:
    """A model that takes a uint8 NHWC image and normalises it itself (Cast, /255), as
    TensorFlow and many deployed exports do, over the 6x5 photo of `_policy`."""
    _policy(tmp_path, "{images: images}")
    m = model(
        [node("Cast", ["img"], "f", "cast", to=onnx.TensorProto.FLOAT),
         node("Div", ["f", "s"], "y", "normalise")],
        [("img", dtype, [1, 6, 5, 3])],
        [("y", F, [1, 6, 5, 3])],
        {"s": np.array(255.0, np.float32)},
    )  # fmt: skip
    onnx.save(m, tmp_path / "u8.onnx")
    path = tmp_path / "u8.yaml"
    path.write_text(f"version: 1\nmodel: u8.onnx\ninputs:\n  img: {{data: {data}}}\n")
    return path


def test_an_integer_image_input_is_fed_the_pixels_themselves(tmp_path):
    """Not 1/255 of them cast back to uint8 (every pixel 0): the model sees the photo."""
    front = run_front(load_policy(_uint8_policy(tmp_path, "{images: images}")), reference="none")
    (feed,) = front.shapes[0].feeds
    with Image.open(tmp_path / "images" / "a.png") as im:
        want = np.asarray(im.convert("RGB"))[None]
    assert feed["img"].dtype == np.uint8
    np.testing.assert_array_equal(feed["img"], want)


@pytest.mark.parametrize(
    ("data", "dtype", "said"),
    [
        ("{images: images, scale: 0.5}", onnx.TensorProto.UINT8, "inputs.img.data.scale: "),
        ("{images: images, mean: 127}", onnx.TensorProto.UINT8, "inputs.img.data.mean: "),
        ("{images: images, std: [1, 2, 1]}", onnx.TensorProto.UINT8, "inputs.img.data.std: "),
        ("{images: images}", onnx.TensorProto.INT8, "is int8, which cannot hold pixels 0 to 255"),
    ],
)
def test_an_integer_image_input_refuses_what_it_cannot_hold(tmp_path, capsys, data, dtype, said):
    path = _uint8_policy(tmp_path, data, dtype)
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    assert f"{path.resolve()}:4: inputs.img.data." in err, err  # the line of its data


def test_fewer_samples_than_asked_are_said_with_the_data_that_holds_no_more(tmp_path):
    """`samples: 3` over three images at batch 2: one sample judged, the third image left
    out, and nothing said of either."""
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        Image.new("RGB", (8, 8), (40 * i, 20, 30)).save(folder / f"{i}.png")
    path = identity_policy(
        tmp_path, [2, 3, 8, 8], "{data: {images: images}}", "accuracy: {samples: 3}\n"
    )
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    report = json.loads((out / "report.json").read_text())
    said = [w for w in report["warnings"] if w.startswith("accuracy.samples is 3")]
    assert said == [
        "accuracy.samples is 3, but the data given holds fewer samples (1 at shape "
        "[2, 3, 8, 8]): inputs.x: images images/ resized to 8x8 (a sample takes whole batches)"
    ], report["warnings"]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("", "accuracy.samples is 4 (the default), but the data given holds fewer samples (1 at "),
        (
            "accuracy: {samples: 4}\n",
            "accuracy.samples is 4, but the data given holds fewer samples (1 at ",
        ),
    ],
    ids=["unwritten", "written"],
)
def test_fewer_samples_than_the_default_count_say_it_is_the_default_unless_written(
    tmp_path, extra, said
):
    """ "accuracy.samples is 4" of a policy that never wrote `samples` read as the user's own
    key: the default count is said as the default; `samples: 4` written is the user's."""
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (8, 8), (40, 20, 30)).save(folder / "0.png")
    path = identity_policy(tmp_path, [1, 3, 8, 8], "{data: {images: images}}", extra)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(path), "--out", str(out), "--backend", "none"]) == 0
    warnings = json.loads((out / "report.json").read_text())["warnings"]
    found = [w for w in warnings if w.startswith("accuracy.samples is")]
    assert len(found) == 1 and found[0].startswith(said), warnings


def test_a_multi_frame_image_held_leaves_no_file_open(tmp_path):
    """Pillow keeps a TIFF's or GIF's file open after `load` (more frames to seek); held in
    the run's decoded images, each was a descriptor until the run ended (review)."""
    import os

    from trtbuild.accuracy.images import _opened

    frame = Image.fromarray(np.zeros((8, 8, 3), np.uint8))
    frame.save(tmp_path / "two.tif", save_all=True, append_images=[frame])
    policy, _ = _policy(tmp_path, "{images: images}")
    before = len(os.listdir("/proc/self/fd"))
    held = _opened(policy, ("inputs", "x", "data"), tmp_path / "two.tif", "RGB")
    assert held.size == (8, 8) and len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize(
    "name, pixels",
    [
        ("depth.png", np.full((8, 8), 40000, np.uint16)),  # Pillow's I;16: 99% came out 255
        ("scan.tiff", np.full((8, 8), 0.5, np.float32)),  # F: came out 0
    ],
)
def test_an_image_of_samples_wider_than_8_bits_is_refused_not_clipped(
    tmp_path, capsys, name, pixels
):
    """`images` reads 0 to 255; Pillow's conversion of a 16-bit or float image clips it, and
    the build judged the clipped pixels as image data."""
    folder = tmp_path / "images"
    folder.mkdir()
    Image.fromarray(pixels).save(folder / name)
    path = identity_policy(tmp_path, [1, 1, 8, 8], "{data: {images: images, channels: GRAY}}")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{name} holds samples wider than 8 bits" in err and ".npz" in err, err
    assert f"{path.resolve()}:4: inputs.x.data.images: {name}" in err, err


def test_an_image_pillow_cannot_read_is_exit_2_at_the_line_of_its_images(tmp_path, capsys):
    """A PNG cut short (a copy interrupted) is the data's fault: exit 2 naming the file, the
    line of `images` and the fix, not an internal error."""
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (8, 8), (40, 20, 30)).save(folder / "0.png")
    (folder / "1.png").write_bytes((folder / "0.png").read_bytes()[:40])
    path = identity_policy(tmp_path, [1, 3, 8, 8], "{data: {images: images}}")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path.resolve()}:4: inputs.x.data.images: cannot read 1.png: " in err, err
    assert "save 1.png again whole" in err, err


def test_a_rank_3_input_takes_one_image_per_sample_at_each_point(tmp_path):
    """torchvision's detection models (Mask R-CNN, Keypoint R-CNN) take one `[3, H, W]`
    image; `images:` refused every input but rank 4 ("images need a rank-4 input"). Each
    sample is one image, brought to each point's H, W like a batch of one."""
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)).save(folder / name)
    profile = "{min: [3, 4, 4], opt: [3, 6, 5], max: [3, 8, 8], data: {images: images}}"
    path = identity_policy(tmp_path, [3, "h", "w"], profile, "accuracy: {samples: 2}\n")
    front = run_front(load_policy(path), reference="none")
    for point in front.shapes:
        h, w = point.point.shapes["x"][1:]
        assert [f["x"].shape for f in point.feeds] == [(3, h, w), (3, h, w)]
        for feed, name in zip(point.feeds, ("a.png", "b.png"), strict=True):
            with Image.open(folder / name) as im:
                want = np.asarray(im.resize((w, h), Image.BILINEAR), np.float32) / 255.0
            np.testing.assert_allclose(feed["x"], want.transpose(2, 0, 1), atol=1e-6)
    assert main(["check", "--policy", str(path)]) == 0


def test_photos_for_a_rank_3_input_of_other_channels_say_its_layout_as_one_image(tmp_path, capsys):
    """Photos given to a waveform `[b, 1, t]` (EnCodec's input) were refused as "the input has
    1 (NCHW)": a rank-3 input is read as one `[C, H, W]` image, and is said so."""
    (tmp_path / "images").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "images" / "a.png")
    path = identity_policy(tmp_path, [1, 1, 800], "{shape: [1, 1, 800], data: {images: images}}")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "RGB gives 3 channel(s); the input [1, 1, 800] has 1 (CHW, one image)" in err, err


def test_an_image_input_of_rank_2_is_still_refused_naming_the_ranks_taken(tmp_path, capsys):
    path = identity_policy(tmp_path, [6, 5], "{shape: [6, 5], data: {images: images}}")
    (tmp_path / "images").mkdir()
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "rank-4 input ([N, C, H, W] or [N, H, W, C]) or one image of rank 3" in err, err
