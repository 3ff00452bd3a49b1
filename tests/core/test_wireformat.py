"""The strict reader and writer (flwr_fsl.core.wireformat): known answers for every field, the
id-set and node-map fields SecAgg and SESA share, and every error path (truncation, trailing
bytes, over-limit counts, unsorted or repeated ids, the owner's error class)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.wireformat import MAX_ITEMS, Reader, WireFormatError, Writer


class OwnError(ClientInputError):
    """A format's own error class."""


def _le(*values: int, fmt: str = "Q") -> bytes:
    return b"".join(struct.pack("<" + fmt, v) for v in values)


# -- known answers -------------------------------------------------------------------------------


def test_scalar_fields_known_answers() -> None:
    w = Writer()
    w.u8(7)
    w.u16(0x0A0B)
    w.u32(0x01020304)
    w.u64(2**64 - 1)
    w.f64(1.5)
    w.raw(b"ab")
    w.fixed(b"xyz", 3)
    data = w.payload()
    assert data == (
        b"\x07" + b"\x0b\x0a" + b"\x04\x03\x02\x01" + b"\xff" * 8 + struct.pack("<d", 1.5)
        + b"\x02\x00\x00\x00ab" + b"xyz"
    )  # fmt: skip
    r = Reader(data)
    assert (r.u8("a"), r.u16("h"), r.u32("b")) == (7, 0x0A0B, 0x01020304)
    assert (r.u64("c"), r.f64("d")) == (2**64 - 1, 1.5)
    assert (r.raw("e"), r.fixed(3, "f")) == (b"ab", b"xyz")
    r.done()


def test_f64_is_the_u64_of_the_binary64_bits() -> None:
    for value in (0.0, -0.0, 8.0, 1e-300, float("inf")):
        w = Writer()
        w.f64(value)
        bits = struct.unpack("<Q", struct.pack("<d", value))[0]
        assert w.payload() == _le(bits)
        assert struct.pack("<d", Reader(w.payload()).f64("v")) == struct.pack("<d", value)
    with pytest.raises(WireFormatError):
        Writer().f64(True)


def test_ids_known_answer_as_given_and_canonical() -> None:
    w = Writer()
    w.ids([8, 3, 8])
    assert w.payload() == _le(3, fmt="I") + _le(8, 3, 8)
    assert Reader(w.payload()).ids("ids") == (8, 3, 8)
    w = Writer()
    w.ids([8, 3, 2**64 - 1, 0, 3], canonical=True)
    data = w.payload()
    assert data == _le(4, fmt="I") + _le(0, 3, 8, 2**64 - 1)
    r = Reader(data)
    assert r.ids("ids", increasing=True) == (0, 3, 8, 2**64 - 1)
    r.done()
    w = Writer()
    w.ids([], canonical=True)
    assert w.payload() == b"\0\0\0\0"
    assert Reader(w.payload()).ids("ids", increasing=True) == ()


def test_node_map_known_answers_fixed_and_sized() -> None:
    w = Writer()
    w.node_map({9: b"bb", 2: b"aa"}, 2)
    data = w.payload()
    assert data == _le(2, fmt="I") + _le(2) + b"aa" + _le(9) + b"bb"
    r = Reader(data)
    assert r.node_map("m", 2) == {2: b"aa", 9: b"bb"}
    r.done()
    w = Writer()
    w.node_map({5: b"", 1: b"xyz"}, None)
    data = w.payload()
    assert data == _le(2, fmt="I") + _le(1) + _le(3, fmt="I") + b"xyz" + _le(5) + _le(0, fmt="I")
    assert Reader(data).node_map("m", None) == {1: b"xyz", 5: b""}


def test_words_known_answer() -> None:
    w = Writer()
    w.words(np.array([1, 2**32 - 1], np.uint64), "<u4")
    assert w.payload() == _le(1, 2**32 - 1, fmt="I")
    r = Reader(w.payload())
    assert r.words(2, "<u4", "w").tolist() == [1, 2**32 - 1]
    r.done()
    view = Reader(b"x" + w.payload(), 1).words(2, "<u4", "w")  # bytes: a read-only view
    assert view.tolist() == [1, 2**32 - 1] and not view.flags.writeable
    buf = bytearray(w.payload())
    copy = Reader(buf).words(2, "<u4", "w")  # a mutable buffer: a copy
    buf[0] = 9
    assert copy.tolist() == [1, 2**32 - 1]
    assert Reader(b"ab", 2).words(0, "<u8", "w").size == 0
    with pytest.raises(WireFormatError, match="little-endian"):
        Reader(b"").words(0, ">u4", "w")
    with pytest.raises(WireFormatError, match="little-endian"):
        Writer().words([1], "<U4")


def test_reader_starts_at_pos() -> None:
    data = b"junk" + _le(1, fmt="I") + _le(5)
    r = Reader(data, 4)
    assert r.ids("ids") == (5,)
    assert r.pos == len(data)


# -- error paths ---------------------------------------------------------------------------------


def _ids(*values: int, count: int | None = None) -> bytes:
    return _le(len(values) if count is None else count, fmt="I") + _le(*values)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x01\x00", "truncated"),  # short count
        (_ids(1, 2, count=3), "truncated"),  # count larger than the bytes left
        (_ids(1, 2)[:-1], "truncated"),
        (_ids(2, 1), "strictly increasing"),
        (_ids(4, 4), "strictly increasing"),
        (_le(MAX_ITEMS + 1, fmt="I"), "exceed the limit"),
    ],
)
def test_ids_refuses(data: bytes, match: str) -> None:
    with pytest.raises(WireFormatError, match=match):
        Reader(data).ids("ids", increasing=True)


def test_ids_limit_and_trailing_bytes() -> None:
    with pytest.raises(WireFormatError, match="exceed the limit of 2"):
        Reader(_ids(1, 2, 3)).ids("ids", limit=2)
    r = Reader(_ids(1, 2) + b"\0")
    assert r.ids("ids", increasing=True) == (1, 2)
    with pytest.raises(WireFormatError, match="1 trailing bytes"):
        r.done()
    assert Reader(_ids(2, 1)).ids("ids") == (2, 1)  # order is free unless asked


@pytest.mark.parametrize(
    ("data", "size", "match"),
    [
        (_le(2, fmt="I") + _le(1) + b"aa" + _le(1) + b"bb", 2, "strictly increasing"),
        (_le(2, fmt="I") + _le(3) + b"aa" + _le(1) + b"bb", 2, "strictly increasing"),
        (_le(2, fmt="I") + _le(1) + b"aa", 2, "truncated"),
        (_le(1, fmt="I") + _le(1) + b"a", 2, "truncated"),
        (_le(1, fmt="I") + _le(1) + _le(9, fmt="I") + b"a", None, "truncated"),
        (_le(MAX_ITEMS + 1, fmt="I"), 0, "exceed the limit"),
    ],
)
def test_node_map_refuses(data: bytes, size: int | None, match: str) -> None:
    with pytest.raises(WireFormatError, match=match):
        Reader(data).node_map("m", size)


def test_node_map_limit_and_trailing_bytes() -> None:
    data = _le(2, fmt="I") + _le(1) + b"a" + _le(2) + b"b"
    with pytest.raises(WireFormatError, match="exceed the limit of 1"):
        Reader(data).node_map("m", 1, limit=1)
    r = Reader(data + b"x")
    assert r.node_map("m", 1) == {1: b"a", 2: b"b"}
    with pytest.raises(WireFormatError, match="trailing"):
        r.done()


def test_declared_sizes_are_checked_before_allocating() -> None:
    huge = _le(0xFFFFFFFF, fmt="I")
    for read in (
        lambda r: r.raw("raw"),
        lambda r: r.ids("ids", limit=0xFFFFFFFF),
        lambda r: r.node_map("m", 1 << 20, limit=0xFFFFFFFF),
        lambda r: r.words(1 << 60, "<u8", "w"),
    ):
        with pytest.raises(WireFormatError, match="truncated"):
            read(Reader(huge))
    with pytest.raises(WireFormatError, match="truncated"):
        Reader(b"").words(-1, "<u8", "w")


def test_writer_refuses() -> None:
    with pytest.raises(WireFormatError, match="exceed the limit"):
        Writer().ids(range(MAX_ITEMS + 1))
    with pytest.raises(WireFormatError, match="exceed the limit of 1"):
        Writer().node_map({1: b"a", 2: b"b"}, 1, limit=1)
    w = Writer()
    w.ids(range(3), limit=None)  # no writer-side limit: the reader bounds the count
    assert Reader(w.payload()).ids("ids") == (0, 1, 2)
    for bad in (-1, 2**64, True, "1", 1.0):
        with pytest.raises(WireFormatError, match="id"):
            Writer().ids([bad])  # type: ignore[list-item]
        with pytest.raises(WireFormatError, match="node id"):
            Writer().node_map({bad: b"a"}, 1)  # type: ignore[dict-item]
    with pytest.raises(WireFormatError, match="exactly 2 bytes"):
        Writer().node_map({1: b"abc"}, 2)
    with pytest.raises(WireFormatError, match="expected bytes"):
        Writer().node_map({1: "abc"}, None)  # type: ignore[dict-item]


def test_the_owner_error_class_is_raised() -> None:
    for read in (
        lambda r: r.u64("x"),
        lambda r: r.ids("ids", increasing=True),
        lambda r: r.node_map("m", 4),
        lambda r: r.words(3, "<u8", "w"),
    ):
        with pytest.raises(OwnError):
            read(Reader(_ids(2, 1)[:6], 0, OwnError))
    with pytest.raises(OwnError, match="strictly increasing"):
        Reader(_ids(2, 1), 0, OwnError).ids("ids", increasing=True)
    r = Reader(b"\0", 0, OwnError)
    with pytest.raises(OwnError, match="trailing"):
        r.done()
    for bad in (b"NOPE\x01", b"MAGC\x02", 5):
        with pytest.raises(OwnError):
            Reader.versioned(bad, b"MAGC", 1, "a test format", OwnError)
    assert Reader.versioned(b"MAGC\x01", b"MAGC", 1, "a test format", OwnError).pos == 5
    with pytest.raises(OwnError, match="exceed the limit"):
        Writer(OwnError).ids(range(3), limit=2)
    with pytest.raises(OwnError):
        Writer(OwnError).u64(-1)
    for bad in (-1, 0x10000, True):
        with pytest.raises(OwnError, match="u16"):
            Writer(OwnError).u16(bad)
    with pytest.raises(OwnError, match="truncated"):
        Reader(b"\x01", 0, OwnError).u16("h")
    with pytest.raises(OwnError):
        Writer(OwnError).fixed(b"a", 2)
    assert not issubclass(OwnError, WireFormatError)
