"""Image folders fit to each point: resized, or centre-cropped with mirrored padding."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tests.helpers import identity_policy
from trtbuild.accuracy.images import centre_fit, load_images
from trtbuild.errors import UsageError
from trtbuild.policy import load_policy


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


def test_an_image_past_the_pixel_limit_is_refused_before_it_is_decoded(tmp_path):
    policy, _ = _policy(tmp_path, "{images: images}", "accuracy: {max_image_pixels: 20}\n")
    with pytest.raises(UsageError, match=r"a.png has 30 pixels \(5x6\), more than") as info:
        load_images(policy, policy.inputs[0], (1, 3, 6, 5))
    assert "accuracy.max_image_pixels" in str(info.value)
