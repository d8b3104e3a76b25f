"""Reference data from an image folder, preprocessed as deployments do."""

from __future__ import annotations

import re
import textwrap

import numpy as np
import pytest
from PIL import Image

from tests.helpers import F, model, node
from trtbuild.accuracy.data import make_feeds, point_feeds
from trtbuild.cli import main
from trtbuild.errors import UsageError
from trtbuild.policy import load_policy


def _folder(tmp_path, n: int = 3, size=(6, 5)) -> tuple:
    folder = tmp_path / "images"
    folder.mkdir()
    rng = np.random.default_rng(0)
    pixels = []
    for i in range(n):
        a = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)  # H, W, RGB
        Image.fromarray(a).save(folder / f"img{i}.png")
        pixels.append(a.astype(np.float32))
    (folder / "notes.txt").write_text("not an image")
    return folder, pixels


def _policy(tmp_path, m, data: str, shape: str) -> object:
    import onnx

    onnx.save(m, tmp_path / "m.onnx")
    path = tmp_path / "p.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        version: 1
        model: m.onnx
        inputs:
          x:
            shape: {shape}
            data: {data}
        accuracy: {{samples: 8}}
        """)
    )
    return load_policy(path)


def _identity(shape):
    return model([node("Identity", ["x"], "y", "id")], [("x", F, shape)], [("y", F, shape)])


def test_images_nchw_rgb_with_mean_and_std(tmp_path):
    _, pixels = _folder(tmp_path)
    policy = _policy(
        tmp_path,
        _identity([1, 3, 6, 5]),
        "{images: images, mean: [0.5, 0.4, 0.3], std: [0.2, 0.25, 0.5]}",
        "[1, 3, 6, 5]",
    )
    feeds = make_feeds(policy, _identity([1, 3, 6, 5]))
    assert len(feeds) == 3  # three images, one per sample; the .txt is ignored
    want = (pixels[1] / 255.0 - [0.5, 0.4, 0.3]) / [0.2, 0.25, 0.5]
    np.testing.assert_allclose(feeds[1]["x"][0], want.transpose(2, 0, 1), atol=1e-6)


def test_images_nhwc_bgr_resized_caffe_style(tmp_path):
    _folder(tmp_path, n=2, size=(12, 10))
    data = "{images: images, channels: BGR, scale: 1.0, mean: [104, 117, 123], resize: [6, 5], "
    data += "fit: crop}"
    m = _identity([1, 6, 5, 3])
    feeds = make_feeds(_policy(tmp_path, m, data, "[1, 6, 5, 3]"), m)
    x = feeds[0]["x"]
    assert x.shape == (1, 6, 5, 3) and x.dtype == np.float32
    with Image.open(tmp_path / "images" / "img0.png") as im:
        rgb = np.asarray(im.resize((5, 6), Image.BILINEAR), np.float32)
    np.testing.assert_allclose(x[0], rgb[..., ::-1] - [104, 117, 123], rtol=1e-6)


def test_images_fill_a_batch_from_consecutive_files(tmp_path):
    _folder(tmp_path, n=5)
    m = _identity([2, 3, 6, 5])
    feeds = make_feeds(_policy(tmp_path, m, "{images: images}", "[2, 3, 6, 5]"), m)
    assert len(feeds) == 2 and feeds[0]["x"].shape == (2, 3, 6, 5)  # the fifth image is left over
    assert feeds[0]["x"].min() >= 0.0 and feeds[0]["x"].max() <= 1.0


def test_unsampled_feeds_say_where_data_comes_from_and_check_it(tmp_path):
    """`convert` and `check` run nothing: no sample is drawn, but the sources are the
    sampled run's, and the user's images are still checked (their errors are the same)."""
    _folder(tmp_path)
    m = _identity([1, 3, 6, 5])
    policy = _policy(tmp_path, m, "{images: images}", "[1, 3, 6, 5]")
    drawn, said = point_feeds(policy, m), point_feeds(policy, m, draw=False)
    assert len(drawn.feeds) == 3 and said.feeds == []
    assert said.data == drawn.data and said.data["x"].kind == "images"
    bad = _policy(tmp_path, m, "{images: images, channels: GRAY}", "[1, 3, 6, 5]")
    with pytest.raises(UsageError, match="channels: GRAY gives 1"):
        point_feeds(bad, m, draw=False)


@pytest.mark.parametrize(
    ("data", "shape", "message"),
    [
        ("{images: nowhere}", "[1, 3, 6, 5]", "image folder not found"),
        ("{images: images, mean: [1, 2]}", "[1, 3, 6, 5]", "mean: 2 values for 3 channel"),
        ("{images: images, channels: GRAY}", "[1, 3, 6, 5]", "channels: GRAY gives 1"),
        ("{images: images, derive: tile}", "[1, 3, 6, 5]", "'derive' applies to 'file' only"),
        (
            "{images: images}",
            "[4, 3, 6, 5]",
            "3 image(s) (not read: notes.txt); one sample needs 4",
        ),
        ("{images: images}", "[1, 8, 6, 5]", "cannot tell where the channels"),
        ("{distribution: normal, resize: [6, 5]}", "[1, 3, 6, 5]", "'resize' applies to 'images'"),
        ("{images: images, resize: [3, 3]}", "[1, 3, 6, 5]", "add 'fit: crop' to crop every"),
        ("{distribution: normal, mean: [1, 2]}", "[1, 3, 6, 5]", "mean is one number"),
        ("{images: images, file: a.npz}", "[1, 3, 6, 5]", "give one of 'file', 'distribution'"),
    ],
)
def test_bad_image_data_names_the_field(tmp_path, data, shape, message):
    """Each names the line of `data` (line 6), whether loading found it or reading the images."""
    _folder(tmp_path)
    dims = [int(d) for d in shape.strip("[]").split(",")]
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        m = _identity(dims)
        make_feeds(_policy(tmp_path, m, data, shape), m)
    assert info.value.where == f"{(tmp_path / 'p.yaml').resolve()}:6"


def test_build_from_an_image_folder(tmp_path, write_policy):
    _folder(tmp_path, n=2, size=(64, 64))
    text = write_policy().read_text()
    text = text.replace(
        "data: {distribution: uniform, low: 0.0, high: 1.0}",
        f"data: {{images: {tmp_path / 'images'}}}",
    )
    policy = tmp_path / "images.yaml"
    policy.write_text(text)
    out = tmp_path / "out"
    assert main(["build", "--policy", str(policy), "--out", str(out)]) == 0
    import json

    assert json.loads((out / "report.json").read_text())["samples"] == 2


def test_a_one_element_integer_input_takes_values_of_its_range(tmp_path):
    """Polygraphy's DataLoader feeds a shape-[1] integer input its own shape ([1]) whatever
    the range, taking it for a TensorRT shape tensor; the report said `uniform integers
    [0, 100)`. Drawn here, from that range, deterministic for the seed; a [2] one is the
    DataLoader's, as before."""
    from onnx import TensorProto

    m = model(
        [node("Gather", ["t", "k"], "e", "take"), node("Gather", ["t", "j"], "f", "take2")],
        [("k", TensorProto.INT64, [1]), ("j", TensorProto.INT64, [2])],
        [("e", F, [1]), ("f", F, [2])],
        {"t": np.arange(100, dtype=np.float32)},
    )
    import onnx

    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\naccuracy: {samples: 8}\ninputs:\n"
        "  k: {shape: [1], data: {low: 0, high: 100}}\n"
        "  j: {shape: [2], data: {low: 0, high: 100}}\n"
    )
    policy = load_policy(tmp_path / "p.yaml")
    feeds = make_feeds(policy, m)
    ks = [int(f["k"][0]) for f in feeds]
    assert all(0 <= k < 100 for k in ks) and len(set(ks)) > 2, ks
    assert all(f["k"].dtype == np.int64 and f["k"].shape == (1,) for f in feeds)
    assert [int(f["k"][0]) for f in make_feeds(policy, m)] == ks  # the same seed, the same data
    assert len({int(v) for f in feeds for v in f["j"]}) > 2


@pytest.mark.parametrize(
    ("elem", "data", "said"),
    [
        ("FLOAT16", "{low: 0, high: 1e6}", "the range [0, 1e+06) passes what the model's input"),
        ("FLOAT16", "{low: -7e4, high: 0}", "the range [-70000, 0) passes what the model's input"),
        (
            "FLOAT16",
            "{low: -65520, high: 0}",
            "the range [-65520, 0) passes what the model's input",
        ),
        ("INT32", "{low: 0, high: 1e12}", "(int32) holds (-2147483648 to 2147483647)"),
        ("UINT8", "{low: -1, high: 10}", "(uint8) holds (0 to 255)"),
        ("FLOAT16", "{distribution: normal, std: 1e6}", "normal (mean 0, std 1e+06) drew values"),
        (
            "INT64",
            "{low: 0.5, high: 2.5}",
            "is not of whole numbers: its draws would be cut to [0, 2)",
        ),
    ],
)
def test_a_range_the_inputs_type_cannot_hold_is_the_policys_fault(tmp_path, elem, data, said):
    """An FP16 input drawn up to 1e6 got inf, blamed on the model (its FP32 reference 'holds
    inf'); an int32 one up to 1e12 was Polygraphy's traceback, exit 70."""
    import onnx
    from onnx import TensorProto

    t = getattr(TensorProto, elem)
    m = model([node("Identity", ["x"], "y", "id")], [("x", t, [1, 64])], [("y", t, [1, 64])])
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        f"version: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: [1, 64]\n    data: {data}\n"
    )
    policy = load_policy(tmp_path / "p.yaml")
    with pytest.raises(UsageError, match=re.escape(said)) as info:
        make_feeds(policy, m)
    assert "p.yaml:6: inputs.x.data: " in str(info.value)
    assert info.value.where == f"{(tmp_path / 'p.yaml').resolve()}:6"
    assert point_feeds(policy, m, draw=False).feeds == []  # nothing drawn, nothing refused


def test_a_range_within_the_inputs_type_is_drawn_whole(tmp_path):
    """The bounds themselves are held: FP16's up to 65520 (where it rounds to inf; below
    it to 65504, as a file's value does), uint8's [0, 256)."""
    import onnx
    from onnx import TensorProto

    m = model(
        [node("Identity", ["x"], "y", "id"), node("Identity", ["u"], "v", "id2")],
        [("x", TensorProto.FLOAT16, [1, 64]), ("u", TensorProto.UINT8, [1, 64])],
        [("y", TensorProto.FLOAT16, [1, 64]), ("v", TensorProto.UINT8, [1, 64])],
    )
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n"
        "  x: {shape: [1, 64], data: {low: -65510, high: 65510}}\n"
        "  u: {shape: [1, 64], data: {low: 0, high: 256}}\n"
    )
    feeds = make_feeds(load_policy(tmp_path / "p.yaml"), m)
    assert all(np.isfinite(f["x"]).all() for f in feeds)
    assert max(int(f["u"].max()) for f in feeds) > 200


@pytest.mark.parametrize("elem", ["INT64", "BOOL"])
def test_a_normal_distribution_for_an_integer_input_is_exit_2(tmp_path, elem):
    """`normal` makes floats: on token ids it was dropped without a word for the default
    range [0, 1), every id 0, and the data line said "uniform integers [0, 1)"."""
    import onnx
    from onnx import TensorProto

    t = getattr(TensorProto, elem)
    m = model([node("Identity", ["x"], "y", "id")], [("x", t, [1, 8])], [("y", t, [1, 8])])
    onnx.save(m, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(
        "version: 1\nmodel: m.onnx\ninputs:\n  x:\n    shape: [1, 8]\n"
        "    data: {distribution: normal, mean: 5, std: 2}\n"
    )
    policy = load_policy(tmp_path / "p.yaml")
    for draw in (True, False):  # convert, which draws nothing, is told too
        with pytest.raises(UsageError, match=re.escape("inputs.x.data.distribution: normal")):
            point_feeds(policy, m, draw=draw)


def test_images_scaled_past_an_fp16_inputs_range_are_the_policys_fault(tmp_path):
    """`scale: 1000` on an FP16 input made pixels of up to 255000, inf once fed: the verdict
    blamed the model ("the FP32 reference holds inf"). The same images at `scale: 1` load."""
    from onnx import TensorProto

    _folder(tmp_path)
    h = TensorProto.FLOAT16
    m = model(
        [node("Identity", ["x"], "y", "id")], [("x", h, [1, 3, 6, 5])], [("y", h, [1, 3, 6, 5])]
    )
    bad = _policy(tmp_path, m, "{images: images, scale: 1000}", "[1, 3, 6, 5]")
    said = "inputs.x.data.images: the pixels times scale 1000, less mean, over std reach"
    for draw in (True, False):
        with pytest.raises(UsageError, match=re.escape(said)) as info:
            point_feeds(bad, m, draw=draw)
        assert "(float16) holds (±65504)" in str(info.value)
    feeds = make_feeds(_policy(tmp_path, m, "{images: images, scale: 1.0}", "[1, 3, 6, 5]"), m)
    assert feeds and all(f["x"].dtype == np.float16 and np.isfinite(f["x"]).all() for f in feeds)
