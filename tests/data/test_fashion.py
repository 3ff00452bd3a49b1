"""Fashion-MNIST from the Debian package: strict IDX reader, .deb reader, cache, CLI, real data."""

from __future__ import annotations

import gzip
import hashlib
import io
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.data import DataNotPreparedError, fashion, load_fashion, prepare_fashion
from flwr_fsl.data import __main__ as cli
from flwr_fsl.data.fashion import (
    FASHION_MEMBERS,
    IdxFormatError,
    read_deb_members,
    read_idx_bytes,
)
from tests.prepared_data import require_prepared

# ---------------------------------------------------------------- generated IDX files


def idx(array: np.ndarray, *, type_code: int = 0x08, ndim: int | None = None) -> bytes:
    """Encode a uint8 array as an IDX file (header, big-endian dims, payload)."""
    ndim = array.ndim if ndim is None else ndim
    dims = b"".join(struct.pack(">I", d) for d in array.shape)
    return bytes([0, 0, type_code, ndim]) + dims + array.astype(np.uint8).tobytes()


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 28, 28), dtype=np.uint8)


def test_valid_idx_roundtrip_plain_and_gzipped() -> None:
    x = _images(5)
    for blob in (idx(x), gzip.compress(idx(x))):
        out = read_idx_bytes(blob, ndim=3, dims=(None, 28, 28))
        np.testing.assert_array_equal(out, x)
        assert out.dtype == np.uint8 and out.flags.writeable
    labels = np.arange(7, dtype=np.uint8) % 10
    np.testing.assert_array_equal(read_idx_bytes(idx(labels), ndim=1, dims=(7,)), labels)


def test_empty_idx_is_valid() -> None:
    out = read_idx_bytes(idx(np.zeros((0, 28, 28), np.uint8)), ndim=3, dims=(None, 28, 28))
    assert out.shape == (0, 28, 28)


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (idx(_images(3))[:-1], "truncated"),
        (idx(_images(3))[:10], "truncated"),  # inside the dimensions
        (idx(_images(3))[:3], "truncated"),  # inside the header
        (b"", "truncated"),
        (idx(_images(3)) + b"\x00", "after the payload"),
        (b"\x01" + idx(_images(3))[1:], "magic"),
        (b"\x00\x01" + idx(_images(3))[2:], "magic"),
        (idx(_images(3), type_code=0x0D), "type code 0x0d"),  # float32 IDX
        (idx(np.zeros((3, 28, 28, 1), np.uint8)), "declares 4 dimensions"),
        (idx(np.zeros((3, 28, 27), np.uint8)), "dimension 2 is 27"),
        (idx(np.zeros((3, 32, 32), np.uint8)), "dimension 1 is 32"),
    ],
)
def test_malformed_idx_is_refused_with_the_reason(blob: bytes, match: str) -> None:
    with pytest.raises(IdxFormatError, match=match):
        read_idx_bytes(blob, ndim=3, dims=(None, 28, 28), gzipped=False)


def test_huge_declared_size_is_refused_before_allocating() -> None:
    # 2^32-1 x 2^32-1 x 28 bytes declared, 16 bytes present: refused on the header alone.
    header = bytes([0, 0, 8, 3]) + struct.pack(">III", 0xFFFFFFFF, 0xFFFFFFFF, 28)
    with pytest.raises(IdxFormatError, match="more than"):
        read_idx_bytes(header, ndim=3, gzipped=False)
    small = idx(_images(2))
    with pytest.raises(IdxFormatError, match="more than 1000 bytes"):
        read_idx_bytes(small, ndim=3, max_bytes=1000)


def test_damaged_gzip_stream_is_an_idx_error() -> None:
    blob = gzip.compress(idx(_images(4)))
    with pytest.raises(IdxFormatError, match=r"damaged|truncated"):
        read_idx_bytes(blob[: len(blob) // 2], ndim=3, dims=(None, 28, 28))
    flipped = bytearray(blob)
    flipped[-6] ^= 0xFF  # the CRC-32 trailer
    with pytest.raises(IdxFormatError, match="damaged"):
        read_idx_bytes(bytes(flipped), ndim=3, dims=(None, 28, 28))


def test_caller_mistakes_are_value_errors() -> None:
    with pytest.raises(ValueError, match="ndim"):
        read_idx_bytes(idx(_images(1)), ndim=0)
    with pytest.raises(ValueError, match="entries"):
        read_idx_bytes(idx(_images(1)), ndim=3, dims=(None, 28))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.booleans())
def test_fuzzed_idx_bytes_never_crash_the_reader(data: bytes, gz: bool) -> None:
    blob = gzip.compress(data) if gz else data
    try:
        out = read_idx_bytes(blob, ndim=2, dims=(None, 3), max_bytes=4096)
    except IdxFormatError:
        return
    assert out.ndim == 2 and out.shape[1] == 3 and out.dtype == np.uint8


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_valid_files_decode_exactly_or_fail_cleanly(data: st.DataObject) -> None:
    x = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    blob = bytearray(idx(x))
    position = data.draw(st.integers(0, len(blob) - 1))
    blob[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    try:
        out = read_idx_bytes(bytes(blob[:cut]), ndim=3, dims=(None, 3, 4), gzipped=False)
    except IdxFormatError:
        return
    assert out.shape[1:] == (3, 4)
    assert out.size == cut - 16  # exactly the declared payload, nothing more or less


def test_labels_outside_the_classes_are_refused() -> None:
    x = _images(2)
    with pytest.raises(IdxFormatError, match="label 10"):
        fashion.decode_split(gzip.compress(idx(x)), gzip.compress(idx(np.array([3, 10], np.uint8))))
    with pytest.raises(IdxFormatError, match="dimension 0 is 3"):  # counts differ
        fashion.decode_split(
            gzip.compress(idx(x)), gzip.compress(idx(np.array([1, 2, 3], np.uint8)))
        )
    with pytest.raises(IdxFormatError, match="dimension 0 is 2, expected 5"):
        fashion.decode_split(
            gzip.compress(idx(x)), gzip.compress(idx(np.array([1, 2], np.uint8))), expected=5
        )


# ---------------------------------------------------------------- a generated .deb


def _ar(members: list[tuple[str, bytes]]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, data in members:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}".encode() + b"`\n"
        assert len(header) == 60
        out += header + data + (b"\n" if len(data) % 2 else b"")
    return bytes(out)


def _tar_xz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _fake_fashion_files(n_train: int, n_test: int) -> tuple[dict[str, bytes], dict]:
    rng = np.random.default_rng(3)
    files: dict[str, bytes] = {}
    truth = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, n).astype(np.uint8)
        images, labels = FASHION_MEMBERS[split]
        files[images] = gzip.compress(idx(x), compresslevel=1)
        files[labels] = gzip.compress(idx(y), compresslevel=1)
        truth[split] = (x, y)
    return files, truth


def _fake_deb(files: dict[str, bytes]) -> bytes:
    return _ar(
        [("debian-binary", b"2.0\n"), ("control.tar.xz", b""), ("data.tar.xz", _tar_xz(files))]
    )


def test_read_deb_members_reads_files_without_extracting() -> None:
    files = {"./usr/share/a.gz": b"abc", "./usr/share/b": b"odd length"}
    out = read_deb_members(_fake_deb(files), list(files))
    assert out == files


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: b"!<arxh>\n" + d[8:], "ar magic"),
        (lambda d: d[:-5], "truncated"),
        (lambda d: d[:70], "truncated"),
        (lambda d: d[:66] + b"xx" + d[68:], "terminator"),
        (lambda d: d[:56] + b"zz" + d[58:], "non-numeric size"),
    ],
)
def test_malformed_deb_is_refused(mutate, match: str) -> None:  # type: ignore[no-untyped-def]
    deb = _fake_deb({"./usr/share/a.gz": b"abc"})
    with pytest.raises(IdxFormatError, match=match):
        read_deb_members(mutate(deb), ["./usr/share/a.gz"])


def test_deb_without_the_file_or_data_archive_is_refused() -> None:
    with pytest.raises(IdxFormatError, match="no file"):
        read_deb_members(_fake_deb({"./x": b"1"}), ["./usr/share/a.gz"])
    with pytest.raises(IdxFormatError, match="no supported data archive"):
        read_deb_members(_ar([("debian-binary", b"2.0\n")]), ["./x"])
    damaged = _ar([("debian-binary", b"2.0\n"), ("data.tar.xz", b"\xfd7zXZ\x00garbage")])
    with pytest.raises(IdxFormatError, match="damaged"):
        read_deb_members(damaged, ["./x"])


def test_deb_member_that_is_a_directory_is_refused() -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        info = tarfile.TarInfo("./usr/share/a.gz")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    deb = _ar([("data.tar.xz", buffer.getvalue())])
    with pytest.raises(IdxFormatError, match="not a regular file"):
        read_deb_members(deb, ["./usr/share/a.gz"])


def _pin_fake(monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes]) -> None:
    pins = {
        name.rsplit("/", 1)[-1]: hashlib.sha256(gzip.decompress(blob)).hexdigest()
        for name, blob in files.items()
    }
    monkeypatch.setattr(fashion, "FASHION_SHA256", pins)
    monkeypatch.setattr(fashion, "SPLIT_SIZES", {"train": 12, "test": 5})


def test_prepare_and_load_fashion_from_a_deb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, truth = _fake_fashion_files(12, 5)
    _pin_fake(monkeypatch, files)
    (tmp_path / "debs").mkdir()
    (tmp_path / "debs" / "dataset-fashion-mnist_1.0_all.deb").write_bytes(_fake_deb(files))

    path = prepare_fashion(tmp_path)
    assert path == tmp_path / "fashion.npz"
    x_train, y_train, x_test, y_test = load_fashion(tmp_path)
    assert x_train.shape == (12, 28, 28) and x_test.shape == (5, 28, 28)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    np.testing.assert_array_equal(x_train * 256, truth["train"][0])  # byte / 256, as MNIST
    np.testing.assert_array_equal(y_test, truth["test"][1])
    assert not x_train.flags.writeable
    with np.load(path, allow_pickle=False) as npz:
        assert npz["x_train"].dtype == np.uint8  # stored losslessly


def test_prepare_refuses_data_other_than_the_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, _ = _fake_fashion_files(12, 5)
    monkeypatch.setattr(fashion, "SPLIT_SIZES", {"train": 12, "test": 5})
    (tmp_path / "debs").mkdir()
    (tmp_path / "debs" / "dataset-fashion-mnist_1.0_all.deb").write_bytes(_fake_deb(files))
    with pytest.raises(IdxFormatError, match="not the pinned"):
        prepare_fashion(tmp_path)
    assert not (tmp_path / "fashion.npz").exists()


def test_prepare_refuses_a_split_of_the_wrong_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, _ = _fake_fashion_files(11, 5)
    _pin_fake(monkeypatch, files)
    (tmp_path / "debs").mkdir()
    (tmp_path / "debs" / "dataset-fashion-mnist_1.0_all.deb").write_bytes(_fake_deb(files))
    with pytest.raises(IdxFormatError, match="dimension 0 is 11, expected 12"):
        prepare_fashion(tmp_path)


def test_fetch_deb_reports_a_failing_apt_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    apt = fake_bin / "apt-get"
    apt.write_text("#!/bin/sh\necho 'E: Unable to locate package' >&2\nexit 100\n")
    apt.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake_bin))
    with pytest.raises(RuntimeError, match="Unable to locate package"):
        fashion.fetch_deb("dataset-fashion-mnist", tmp_path / "debs")
    with pytest.raises(ValueError, match="not a package name"):
        fashion.fetch_deb("../evil", tmp_path / "debs")


def test_fetch_deb_keeps_what_apt_get_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    apt = fake_bin / "apt-get"
    apt.write_text("#!/bin/sh\nprintf deb > dataset-fashion-mnist_9_all.deb\n")
    apt.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake_bin))
    deb = fashion.fetch_deb("dataset-fashion-mnist", tmp_path / "debs")
    assert deb == tmp_path / "debs" / "dataset-fashion-mnist_9_all.deb"
    assert deb.read_bytes() == b"deb"
    apt.unlink()  # a second call finds the kept file and does not run apt-get
    assert fashion.fetch_deb("dataset-fashion-mnist", tmp_path / "debs") == deb


def test_cli_prepares_fashion_and_reports_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    files, _ = _fake_fashion_files(12, 5)
    _pin_fake(monkeypatch, files)
    (tmp_path / "debs").mkdir()
    deb = tmp_path / "debs" / "dataset-fashion-mnist_1.0_all.deb"
    deb.write_bytes(_fake_deb(files)[:-100])
    assert cli.main(["prepare", "fashion", "--cache-dir", str(tmp_path)]) == 1
    assert "preparing fashion failed" in capsys.readouterr().err
    deb.write_bytes(_fake_deb(files))
    assert cli.main(["prepare", "fashion", "--cache-dir", str(tmp_path)]) == 0
    assert "fashion: prepared" in capsys.readouterr().out


def test_load_without_prepare_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(DataNotPreparedError, match="prepare fashion"):
        load_fashion(tmp_path)


# ---------------------------------------------------------------- the real prepared data


def test_prepared_fashion_cache_loads() -> None:
    require_prepared("fashion")
    x_train, y_train, x_test, y_test = load_fashion()
    assert x_train.shape == (60_000, 28, 28) and x_test.shape == (10_000, 28, 28)
    assert x_train.dtype == np.float32 and 0.0 <= x_train.min() and x_train.max() < 1.0
    assert np.bincount(y_train).tolist() == [6000] * 10  # balanced, as published
    assert np.bincount(y_test).tolist() == [1000] * 10
    # The published Fashion-MNIST training mean is 0.2860 on pixel/255 (0.2849 on pixel/256).
    assert abs(float(x_train.mean()) * 256 / 255 - 0.2860) < 1e-3
