"""content_bytes: the protobuf size of a RecordDict, computed without serializing its bulk."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.serde import recorddict_to_proto
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.traffic import content_bytes

keys = st.text(max_size=20)
ints = st.integers(-(2**63), 2**64 - 1)
floats = st.floats(allow_nan=False)
config_values = st.one_of(
    st.booleans(),
    ints,
    floats,
    st.text(max_size=300),
    st.binary(max_size=300),
    st.lists(st.booleans(), max_size=5),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
    st.lists(st.integers(0, 2**64 - 1), max_size=5),  # uint64 lists (Flower refuses a mix)
    st.lists(floats, max_size=5),
    st.lists(st.text(max_size=20), max_size=5),
    st.lists(st.binary(max_size=200), max_size=5),
)
metric_values = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    floats,
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5),
    st.lists(st.integers(0, 2**64 - 1), max_size=5),
    st.lists(floats, max_size=5),
)


@st.composite
def arrays(draw: st.DrawFn) -> Array:
    dtype = draw(st.sampled_from(["float32", "float64", "uint8", "int64"]))
    shape = tuple(draw(st.lists(st.integers(0, 40), max_size=3)))
    values = np.zeros(shape, dtype)
    if draw(st.booleans()):
        return Array(values)
    # A raw Array: any dtype/stype text, any bytes (Flower does not check they agree).
    return Array(
        dtype=draw(st.text(max_size=8)),
        shape=shape,
        stype=draw(st.text(max_size=8)),
        data=draw(st.binary(max_size=400)),
    )


@st.composite
def contents(draw: st.DrawFn) -> RecordDict:
    content = RecordDict()
    for key in draw(st.lists(keys, max_size=4, unique=True)):
        kind = draw(st.sampled_from(["arrays", "config", "metrics"]))
        if kind == "arrays":
            content[key] = ArrayRecord(draw(st.dictionaries(keys, arrays(), max_size=3)))
        elif kind == "config":
            content[key] = ConfigRecord(draw(st.dictionaries(keys, config_values, max_size=4)))
        else:
            content[key] = MetricRecord(draw(st.dictionaries(keys, metric_values, max_size=4)))
    return content


@settings(max_examples=300, deadline=None)
@given(contents())
def test_equals_the_protobuf_size(content: RecordDict) -> None:
    assert content_bytes(content) == recorddict_to_proto(content).ByteSize()


def test_large_bodies_and_arrays() -> None:
    # Length prefixes of several bytes (>= 2**14, >= 2**21) at every nesting level.
    content = RecordDict(
        {
            "fsl.secagg": ConfigRecord({"phase": "masked", "body": bytes(3_000_000)}),
            "arrays": ArrayRecord({"w": Array(np.ones((1000, 300), np.float32))}),
            "m": MetricRecord({"num-examples": 50}),
        }
    )
    assert content_bytes(content) == recorddict_to_proto(content).ByteSize()
