"""Sparse submodel wire format v2 in Flower records: round trips and every malformed-input path."""

import io

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.records import decode_update, encode_update
from flwr_fsl.submodel import (
    ARRAYS_KEY,
    HEADER_KEY,
    Encoding,
    SubmodelFormatError,
    SubmodelUpdate,
    TensorUpdate,
)

REF = {
    "conv.weight": np.zeros((4, 3, 2), np.float32),
    "emb.weight": np.zeros((10, 5), np.float32),
    "bn.count": np.zeros((), np.int64),
}


def _sample_update() -> SubmodelUpdate:
    return SubmodelUpdate(
        {
            "conv.weight": TensorUpdate(
                Encoding.COORDINATES,
                np.array([1.0, -2.0, 3.0], np.float32),
                np.array([0, 5, 23], np.int64),
            ),
            "emb.weight": TensorUpdate(
                Encoding.ROWS,
                np.ones((2, 5), np.float32),
                np.array([9, 2], np.int64),
                np.array([3.0, 1.0]),
            ),
            "bn.count": TensorUpdate(Encoding.DENSE, np.array(4, np.int64)),
        }
    )


def _content(update: SubmodelUpdate) -> RecordDict:
    content = encode_update(update)
    content["metrics"] = MetricRecord({"num-examples": 7})
    return content


def test_round_trip_all_encodings() -> None:
    update = _sample_update()
    decoded = decode_update(_content(update), REF, 7)
    assert decoded.weight == 7.0
    assert set(decoded.tensors) == set(update.tensors)
    for name, part in update.tensors.items():
        got = decoded.tensors[name]
        assert got.encoding is part.encoding
        np.testing.assert_array_equal(got.values, part.values)
        if part.indices is not None:
            np.testing.assert_array_equal(got.indices, part.indices)
        if part.counts is not None:
            np.testing.assert_array_equal(got.counts, part.counts)


@given(
    size=st.integers(1, 300),
    data=st.data(),
)
def test_round_trip_random_coordinates(size: int, data: st.DataObject) -> None:
    ref = {"w": np.zeros(size, np.float32)}
    idx = data.draw(st.lists(st.integers(0, size - 1), unique=True, max_size=size))
    values = np.asarray(
        data.draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=len(idx), max_size=len(idx))),
        np.float32,
    )
    update = SubmodelUpdate(
        {"w": TensorUpdate(Encoding.COORDINATES, values, np.asarray(idx, np.int64))}
    )
    got = decode_update(_content(update), ref, 1).tensors["w"]
    np.testing.assert_array_equal(got.indices, idx)
    np.testing.assert_array_equal(got.values, values)


def test_plain_dense_reply_becomes_deltas() -> None:
    ref = {"w": np.array([1.0, 2.0], np.float32)}
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(np.array([1.5, 0.0], np.float32))}),
            "metrics": MetricRecord({"num-examples": 3}),
        }
    )
    update = decode_update(content, ref, 3)
    np.testing.assert_allclose(update.tensors["w"].values, [0.5, -2.0])
    assert update.tensors["w"].encoding is Encoding.DENSE


def _mutate(content: RecordDict, key: str, array: np.ndarray) -> RecordDict:
    content[ARRAYS_KEY][key] = Array(array)
    return content


def _set_header(content: RecordDict, **fields: object) -> RecordDict:
    header = content[HEADER_KEY]
    for k, v in fields.items():
        header[k] = v  # type: ignore[assignment]
    return content


MALFORMED = {
    "unknown parameter": lambda c: _set_header(c, names=["nope", "emb.weight", "bn.count"]),
    "wrong shape (rows)": lambda c: _mutate(c, "emb.weight|values", np.ones((2, 4), np.float32)),
    "wrong shape (dense)": lambda c: _mutate(c, "bn.count|values", np.array([4], np.int64)),
    "wrong dtype": lambda c: _mutate(c, "conv.weight|values", np.ones(3, np.float64)),
    "index dtype": lambda c: _mutate(c, "conv.weight|indices", np.array([0, 5, 23], np.int32)),
    "out-of-range index": lambda c: _mutate(
        c, "conv.weight|indices", np.array([0, 5, 24], np.uint32)
    ),
    "signed indices": lambda c: _mutate(c, "conv.weight|indices", np.array([-1, 5, 6])),
    "duplicate index": lambda c: _mutate(c, "conv.weight|indices", np.array([0, 5, 5], np.uint32)),
    "duplicate row": lambda c: _mutate(c, "emb.weight|indices", np.array([2, 2], np.uint32)),
    "row out of range": lambda c: _mutate(c, "emb.weight|indices", np.array([2, 10], np.uint64)),
    "NaN value": lambda c: _mutate(
        c, "conv.weight|values", np.array([1.0, np.nan, 3.0], np.float32)
    ),
    "inf value": lambda c: _mutate(c, "emb.weight|values", np.full((2, 5), np.inf, np.float32)),
    "length mismatch": lambda c: _mutate(c, "conv.weight|values", np.ones(2, np.float32)),
    "missing counts": lambda c: (c[ARRAYS_KEY].pop("emb.weight|counts"), c)[1],
    "zero count": lambda c: _mutate(c, "emb.weight|counts", np.array([0.0, 1.0])),
    "NaN count": lambda c: _mutate(c, "emb.weight|counts", np.array([np.nan, 1.0])),
    "int counts": lambda c: _mutate(c, "emb.weight|counts", np.array([1, 1])),
    # Strings once reached astype(float64) and raised a plain ValueError that ended the run.
    "string counts": lambda c: _mutate(c, "emb.weight|counts", np.array(["a", "b"])),
    "numeric-string counts": lambda c: _mutate(c, "emb.weight|counts", np.array(["1", "2"])),
    "string values": lambda c: _mutate(c, "conv.weight|values", np.array(["x", "y", "z"])),
    "string indices": lambda c: _mutate(c, "conv.weight|indices", np.array(["0", "5", "6"])),
    "missing values": lambda c: (c[ARRAYS_KEY].pop("conv.weight|values"), c)[1],
    "extra array": lambda c: _mutate(c, "bn.count|indices", np.array([0])),
    "unknown encoding": lambda c: _set_header(c, encodings=["coo", "rows", "dense"]),
    "old version": lambda c: _set_header(c, version=1),
    "future version": lambda c: _set_header(c, version=3),
    "bad format": lambda c: _set_header(c, format="other"),
    "names not a list": lambda c: _set_header(c, names="conv.weight"),
    "list length mismatch": lambda c: _set_header(c, counts=[False, True]),
    "repeated name": lambda c: _set_header(c, names=["emb.weight", "emb.weight", "bn.count"]),
    "counts on dense": lambda c: _set_header(c, counts=[False, True, True]),
    "missing array record": lambda c: (c.pop(ARRAYS_KEY), c)[1],
    "undecodable bytes": lambda c: (
        c[ARRAYS_KEY].__setitem__(
            "conv.weight|values",
            Array(dtype="float32", shape=(3,), stype="numpy.ndarray", data=b"\x93NUMPY garbage"),
        ),
        c,
    )[1],
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_update_raises(case: str) -> None:
    content = MALFORMED[case](_content(_sample_update()))
    with pytest.raises(SubmodelFormatError) as err:
        decode_update(content, REF, 7)
    assert str(err.value)


UNPICKLED: list[str] = []


def _record_unpickle() -> str:
    UNPICKLED.append("ran")
    return "payload"


class _Evil:
    def __reduce__(self) -> tuple:
        return (_record_unpickle, ())


def test_pickled_payload_is_rejected_without_unpickling() -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.array([_Evil(), 1, 2], dtype=object), allow_pickle=True)
    content = _content(_sample_update())
    content[ARRAYS_KEY]["conv.weight|values"] = Array(
        dtype="object", shape=(3,), stype="numpy.ndarray", data=buffer.getvalue()
    )
    with pytest.raises(SubmodelFormatError, match="cannot be decoded"):
        decode_update(content, REF, 7)
    assert UNPICKLED == []


@pytest.mark.parametrize("weight", [0, -1, float("nan"), float("inf"), "3"])
def test_bad_weight_raises(weight: object) -> None:
    with pytest.raises(SubmodelFormatError, match="weight"):
        decode_update(_content(_sample_update()), REF, weight)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"w": np.zeros(2, np.float32), "x": np.zeros(1, np.float32)}, "unknown"),
        ({}, "missing"),
        ({"w": np.zeros(3, np.float32)}, "shape"),
        ({"w": np.zeros(2, np.bool_)}, "dtype"),
        ({"w": np.zeros(2, np.complex64)}, "dtype"),
        ({"w": np.array([np.nan, 0], np.float32)}, "NaN"),
        ({"w": np.array([np.nan, 0], np.float64)}, "NaN"),
    ],
)
def test_malformed_dense_reply_raises(arrays: dict, match: str) -> None:
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": 3}),
        }
    )
    with pytest.raises(SubmodelFormatError, match=match):
        decode_update(content, {"w": np.zeros(2, np.float32)}, 3)


def test_dense_reply_needs_exactly_one_array_record() -> None:
    content = RecordDict(
        {
            "a": ArrayRecord({"w": Array(np.zeros(2, np.float32))}),
            "b": ArrayRecord({"w": Array(np.zeros(2, np.float32))}),
        }
    )
    with pytest.raises(SubmodelFormatError, match="exactly one ArrayRecord"):
        decode_update(content, {"w": np.zeros(2, np.float32)}, 1)


def test_header_is_a_config_record() -> None:
    content = _content(_sample_update())
    assert isinstance(content[HEADER_KEY], ConfigRecord)
