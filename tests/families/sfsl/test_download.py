"""Niu et al.'s sparse download: a client receives the rows of its ``S''`` only.

The rows round's train message carries ``model[table][S'']`` (not the whole table with zeros
elsewhere), the client's train function still sees a full-shape table with those rows at
``S''`` and zeros elsewhere, and the round's result is unchanged (``test_strategy.py``). The
codec's two functions are checked on their own: a round trip over hypothesis-chosen tables and
sets, and every refusal of a download that does not fit. The subset SecAgg's shared positions
travel as runs (:func:`encode_shared_runs`): round trips, strict refusals, and the size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import WireFormatError
from flwr_fsl.families.secagg.protocol import encode_rows
from flwr_fsl.families.sfsl.messages import (
    MAX_TABLE_BYTES,
    decode_shared_runs,
    encode_shared_runs,
    expand_download,
    submodel_download,
)
from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.strategies import SFSLFedSubAvg
from tests.families.sfsl.test_strategy import MODEL, PAPER, D, M, make_app, paper_grid, real_rows


def _spy(seen: dict[int, Any]):  # type: ignore[no-untyped-def]
    """A mod recording the table of every message that carries the model."""

    def mod(msg: Message, context: Context, call_next):  # type: ignore[no-untyped-def]
        records = [r for r in msg.content.array_records.values() if "emb" in r]
        if records:
            seen[int(context.node_config["partition-id"])] = records[0]["emb"].numpy().copy()
        return call_next(msg, context)

    return mod


@pytest.mark.parametrize(
    "rr", [RRParams.symmetric(1, 0), RRParams.symmetric(1, 1)], ids=["CPP1", "CPP5"]
)
def test_the_rows_message_carries_only_the_rows_of_s2(rr: RRParams) -> None:
    n = 4
    perturbed: dict[int, np.ndarray] = {}
    wire: dict[int, np.ndarray] = {}
    trained_on: dict[int, np.ndarray] = {}
    # Outermost: what travels; innermost (after PerturbedRows): what the train function sees.
    app = make_app(rr, perturbed, outer=(_spy(wire),), inner=(_spy(trained_on),))
    table = np.arange(M * D, dtype=np.float32).reshape(M, D) + 1  # no zero row
    initial = ArrayRecord({"emb": Array(table), "fc": Array(MODEL["fc"].copy())})
    strategy = SFSLFedSubAvg(
        "emb", min_available_nodes=n, fraction_evaluate=0.0, max_count=100.0, **PAPER
    )
    strategy.start(grid=paper_grid(app, n), initial_arrays=initial, num_rounds=1)
    assert strategy.failed_rounds == {} and sorted(wire) == list(range(n))
    union = np.unique(np.concatenate([real_rows(p) for p in range(n)]))
    for pid in range(n):
        rows = perturbed[pid]
        np.testing.assert_array_equal(wire[pid], table[rows])  # |S''| rows, S'' order
        expected = np.zeros_like(table)
        expected[rows] = table[rows]
        np.testing.assert_array_equal(trained_on[pid], expected)
        if rr.p2 == 1.0:  # CPP5: S'' is the union, still not the whole table
            assert wire[pid].shape == (union.size, D) and union.size < M


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 50),
    width=st.integers(1, 6),
    data=st.data(),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_download_round_trip(rows: int, width: int, data: st.DataObject, dtype: Any) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    model = {"t": rng.normal(size=(rows, width)).astype(dtype), "b": rng.normal(size=3)}
    chosen = rng.permutation(rows)[: data.draw(st.integers(0, rows))]
    sent = submodel_download(model, "t", chosen)
    assert sent["t"].shape == (chosen.size, width) and sent["b"] is not None
    back = expand_download(sent, "t", chosen, rows)
    expected = np.zeros_like(model["t"])
    expected[chosen] = model["t"][chosen]
    np.testing.assert_array_equal(back["t"], expected)
    assert back["t"].dtype == model["t"].dtype
    np.testing.assert_array_equal(back["b"], model["b"])


@pytest.mark.parametrize(
    "table, rows, table_rows, match",
    [
        (np.zeros((3, 2)), np.array([0, 1]), 5, "must be the 2 rows"),
        (np.zeros((5, 2)), np.array([0, 1]), 5, "must be the 2 rows"),  # a whole table
        (np.zeros(2), np.array([0, 1]), 5, "must be the 2 rows"),
        (None, np.array([0]), 5, "must be the 1 rows"),
        (np.zeros((2, 2)), np.array([0, 5]), 5, "outside the table"),
        (np.zeros((2, 2)), np.array([-1, 0]), 5, "outside the table"),
        (np.zeros((1, 8)), np.array([0]), MAX_TABLE_BYTES // 8, "over"),
    ],
)
def test_a_download_that_does_not_fit_is_refused(
    table: np.ndarray | None, rows: np.ndarray, table_rows: int, match: str
) -> None:
    download = {"b": np.zeros(2)} if table is None else {"t": table, "b": np.zeros(2)}
    with pytest.raises(ClientInputError, match=match):
        expand_download(download, "t", rows, table_rows)


@st.composite
def _shared(draw: st.DrawFn) -> tuple[dict[int, np.ndarray], int]:
    length = draw(st.integers(1, 200))
    peers = draw(st.lists(st.integers(0, 2**40), unique=True, max_size=6))
    out = {}
    for peer in peers:
        mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
        out[peer] = np.flatnonzero(mask).astype(np.int64)
    return out, length


@settings(max_examples=150, deadline=None)
@given(case=_shared())
def test_shared_runs_round_trip(case: tuple[dict[int, np.ndarray], int]) -> None:
    shared, length = case
    data = encode_shared_runs(shared)
    back = decode_shared_runs(data, length)
    assert sorted(back) == sorted(shared)
    for peer, positions in shared.items():
        np.testing.assert_array_equal(back[peer], positions)
    # Canonical: one encoding per set, and never larger than the word list plus 4 bytes a peer.
    assert encode_shared_runs(back) == data
    assert len(data) <= len(encode_rows(shared)) + 4 * len(shared) + 4 or any(
        np.any(np.diff(p) > 1) for p in shared.values()
    )


def _runs(*peers: tuple[int, list[tuple[int, int]]]) -> bytes:
    out = len(peers).to_bytes(4, "little")
    for peer, runs in peers:
        out += peer.to_bytes(8, "little") + len(runs).to_bytes(4, "little")
        for start, size in runs:
            out += start.to_bytes(8, "little") + size.to_bytes(8, "little")
    return out


@pytest.mark.parametrize(
    "data, match",
    [
        (_runs((1, [(0, 0)])), "empty"),
        (_runs((1, [(8, 3)])), "out of range"),
        (_runs((1, [(8, 1)]), (1, [])), "strictly increasing"),
        (_runs((2, []), (1, [])), "strictly increasing"),
        (_runs((1, [(0, 2), (2, 2)])), "not increasing"),  # touching: not canonical
        (_runs((1, [(4, 2), (0, 2)])), "not increasing"),
        (_runs((1, [(2**63, 1)])), "outside the vector"),
        (_runs((1, [(0, 2**64 - 1)])), "outside the vector"),
        (_runs((1, [(0, 3)]))[:-1], "truncated"),
        (_runs((1, [(0, 3)])) + b"\x00", "trailing|too long|left"),
        ((20_000).to_bytes(4, "little"), "exceed the limit"),
    ],
)
def test_shared_runs_refusals(data: bytes, match: str) -> None:
    with pytest.raises(WireFormatError, match=match):
        decode_shared_runs(data, 10)


def test_shared_runs_name_no_more_peers_than_the_round_has() -> None:
    # Three peers of whole-vector runs: 60 bytes that would expand to 3 x length positions.
    data = _runs((1, [(0, 10)]), (2, [(0, 10)]), (3, [(0, 10)]))
    assert len(decode_shared_runs(data, 10, max_peers=3)) == 3
    with pytest.raises(WireFormatError, match="exceed the limit of 2"):
        decode_shared_runs(data, 10, max_peers=2)


def test_shared_runs_of_whole_rows_are_a_few_words() -> None:
    # CPP5 at 100 users: every client shares all 962 union rows (18 positions each) with each
    # of its 99 peers; positions consecutive, so one run per peer instead of 17,316 words.
    positions = np.arange(962 * 18, dtype=np.int64)
    shared = {peer: positions for peer in range(99)}
    runs, words = encode_shared_runs(shared), encode_rows(shared)
    assert len(runs) == 4 + 99 * (8 + 4 + 16)
    assert len(words) > 13_000_000 and len(runs) < 3_000
    with pytest.raises(ConfigurationError, match="sorted"):
        encode_shared_runs({1: np.array([3, 2])})
