"""An .npz read header first: its arrays known without inflating them, only the samples asked
for inflated, nothing unpickled."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from trtbuild.accuracy import npz


def _lying(path, shape, data: np.ndarray) -> None:
    """An .npz whose one member `x` has a header of `shape` but holds only `data`."""
    buf = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(data.dtype), "fortran_order": False}
    np.lib.format.write_array_header_1_0(buf, {**header, "shape": shape})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", buf.getvalue() + data.tobytes())


def test_a_header_is_read_without_the_data_and_only_the_samples_asked_for(tmp_path):
    """The header says 10**9 samples (4 GB); three are there: asking for them reads them."""
    path = tmp_path / "big.npz"
    _lying(path, (10**9, 1), np.arange(3, dtype=np.float32)[:, None])
    (member,) = npz.members(path).values()
    assert member.shape == (10**9, 1) and member.dtype == np.float32
    assert member.nbytes(3) == 12 and member.nbytes() == 4 * 10**9
    np.testing.assert_array_equal(npz.read(path, member, 3)[:, 0], [0, 1, 2])
    with pytest.raises(npz.NpzError, match="ends after 12 of 16 bytes"):
        npz.read(path, member, 4)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_the_first_samples_of_any_order_and_byte_order(tmp_path, save):
    c = np.arange(60, dtype=">f4").reshape(5, 3, 4)
    f = np.asfortranarray(np.arange(24.0).reshape(4, 6))
    save(tmp_path / "a.npz", c=c, f=f, s=np.array(16000, np.int64))
    found = npz.members(tmp_path / "a.npz")
    assert {k: (m.shape, m.fortran) for k, m in found.items()} == {
        "c": ((5, 3, 4), False),
        "f": ((4, 6), True),
        "s": ((), False),
    }
    np.testing.assert_array_equal(npz.read(tmp_path / "a.npz", found["c"], 2), c[:2])
    np.testing.assert_array_equal(npz.read(tmp_path / "a.npz", found["f"], 3), f[:3])
    np.testing.assert_array_equal(npz.read(tmp_path / "a.npz", found["f"]), f)
    scalar = npz.read(tmp_path / "a.npz", found["s"], 3)
    assert type(scalar) is np.ndarray and scalar.shape == () and int(scalar) == 16000


def test_an_object_array_is_listed_from_its_header_and_never_read(tmp_path):
    import dataclasses

    np.savez(tmp_path / "o.npz", o=np.array([{"a": 1}], dtype=object), x=np.zeros(2))
    found = npz.members(tmp_path / "o.npz")
    assert found["o"].objects and not found["x"].objects
    with pytest.raises(npz.NpzError, match="holds Python objects"):
        npz.read(tmp_path / "o.npz", found["o"])
    with pytest.raises(npz.NpzError, match="holds Python objects"):  # whatever it is told
        npz.read(tmp_path / "o.npz", dataclasses.replace(found["x"], name="o"))


def test_a_file_that_is_no_zip_is_an_npz_error(tmp_path):
    (tmp_path / "x.npz").write_text("not a zip")
    with pytest.raises(npz.NpzError, match=r"neither an \.npz \(a zip of arrays\) nor an \.npy"):
        npz.members(tmp_path / "x.npz")


def _npy_with_header(path, header: str) -> None:
    """A bare .npy whose header is `header` as written (numpy's own writer refuses a bad one)."""
    text = header.encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    path.write_bytes(
        np.lib.format.MAGIC_PREFIX + b"\x01\x00" + len(text).to_bytes(2, "little") + text
    )


def _zip_patched(path, offset_in_header: int, value: bytes) -> None:
    """A one-member .npz whose local and central headers get `value` at `offset_in_header`
    (2: the flags, 4: the compression method; the central one's is 2 further on)."""
    buf = io.BytesIO()
    np.save(buf, np.zeros(4, np.float32))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", buf.getvalue())
    data = bytearray(path.read_bytes())
    local, central = data.find(b"PK\x03\x04"), data.find(b"PK\x01\x02")
    for at in (local + 4 + offset_in_header, central + 6 + offset_in_header):
        data[at : at + len(value)] = value
    path.write_bytes(bytes(data))


def _deflate_garbage(path) -> None:
    """A compressed .npz whose deflate stream is garbage: zlib refuses it mid-read."""
    buf = io.BytesIO()
    np.save(buf, np.arange(4096, dtype=np.float32))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", buf.getvalue())
    data = bytearray(path.read_bytes())
    start = data.find(b"PK\x03\x04") + 30 + len("x.npy")
    data[start : start + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: _zip_patched(p, 2, b"\x01\x00"),  # encrypted: zipfile's RuntimeError
        lambda p: _zip_patched(p, 4, b"\x63\x00"),  # method 99: NotImplementedError
        _deflate_garbage,  # zlib.error
        lambda p: _npy_with_header(p, "{'descr': '<f4', b'x': 1, 'shape': (2,)}"),  # TypeError
        lambda p: _npy_with_header(p, "{'descr': '<f4', 'shape': (2,"),  # tokenize's TokenError
    ],
    ids=["encrypted", "unknown-method", "deflate-garbage", "mixed-keys", "cut-header"],
)
def test_a_damaged_file_is_an_npz_error_whatever_the_library_raises(tmp_path, damage):
    """Found by mutating the bytes of real files: zipfile, zlib and numpy's header parser
    raise more than BadZipFile and ValueError, and each ended `check` as an internal error."""
    path = tmp_path / "x.npz"
    damage(path)
    with pytest.raises(npz.NpzError):
        for member in npz.members(path).values():
            npz.read(path, member)


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_bare_npy_is_one_array_read_by_its_header_and_cut_alike(tmp_path, order):
    """ModelOpt's calibration data for a one-input model: `calib.npy`."""
    a = np.asarray(np.arange(40, dtype=np.float32).reshape(5, 2, 4), order=order)
    np.save(tmp_path / "calib.npy", a)
    (member,) = npz.members(tmp_path / "calib.npy").values()
    assert member.name == npz.BARE and member.bare and member.shape == (5, 2, 4)
    np.testing.assert_array_equal(npz.read(tmp_path / "calib.npy", member, 2), a[:2])
    np.testing.assert_array_equal(npz.read(tmp_path / "calib.npy", member), a)


def test_a_pickled_npy_is_refused_from_its_header(tmp_path):
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(npz.NpzError, match="holds Python objects"):
        npz.members(tmp_path / "o.npy")


def test_a_file_that_cannot_be_read_says_how_to_save_it_again(tmp_path, capsys):
    """A truncated or pickled .npz was named with its fault and no fix."""
    from tests.helpers import identity_policy
    from trtbuild.cli import main

    np.savez(tmp_path / "x.npz", x=np.zeros((1, 4), np.float32))
    whole = (tmp_path / "x.npz").read_bytes()
    (tmp_path / "x.npz").write_bytes(whole[: len(whole) // 2])
    path = identity_policy(tmp_path, [1, 4], "{shape: [1, 4], data: {file: x.npz}}")
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "save it again whole with numpy.save or numpy.savez" in err


def test_an_object_array_beside_the_inputs_arrays_is_left_alone(tmp_path, capsys):
    """A file's labels saved as an object array beside the input's array refused the whole
    file; an object array an input takes is still refused, naming it and the fix."""
    from tests.helpers import identity_policy
    from trtbuild.cli import main

    labels = np.array(["cat", {"id": 1}], dtype=object)
    np.savez(tmp_path / "x.npz", x=np.ones((2, 1, 4), np.float32), labels=labels)
    path = identity_policy(tmp_path, [1, 4], "{shape: [1, 4], data: {file: x.npz}}")
    assert main(["check", "--policy", str(path)]) == 0, capsys.readouterr().err
    np.savez(tmp_path / "x.npz", x=np.array([{"a": 1}], dtype=object))
    assert main(["check", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "array 'x' holds Python objects" in err and "numbers only" in err, err
