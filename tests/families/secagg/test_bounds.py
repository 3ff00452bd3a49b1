"""The decoded sum's plausibility bounds, the replay guard and share attribution (issue 24)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError, RoundFailedError, TooFewSurvivorsError
from flwr_fsl.families.secagg.dp import SecAggDP
from flwr_fsl.families.secagg.messages import (
    SecAggError,
    SecAggParams,
    UnmaskRequest,
    _unmask_reply_from_bytes,
    _unmask_reply_to_bytes,
)
from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggServer
from flwr_fsl.families.secagg.replay import ReplayGuard
from flwr_fsl.families.secagg.vector import WeightedVector

U64 = np.uint64
SHAPES = {"w": (3, 4), "b": (4,)}


def _layout(weighted: bool, dp: SecAggDP | None = None) -> WeightedVector:
    return WeightedVector(
        ("w", "b"), tuple(SHAPES.values()), ("loss",), clip=2.0, max_weight=50.0,
        max_metric=10.0, frac_bits=24, max_clients=100, weighted=weighted, dp=dp,
    )  # fmt: skip


def _sum(layout: WeightedVector, n: int, sign: float, threshold: int = 2) -> np.ndarray:
    """``n`` honest vectors at the edge of every bound (updates +-clip, weight max, metric max)."""
    model = {k: np.zeros(s) for k, s in SHAPES.items()}
    trained = {k: np.full(s, sign * 5.0) for k, s in SHAPES.items()}  # clipped to +-2
    weight = layout.weight_bound
    total = np.zeros(layout.length, dtype=U64)
    for _ in range(n):
        words, _ = layout.encode(model, trained, weight, {"loss": sign * 10.0})
        total += layout.add_noise(words, threshold)
    return total


@pytest.mark.parametrize("weighted", [False, True], ids=["unit", "weighted"])
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["up", "down"])
def test_honest_sums_at_the_edge_of_every_bound_pass(weighted: bool, sign: float) -> None:
    layout = _layout(weighted)
    model = {k: np.zeros(s) for k, s in SHAPES.items()}
    new, metrics, weight = layout.decode(_sum(layout, 7, sign), model, count=7)
    assert weight == pytest.approx(7 * layout.weight_bound)
    np.testing.assert_allclose(new["w"], sign * 2.0, atol=1e-6)
    assert metrics["loss"] == pytest.approx(sign * 10.0)


def test_honest_dp_sums_pass_and_uniform_words_fail() -> None:
    layout = _layout(False, SecAggDP(noise_multiplier=1.0, clip_norm=1.0))
    model = {k: np.zeros(s) for k, s in SHAPES.items()}
    for _ in range(5):
        layout.decode(_sum(layout, 6, 1.0, threshold=3), model, count=6, threshold=3)
    garbage = np.frombuffer(os.urandom(8 * layout.length), dtype=U64)
    with pytest.raises(RoundFailedError, match="outside its bounds"):
        layout.decode(_sum(layout, 6, 1.0, threshold=3) + garbage, model, count=6, threshold=3)


@pytest.mark.parametrize("weighted", [False, True], ids=["unit", "weighted"])
def test_sums_no_honest_clients_can_build_fail(weighted: bool) -> None:
    layout = _layout(weighted)
    model = {k: np.zeros(s) for k, s in SHAPES.items()}
    honest = _sum(layout, 4, 1.0)
    for _ in range(20):  # a replayed input: uniform words on top of the honest sum
        garbage = np.frombuffer(os.urandom(8 * layout.length), dtype=U64)
        with pytest.raises(RoundFailedError, match="outside its bounds"):
            layout.decode(honest + garbage, model, count=4)
    with pytest.raises(RoundFailedError, match="total weight"):  # more weight than survivors
        layout.decode(honest, model, count=3)
    shifted = honest.copy()
    shifted[0] += U64(layout.codec.scale * 2.0 * layout.weight_bound)  # one word beyond clip
    with pytest.raises(RoundFailedError, match="update word"):
        layout.decode(shifted, model, count=4)


def test_replay_guard_refuses_earlier_rounds_replies_only() -> None:
    guard = ReplayGuard(keep=2)
    guard.check(b"s", 1, "masked input", b"abc")
    guard.check(b"s", 1, "masked input", b"abc")  # the same round: the engine's duplicate
    guard.check(b"s", 2, "unmask reply", b"abc")  # another kind of reply
    with pytest.raises(SecAggError, match="replay"):
        guard.check(b"s", 2, "masked input", b"abc")
    for rnd in (3, 4, 5):
        guard.check(b"s", rnd, "masked input", bytes([rnd]))
    guard.check(b"s", 6, "masked input", b"abc")  # forgotten after keep rounds
    with pytest.raises(ConfigurationError, match="keep"):
        ReplayGuard(keep=0)


def _round(
    t: int,
    nodes: list[int],
    corrupt: dict[int, set[int]],
    round_id: int = 3,
    masked: dict[int, np.ndarray] | None = None,
    liar: tuple[int, set[int]] | None = None,
) -> SecAggServer:
    """A round in which ``corrupt[sender]`` lists the recipients of its shares that fail.

    ``masked`` collects every client's ``y_u``; a value already there is sent instead (a
    replay of another round's masked input). ``liar = (h, dealers)``: holder ``h`` returns a
    wrong share of each of these dealers' secrets.
    """
    params = SecAggParams(round_id, b"\x01" * 16, t, 8)
    clients = {u: SecAggClient(u, params) for u in nodes}
    server = SecAggServer(params)
    for u, c in clients.items():
        server.add_advertisement(u, c.advertise())
    roster = server.roster()
    for u, c in clients.items():
        server.add_shares(u, c.share_keys(roster))
    u2 = server.sharers()
    for u in nodes:
        y = clients[u].masked_input(u2, np.full(8, u, dtype=U64))
        if masked is not None:
            y = masked.setdefault(u, y)
        server.add_masked_input(u, y)
    for u in nodes:
        request = UnmaskRequest.from_bytes(server.unmask_request(u))
        for sender, victims in corrupt.items():
            if u in victims:
                blob = bytearray(request.sealed_shares[sender])
                blob[-1] ^= 1
                request.sealed_shares[sender] = bytes(blob)
        reply = clients[u].unmask(request.to_bytes())
        if liar is not None and u == liar[0]:
            entries = _unmask_reply_from_bytes(reply)
            out = {}
            for v, (kind, share) in entries.items():
                share = share.copy()
                if v in liar[1]:
                    share[0] = (share[0] + 1) % (2**32 - 5)
                out[v] = bytes([kind]) + share.astype("<u4").tobytes()
            reply = _unmask_reply_to_bytes(out)
        server.add_unmask(u, reply)
    return server


def test_bad_shares_blame_their_sender_never_the_recipients() -> None:
    nodes = [1, 2, 3, 4, 5, 6]
    # A sender whose shares fail for two recipients: they still answer, the sum is exact.
    server = _round(3, nodes, {2: {4, 5}})
    np.testing.assert_array_equal(server.result(), np.full(8, sum(nodes), dtype=U64))
    # For every recipient: the round fails naming the sender, not the recipients.
    server = _round(3, nodes, {2: {1, 3, 4, 5, 6}})
    with pytest.raises(TooFewSurvivorsError, match=r"client 2's sealed shares did not open"):
        server.result()


def test_a_masked_input_of_another_round_never_cancels() -> None:
    # Fresh keys and seeds per round, pair keys bound to session, round and digest: client 2's
    # round-3 masked input replayed in round 4 leaves uniform words in the sum.
    nodes = [1, 2, 3, 4]
    earlier: dict[int, np.ndarray] = {}
    _round(3, nodes, {}, round_id=3, masked=earlier)
    replay = {2: earlier[2]}
    total = _round(3, nodes, {}, round_id=4, masked=replay).result()
    error = (total - np.full(8, sum(nodes), dtype=U64)).view(np.int64)
    # not a small shift: each word is uniform in Z_2^64 (below 2^40 with chance 2^-23)
    assert np.count_nonzero(np.abs(error) > 2**40) >= 6


def test_a_holder_that_returns_wrong_shares_is_blamed_alone() -> None:
    nodes = [1, 2, 3, 4, 5, 6]
    total = np.full(8, sum(nodes), dtype=U64)
    # Wrong shares of several dealers' secrets: only the holder can have lied. Its shares are
    # ignored, it is named, and the sum (its own input included) is exact.
    server = _round(3, nodes, {}, liar=(4, {1, 2, 3, 5, 6}))
    np.testing.assert_array_equal(server.result(), total)
    assert list(server.excluded) == [4]
    server = _round(3, nodes, {}, liar=(4, {2, 5}))
    np.testing.assert_array_equal(server.result(), total)
    assert list(server.excluded) == [4]
    # One dealer's secret only: the dealer or the holder lied; the round fails naming both.
    server = _round(3, nodes, {}, liar=(4, {2}))
    with pytest.raises(RoundFailedError, match=r"either 2 dealt .* holders \[1, 2, 3, 4, 5, 6\]"):
        server.result()
    assert server.excluded == {}
