"""Fashion-MNIST, read offline from Debian's ``dataset-fashion-mnist`` package, cached as ``.npz``.

Fashion-MNIST (Zalando, MIT/Expat licence) reaches this machine inside a Debian package, not a
Python wheel: :func:`prepare_fashion` runs ``apt-get download dataset-fashion-mnist`` (no root
needed: the ``.deb`` lands in a temporary folder and is kept under ``root / "debs"``), reads the
package's ``data.tar.*`` out of the ``ar`` archive with :mod:`tarfile` (nothing is installed nor
extracted to disk), and decodes the four gzip'd IDX files under
``/usr/share/datasets/fashion-mnist/``. The IDX reader is strict: it checks the magic (two
zero bytes, type ``0x08`` = unsigned byte, the number of dimensions), every dimension and the
total size against a limit *before* allocating, and then that the payload has exactly that many
bytes — a truncated or padded file, a wrong type or wrong dimensions raise
:class:`IdxFormatError` with the reason. The decoded content of each file is checked against a
pinned SHA-256, so a changed package cannot silently change the data.

The cache ``fashion.npz`` holds the official 60,000/10,000 split as ``uint8`` images
``(N, 28, 28)`` and ``int64`` labels in ``0..9`` (:data:`FASHION_CLASSES`). :func:`load_fashion`
has the shape of :func:`~flwr_fsl.data.load_mnist`: float32 images ``byte / 256`` in ``[0, 1)``
(the same scale as MNIST, so one model and one normalization serve both) and int64 labels.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from ._cache import atomic_savez, cache_dir, load_image_split, require_cached

__all__ = [
    "FASHION_CLASSES",
    "FASHION_MEMBERS",
    "FASHION_PACKAGE",
    "IdxFormatError",
    "fashion_path",
    "fetch_deb",
    "load_fashion",
    "prepare_fashion",
    "read_deb_members",
    "read_idx",
    "read_idx_bytes",
]

FASHION_PACKAGE = "dataset-fashion-mnist"
FASHION_FILE = "fashion.npz"
FASHION_DIR = "./usr/share/datasets/fashion-mnist/"
# split -> (images member, labels member) inside the package's data archive.
FASHION_MEMBERS: dict[str, tuple[str, str]] = {
    "train": (
        FASHION_DIR + "train-images-idx3-ubyte.gz",
        FASHION_DIR + "train-labels-idx1-ubyte.gz",
    ),
    "test": (
        FASHION_DIR + "t10k-images-idx3-ubyte.gz",
        FASHION_DIR + "t10k-labels-idx1-ubyte.gz",
    ),
}
# SHA-256 of each *decompressed* IDX file (Debian bookworm's 0.0~git20200523.55506a9-1; hashed
# after gunzip so a recompressed package with the same data still passes).
FASHION_SHA256: dict[str, str] = {
    "train-images-idx3-ubyte.gz": (
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"
    ),
    "train-labels-idx1-ubyte.gz": (
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"
    ),
    "t10k-images-idx3-ubyte.gz": (
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"
    ),
    "t10k-labels-idx1-ubyte.gz": (
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"
    ),
}
SPLIT_SIZES = {"train": 60_000, "test": 10_000}
FASHION_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
NUM_CLASSES = len(FASHION_CLASSES)
IMAGE_SHAPE = (28, 28)

IDX_UBYTE = 0x08
MAX_IDX_BYTES = 1 << 28  # 256 MiB of payload: far above Fashion-MNIST's 47 MB
MAX_MEMBER_BYTES = 1 << 27  # one gzip'd member of the .deb
_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60


class Readable(Protocol):
    """A binary stream: anything with ``read(size) -> bytes`` (file, GzipFile, BytesIO)."""

    def read(self, size: int = -1, /) -> bytes:
        """Read at most ``size`` bytes."""
        ...


class IdxFormatError(ValueError):
    """An IDX file (or the archive carrying it) is malformed: wrong magic, dims or length."""


# ------------------------------------------------------------------------------ IDX reader


def _read_exact(stream: Readable, size: int, what: str) -> bytes:
    """Read exactly ``size`` bytes or raise :class:`IdxFormatError` naming ``what``."""
    try:
        data = stream.read(size)
    except (EOFError, OSError, zlib.error) as err:  # gzip: truncated or corrupt stream
        raise IdxFormatError(f"IDX {what}: the compressed stream is damaged ({err})") from err
    if len(data) != size:
        raise IdxFormatError(f"IDX {what} is truncated: {len(data)} of {size} bytes")
    return data


def read_idx(  # noqa: C901
    stream: Readable,
    *,
    ndim: int,
    dims: tuple[int | None, ...] | None = None,
    max_bytes: int = MAX_IDX_BYTES,
) -> NDArray[np.uint8]:
    """Read one unsigned-byte IDX array from a binary stream, strictly.

    The header is ``0x00 0x00 0x08 ndim`` then ``ndim`` big-endian ``uint32`` dimensions; the
    payload is the ``prod(dims)`` bytes in C order, and nothing may follow it.

    Parameters
    ----------
    stream : Readable
        A readable binary stream (a file, :class:`gzip.GzipFile` or :class:`io.BytesIO`).
    ndim : int
        The number of dimensions the file must declare (1 for labels, 3 for images).
    dims : tuple of (int or None), optional
        Expected dimensions, ``None`` for "any"; e.g. ``(None, 28, 28)``.
    max_bytes : int
        Largest payload accepted; a larger declared size is refused before any allocation.

    Returns
    -------
    numpy.ndarray
        ``uint8`` array of shape ``dims``.

    Raises
    ------
    IdxFormatError
        On a wrong magic, type code or number of dimensions, an unexpected dimension, a
        declared size above ``max_bytes``, a short payload or trailing bytes.
    ValueError
        If ``ndim`` or ``dims`` are inconsistent (a caller's mistake).
    """
    if isinstance(ndim, bool) or not isinstance(ndim, int) or not 1 <= ndim <= 255:
        raise ValueError(f"ndim must be an int in [1, 255], got {ndim!r}")
    if dims is not None and len(dims) != ndim:
        raise ValueError(f"dims {dims} must have ndim={ndim} entries")
    header = _read_exact(stream, 4, "header")
    if header[0] != 0 or header[1] != 0:
        raise IdxFormatError(f"not an IDX file: magic starts with {header[:2].hex()}, not 0000")
    if header[2] != IDX_UBYTE:
        raise IdxFormatError(f"IDX type code 0x{header[2]:02x} is not 0x08 (unsigned byte)")
    if header[3] != ndim:
        raise IdxFormatError(f"IDX file declares {header[3]} dimensions, expected {ndim}")
    raw_dims = _read_exact(stream, 4 * ndim, "dimensions")
    shape = tuple(int(d) for d in np.frombuffer(raw_dims, dtype=">u4"))
    if dims is not None:
        for axis, (got, want) in enumerate(zip(shape, dims, strict=True)):
            if want is not None and got != want:
                raise IdxFormatError(
                    f"IDX dimension {axis} is {got}, expected {want} (shape {shape})"
                )
    size = 1
    for d in shape:
        size *= d
        if size > max_bytes:
            raise IdxFormatError(f"IDX shape {shape} declares more than {max_bytes} bytes")
    payload = _read_exact(stream, size, f"payload of shape {shape}")
    if _read_exact_or_empty(stream):
        raise IdxFormatError(f"IDX file has bytes after the payload of shape {shape}")
    return np.frombuffer(payload, dtype=np.uint8).reshape(shape).copy()


def _read_exact_or_empty(stream: Readable) -> bool:
    """Return True if the stream holds at least one more byte (gzip errors raise)."""
    try:
        return bool(stream.read(1))
    except (EOFError, OSError, zlib.error) as err:
        raise IdxFormatError(f"IDX: the compressed stream is damaged ({err})") from err


def read_idx_bytes(
    data: bytes,
    *,
    ndim: int,
    dims: tuple[int | None, ...] | None = None,
    gzipped: bool | None = None,
    max_bytes: int = MAX_IDX_BYTES,
) -> NDArray[np.uint8]:
    """Read one IDX array from bytes, gzip'd or not (see :func:`read_idx`).

    Parameters
    ----------
    data : bytes
        The file's bytes.
    ndim, dims, max_bytes
        As in :func:`read_idx`.
    gzipped : bool, optional
        Whether ``data`` is gzip'd; detected from the gzip magic ``1f 8b`` if None.

    Returns
    -------
    numpy.ndarray
        The ``uint8`` array.

    Raises
    ------
    IdxFormatError
        If the bytes are not one valid IDX file of the expected shape.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if gzipped is None:
        gzipped = data[:2] == b"\x1f\x8b"
    if gzipped:
        with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as stream:
            return read_idx(stream, ndim=ndim, dims=dims, max_bytes=max_bytes)
    return read_idx(io.BytesIO(data), ndim=ndim, dims=dims, max_bytes=max_bytes)


def decode_split(
    images_gz: bytes, labels_gz: bytes, *, expected: int | None = None
) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
    """Decode one split's gzip'd IDX images ``(N, 28, 28)`` and labels ``(N,)``.

    Parameters
    ----------
    images_gz, labels_gz : bytes
        The gzip'd IDX files.
    expected : int, optional
        The number of examples the split must have.

    Returns
    -------
    tuple
        ``(images uint8 (N, 28, 28), labels int64 (N,))``.

    Raises
    ------
    IdxFormatError
        If a file is malformed, the counts differ, or a label is outside ``0..9``.
    """
    count = expected
    images = read_idx_bytes(images_gz, ndim=3, dims=(count, *IMAGE_SHAPE), gzipped=True)
    labels = read_idx_bytes(labels_gz, ndim=1, dims=(images.shape[0],), gzipped=True)
    if labels.size and int(labels.max()) >= NUM_CLASSES:
        raise IdxFormatError(f"label {int(labels.max())} is outside 0..{NUM_CLASSES - 1}")
    return images, labels.astype(np.int64)


# ------------------------------------------------------------------------------ the .deb


def _ar_members(data: bytes) -> dict[str, tuple[int, int]]:
    """Parse a (common-format) ``ar`` archive: member name -> (offset, size), strictly."""
    if not data.startswith(_AR_MAGIC):
        raise IdxFormatError("not a Debian package: the ar magic '!<arch>' is missing")
    members: dict[str, tuple[int, int]] = {}
    pos = len(_AR_MAGIC)
    while pos < len(data):
        if pos + _AR_HEADER > len(data):
            raise IdxFormatError(f"ar header at byte {pos} is truncated")
        header = data[pos : pos + _AR_HEADER]
        if header[58:60] != b"`\n":
            raise IdxFormatError(f"ar header at byte {pos} has a bad terminator")
        name = header[0:16].decode("ascii", errors="replace").rstrip(" ").rstrip("/")
        size_field = header[48:58].strip()
        if not size_field.isdigit():
            raise IdxFormatError(f"ar member {name!r} has a non-numeric size {size_field!r}")
        size = int(size_field)
        start = pos + _AR_HEADER
        if start + size > len(data):
            raise IdxFormatError(f"ar member {name!r} is truncated ({size} bytes declared)")
        if name in members:
            raise IdxFormatError(f"ar member {name!r} appears twice")
        members[name] = (start, size)
        pos = start + size + (size & 1)  # members are 2-byte aligned
    return members


def read_deb_members(deb: Path | bytes, names: list[str]) -> dict[str, bytes]:
    """Read regular files out of a ``.deb``'s data archive, without installing or extracting it.

    Parameters
    ----------
    deb : Path or bytes
        The package file, or its bytes.
    names : list of str
        Member paths as the data archive spells them (``"./usr/share/..."``).

    Returns
    -------
    dict
        ``name -> content`` for every requested name.

    Raises
    ------
    IdxFormatError
        If the package is malformed, has no ``data.tar.{xz,gz,bz2}`` or lacks a requested
        regular file, or a member exceeds the size limit.
    """
    data = deb if isinstance(deb, bytes) else Path(deb).read_bytes()
    members = _ar_members(data)
    tar_name = next(
        (n for n in ("data.tar.xz", "data.tar.gz", "data.tar.bz2", "data.tar") if n in members),
        None,
    )
    if tar_name is None:
        raise IdxFormatError(f"package has no supported data archive (members: {list(members)})")
    start, size = members[tar_name]
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data[start : start + size]), mode="r:*") as tar:
            for name in names:
                try:
                    info = tar.getmember(name)
                except KeyError:
                    raise IdxFormatError(f"package has no file {name!r}") from None
                if not info.isreg():
                    raise IdxFormatError(f"{name!r} in the package is not a regular file")
                if info.size > MAX_MEMBER_BYTES:
                    raise IdxFormatError(f"{name!r} is {info.size} bytes, over the limit")
                handle = tar.extractfile(info)
                if handle is None:  # pragma: no cover - regular files always have one
                    raise IdxFormatError(f"{name!r} cannot be read")
                out[name] = handle.read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise IdxFormatError(f"the package's {tar_name} is damaged ({err})") from err
    return out


def fetch_deb(package: str, dest: Path) -> Path:
    """Download one Debian package with ``apt-get download`` unless it is already in ``dest``.

    ``apt-get download`` needs no root: it writes into a temporary working folder, and the
    ``.deb`` is then moved into ``dest`` so later preparations reuse it.

    Parameters
    ----------
    package : str
        The package name (``name`` or ``name=version``).
    dest : Path
        The folder the ``.deb`` is kept in.

    Returns
    -------
    Path
        The ``.deb`` file.

    Raises
    ------
    RuntimeError
        If ``apt-get`` is missing or fails, or produces no ``.deb``.
    """
    name = package.split("=", 1)[0]
    if not name or any(c in name for c in "/ \t\n"):
        raise ValueError(f"not a package name: {package!r}")
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"{name}_*.deb"))
    if found:
        return found[-1]
    with tempfile.TemporaryDirectory(prefix="flwr-fsl-deb-") as tmp:
        cmd = ["apt-get", "download", "-q", package]
        try:
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise RuntimeError(
                f"apt-get is not available: download the {name} .deb yourself and put it in {dest}"
            ) from None
        debs = sorted(Path(tmp).glob(f"{name}_*.deb"))
        if proc.returncode != 0 or not debs:
            raise RuntimeError(
                f"`{' '.join(cmd)}` failed (exit code {proc.returncode}):\n{proc.stderr.strip()}"
            )
        target = dest / debs[-1].name
        partial = dest / f".{debs[-1].name}.{os.getpid()}.tmp"
        shutil.move(str(debs[-1]), partial)
        os.replace(partial, target)
    return target


# ------------------------------------------------------------------------------ cache


def fashion_path(root: Path | None = None) -> Path:
    """Return the path of the cached ``fashion.npz``.

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    Path
        ``root / "fashion.npz"``.
    """
    return (root if root is not None else cache_dir()) / FASHION_FILE


def _check_digest(member: str, content: bytes) -> None:
    """Compare the decompressed member's SHA-256 with the pinned one."""
    base = member.rsplit("/", 1)[-1]
    try:
        raw = gzip.decompress(content)
    except (EOFError, OSError, zlib.error) as err:
        raise IdxFormatError(f"{base}: the gzip stream is damaged ({err})") from err
    digest = hashlib.sha256(raw).hexdigest()
    if digest != FASHION_SHA256[base]:
        raise IdxFormatError(
            f"{base}: SHA-256 {digest} of the decompressed file is not the pinned "
            f"{FASHION_SHA256[base]} (a different package version?)"
        )


def prepare_fashion(root: Path | None = None, force: bool = False) -> Path:
    """Build ``fashion.npz`` from the ``dataset-fashion-mnist`` .deb (skipped if it exists).

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None. The ``.deb`` is kept in
        ``root / "debs"``.
    force : bool
        Rebuild even if the ``.npz`` exists.

    Returns
    -------
    Path
        The ``.npz`` file.

    Raises
    ------
    IdxFormatError
        If the package or an IDX file is malformed or not the pinned data.
    RuntimeError
        If the package cannot be downloaded.
    """
    root = root if root is not None else cache_dir()
    out = fashion_path(root)
    if out.is_file() and not force:
        return out
    deb = fetch_deb(FASHION_PACKAGE, root / "debs")
    names = [member for pair in FASHION_MEMBERS.values() for member in pair]
    files = read_deb_members(deb, names)
    arrays: dict[str, NDArray[np.uint8] | NDArray[np.int64]] = {}
    for split, (images_member, labels_member) in FASHION_MEMBERS.items():
        _check_digest(images_member, files[images_member])
        _check_digest(labels_member, files[labels_member])
        x, y = decode_split(files[images_member], files[labels_member], expected=SPLIT_SIZES[split])
        arrays[f"x_{split}"] = x
        arrays[f"y_{split}"] = y
    atomic_savez(out, **arrays)
    return out


def load_fashion(
    root: Path | None = None,
) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
    """Load the prepared Fashion-MNIST split (the shape of :func:`~flwr_fsl.data.load_mnist`).

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    tuple
        ``(x_train, y_train, x_test, y_test)``: images float32 of shape ``(N, 28, 28)`` equal
        to ``byte / 256`` (in ``[0, 1)``, as MNIST), labels int64 in ``0..9`` (names in
        :data:`FASHION_CLASSES`); 60,000 train and 10,000 test. The arrays are cached per
        process and read-only (copy before modifying).

    Raises
    ------
    DataNotPreparedError
        If ``python -m flwr_fsl.data prepare fashion`` has not been run.
    """
    path = require_cached(fashion_path(root), "fashion")
    resolved = path.resolve()
    x_train, y_train, x_test, y_test = load_image_split(str(resolved), resolved.stat().st_mtime_ns)
    return x_train, y_train, x_test, y_test  # type: ignore[return-value]
