"""PSR: exact retrieval (scalars, rows, stash), table codec, malformed queries."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.ssa.protocol import SSAInputError, SSAParams, place_indices
from flwr_fsl.families.ssa.psr import (
    PSRServer,
    decode_answers,
    decode_table,
    encode_table,
    make_query,
)


def _key(n: int) -> bytes:
    return hashlib.sha256(b"psr" + n.to_bytes(8, "little")).digest()[:16]


def _retrieve(params: SSAParams, table: np.ndarray, idx: np.ndarray, seed: int) -> np.ndarray:
    words = encode_table(table)
    query = make_query(params, idx, rng=np.random.default_rng(seed))
    answers = [
        PSRServer(params, b, words).answer(query.upload.public_part, query.upload.master_seeds[b])
        for b in (0, 1)
    ]
    return decode_table(decode_answers(query, *answers), table.dtype.type)


@settings(max_examples=30)
@given(
    m=st.integers(1, 800),
    width=st.integers(1, 6),
    frac=st.floats(0, 1),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32),
)
def test_returns_exactly_the_requested_rows(
    m: int, width: int, frac: float, dtype: type, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    k = int(frac * min(m, 50))
    params = SSAParams(
        round_id=1, domain_size=m, num_items=max(k, 1), value_width=width, hash_key=_key(seed)
    )
    table = rng.normal(size=(m, width)).astype(dtype)
    idx = rng.choice(m, k, replace=False)
    np.testing.assert_array_equal(_retrieve(params, table, idx, seed), table[idx])


def test_stashed_rows_are_retrieved_too() -> None:
    m, k = 300, 24
    idx = np.arange(0, 2 * k, 2)
    for n in range(200):
        params = SSAParams(
            round_id=1,
            domain_size=m,
            num_items=k,
            value_width=3,
            hash_key=_key(n),
            stash_size=4,
            scale_factor=1.0,
        )
        if place_indices(params, idx, rng=np.random.default_rng(0)).cuckoo_table.stashed.size:
            break
    table = np.random.default_rng(1).normal(size=(m, 3)).astype(np.float32)
    np.testing.assert_array_equal(_retrieve(params, table, idx, 0), table[idx])


def test_table_codec_round_trip_and_errors() -> None:
    x = np.array([[1.5, -0.0, np.inf]], np.float32)
    np.testing.assert_array_equal(decode_table(encode_table(x), np.float32), x)
    y = np.array([np.pi, -1e300])
    np.testing.assert_array_equal(decode_table(encode_table(y), np.float64)[:, 0], y)
    with pytest.raises(ConfigurationError, match="float32 or float64"):
        encode_table(np.arange(3))
    with pytest.raises(SSAInputError, match="high bits"):
        decode_table(np.array([[2**40]], np.uint64), np.float32)
    with pytest.raises(ConfigurationError, match="unsupported"):
        decode_table(np.zeros((1, 1), np.uint64), np.int32)


def test_malformed_queries_and_tables_raise() -> None:
    params = SSAParams(round_id=1, domain_size=64, num_items=8, value_width=2, hash_key=_key(0))
    words = encode_table(np.zeros((64, 2), np.float32))
    server = PSRServer(params, 0, words)
    query = make_query(params, np.arange(8))
    with pytest.raises(SSAInputError):
        server.answer(query.upload.public_part[:-5], query.upload.master_seeds[0])
    with pytest.raises(SSAInputError, match="master seed"):
        server.answer(query.upload.public_part, b"x")
    with pytest.raises(ConfigurationError, match="shape"):
        PSRServer(params, 0, encode_table(np.zeros((63, 2), np.float32)))
    with pytest.raises(ConfigurationError, match="party"):
        PSRServer(params, 2, words)
    with pytest.raises(SSAInputError, match="one row per key"):
        decode_answers(query, np.zeros((1, 2), np.uint64), np.zeros((1, 2), np.uint64))


def test_one_servers_answer_alone_is_not_the_row() -> None:
    params = SSAParams(round_id=1, domain_size=64, num_items=4, value_width=1, hash_key=_key(3))
    table = np.arange(1, 65, dtype=np.float64)
    words = encode_table(table)
    query = make_query(params, np.array([5]))
    a0 = PSRServer(params, 0, words).answer(query.upload.public_part, query.upload.master_seeds[0])
    assert not np.any(a0 == words[5])
