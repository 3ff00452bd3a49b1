"""What one client that ignores the protocol can still do to SSA, with the servers' key check.

A client that builds its own DPF keys (instead of using
:func:`~flwr_fsl.families.ssa.protocol.encode_update`) chooses every payload word in Z_2^64.
Both servers check every key (:mod:`flwr_fsl.families.ssa.verify`, on by default): one point
per key and, with unit weights (the default), a count word of exactly 1. These tests pin down
what that leaves, as docs/families/ssa.md says: erasing an honest client's update needs a
negative count, which the check catches with unit weights but not with ``weighted=True`` (the
count is a weight then, its range unchecked); wrapping a sum with a huge value word and count 1
is caught in both (value words are range-checked: :mod:`flwr_fsl.families.ssa.range_check`,
and by the default projected check, :mod:`flwr_fsl.families.ssa.projected_check`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import flwr_fsl.families.ssa.client_state as client_state
import flwr_fsl.families.ssa.protocol as ssa
from flwr_fsl.families.ssa.protocol import SSAParams, SSAServer, encode_update, reconstruct
from tests.families.ssa import forge

UNIT = SSAParams(
    round_id=1,
    domain_size=64,
    num_items=4,
    value_width=1,
    hash_key=bytes(range(16)),
    weighted=False,
    value_check="exact",  # the value words' check (off by default for its upload cost)
)
WEIGHTED = replace(UNIT, weighted=True)


def _aggregate(params: SSAParams, uploads: list[ssa.SSAUpload]) -> tuple[ssa.SSAResult, set[int]]:
    """Both servers with the key check: S0's digest goes to S1, which adds only if equal."""
    servers = [SSAServer(params, party) for party in (0, 1)]
    dropped = set()
    for client, upload in enumerate(uploads):
        digest = servers[0].add_client(client, upload.public_part, upload.master_seeds[0])
        try:
            servers[1].add_client(client, upload.public_part, upload.master_seeds[1], digest)
        except ssa.SSAInputError:
            servers[0].discard(client)
            dropped.add(client)
    return reconstruct(params, servers[0].share(), servers[1].share()), dropped


def _crafted(
    monkeypatch: pytest.MonkeyPatch, params: SSAParams, index: int, words: np.ndarray
) -> ssa.SSAUpload:
    """Keys a malicious client makes for one element with payload words of its choosing."""
    with monkeypatch.context() as patch:
        patch.setattr(ssa, "payload_words", lambda *_a, **_k: words.reshape(1, -1))
        # Its value-check trailer is the forger's best (forge.forged_trailer).
        patch.setattr(ssa, "value_trailer", forge.forged_trailer)
        upload, _ = encode_update(params, [index], [[0.0]], 1.0)
    return upload


def _negated(params: SSAParams, sums: float, count: float) -> np.ndarray:
    words = params.fixed_point.encode(np.array([[sums, count]]))
    return (np.uint64(0) - words).astype(np.uint64)


def test_erasing_an_honest_update_is_caught_with_unit_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest, _ = encode_update(UNIT, [5, 9], [[0.5], [0.25]])
    attack = _crafted(monkeypatch, UNIT, 5, _negated(UNIT, 0.5, 1.0))  # count word -1
    result, dropped = _aggregate(UNIT, [honest, attack])
    assert dropped == {1}
    assert result.counts is not None and result.counts[5] == 1.0 and result.sums[5, 0] == 0.5


def test_known_gap_weighted_rounds_do_not_check_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    honest, _ = encode_update(WEIGHTED, [5, 9], [[0.5], [0.25]], 3.0)
    attack = _crafted(monkeypatch, WEIGHTED, 5, _negated(WEIGHTED, 1.5, 3.0))
    result, dropped = _aggregate(WEIGHTED, [honest, attack])
    assert dropped == set()  # one point per key holds; the weight's range is not checked
    assert result.counts is not None
    assert result.counts[5] == 0.0 and result.sums[5, 0] == 0.0  # element 5 looks untouched
    assert result.counts[9] == 3.0  # elements the attacker did not target are exact


@pytest.mark.parametrize(
    "params",
    [UNIT, WEIGHTED, replace(UNIT, value_check="projected")],
    ids=["unit", "weighted", "projected"],
)
def test_wrapping_a_sum_with_a_huge_value_word_is_caught(
    monkeypatch: pytest.MonkeyPatch, params: SSAParams
) -> None:
    honest, _ = encode_update(params, [5], [[0.5]], 1.0)
    one = params.fixed_point.encode(np.array([[1.0]]))[0, 0]
    huge = np.array([[1 << 62, one]], dtype=np.uint64)  # a sum far outside max_abs, count 1
    result, dropped = _aggregate(params, [honest, _crafted(monkeypatch, params, 5, huge)])
    assert dropped == {1}  # the value word is out of range
    assert result.counts is not None and result.counts[5] == 1.0 and result.sums[5, 0] == 0.5


@pytest.mark.parametrize("check", ["exact", "projected"])
def test_a_udpf_hint_with_a_huge_value_word_is_caught(
    monkeypatch: pytest.MonkeyPatch, check: str
) -> None:
    """Both value checks also cover U-DPF hints (the trailer travels with the hint)."""
    first = replace(UNIT, epoch=1, value_check=check)
    upload, state = encode_update(first, [9], [[0.25]], 1.0)
    servers = [SSAServer(first, party) for party in (0, 1)]
    digest = servers[0].add_client(1, upload.public_part, upload.master_seeds[0])
    servers[1].add_client(1, upload.public_part, upload.master_seeds[1], digest)
    nxt = replace(first, round_id=2, epoch=2)
    one = UNIT.fixed_point.encode(np.array([[1.0]]))[0, 0]
    huge = np.array([[1 << 62, one]], dtype=np.uint64)
    with monkeypatch.context() as patch:
        patch.setattr(client_state, "payload_words", lambda *_a, **_k: huge)
        patch.setattr(client_state, "value_trailer", forge.forged_trailer)
        hint = state.next_round(nxt, [[0.0]], 1.0)
    s0, s1 = (SSAServer(nxt, b, previous_keys={1: servers[b].keys[1]}) for b in (0, 1))
    digest = s0.add_client_hint(1, hint)
    with pytest.raises(ssa.SSAInputError, match="key check failed"):
        s1.add_client_hint(1, hint, digest)
