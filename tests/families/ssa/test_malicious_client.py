"""Known gap, shown as an attack: what one client that ignores the protocol can do to SSA.

The threat model is semi-honest clients. A client that builds its own DPF keys (instead of
using :func:`~flwr_fsl.families.ssa.protocol.encode_update`) can give any element any payload in
Z_2^64, negative count words included, and neither server can tell: they only evaluate keys
they cannot open. Cui et al. §3.1 cite a sketching check (Boneh et al.) for this; it is not
implemented (README, threat model). These tests pin down exactly what the README claims one
such client can do, so the statement stays true: erase an honest client's update at an
element (its sum and count cancel to zero, so the element looks untouched), or wrap a sum.
If a well-formedness check is added, these tests must change with the README.
"""

from __future__ import annotations

import numpy as np
import pytest

import flwr_fsl.families.ssa.protocol as ssa
from flwr_fsl.families.ssa.protocol import SSAParams, SSAServer, encode_update, reconstruct

PARAMS = SSAParams(
    round_id=1, domain_size=64, num_items=4, value_width=1, hash_key=bytes(range(16))
)


def _aggregate(uploads: list[ssa.SSAUpload]) -> ssa.SSAResult:
    servers = [SSAServer(PARAMS, party) for party in (0, 1)]
    for client, upload in enumerate(uploads):
        for party, server in enumerate(servers):
            server.add_client(client, upload.public_part, upload.master_seeds[party])
    return reconstruct(PARAMS, servers[0].share(), servers[1].share())


def _crafted(monkeypatch: pytest.MonkeyPatch, index: int, words: np.ndarray) -> ssa.SSAUpload:
    """Keys a malicious client makes for one element with payload words of its choosing."""
    with monkeypatch.context() as patch:
        patch.setattr(ssa, "payload_words", lambda *_a, **_k: words.reshape(1, -1))
        upload, _ = encode_update(PARAMS, [index], [[0.0]], 1.0)
    return upload


def test_known_gap_one_client_can_erase_an_honest_update(monkeypatch: pytest.MonkeyPatch) -> None:
    honest, _ = encode_update(PARAMS, [5, 9], [[0.5], [0.25]], 3.0)
    baseline = _aggregate([honest])
    assert baseline.counts is not None and baseline.counts[5] == 3.0
    # The negation in the ring of the honest client's words at element 5 (sum 1.5, count 3).
    honest_words = PARAMS.fixed_point.encode(np.array([[1.5, 3.0]]))
    attack = _crafted(monkeypatch, 5, (np.uint64(0) - honest_words).astype(np.uint64))
    result = _aggregate([honest, attack])  # both servers accept the crafted keys
    assert result.counts is not None
    assert result.counts[5] == 0.0 and result.sums[5, 0] == 0.0  # element 5 looks untouched
    assert result.counts[9] == 3.0  # elements the attacker did not target are exact


def test_known_gap_one_client_can_wrap_a_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    honest, _ = encode_update(PARAMS, [5], [[0.5]], 1.0)
    one = PARAMS.fixed_point.encode(np.array([[1.0]]))[0, 0]
    huge = np.array([[1 << 62, one]], dtype=np.uint64)  # a sum far outside max_abs, count 1
    result = _aggregate([honest, _crafted(monkeypatch, 5, huge)])
    assert result.counts is not None and result.counts[5] == 2.0
    assert abs(result.sums[5, 0]) > 1e6 * PARAMS.max_abs  # accepted, and garbage
