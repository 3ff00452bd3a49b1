"""PrivHFL's DCF comparison after session 35's fusions (issue 26).

* The ReLU share kernels (:func:`~flwr_fsl.kernels.dcf_kernels.open_points`,
  :func:`~flwr_fsl.kernels.dcf_kernels.relu_shares`) give the words of the numpy form they
  replace (kept here as the reference), for any inputs.
* ``S`` still refuses a querier's non-canonical DCF public part at decode, before it forwards
  it (the querier is blamed); ``A``, which defers the check to its evaluation, refuses one that
  reached it (the relay) with the same reason and drops the session, releasing no share.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto.ring import Z2_64
from flwr_fsl.families.privhfl import protocol as privhfl
from flwr_fsl.families.privhfl.inference import (
    Architecture,
    Linear,
    ReLU,
    SecureModel,
    error_bound,
    plaintext_forward,
)
from flwr_fsl.families.privhfl.protocol import (
    PrivHFLConfig,
    QuerierMessageError,
    secure_predict,
)
from flwr_fsl.kernels import dcf_kernels as _k

U64 = np.uint64
WORDS = st.integers(0, 2**64 - 1)


def _reference(
    mine: np.ndarray, peer: np.ndarray, out: np.ndarray, shares: tuple, l_bits: int, party: int
) -> np.ndarray:
    """The numpy form of ``_Evaluator._dcf_finish`` before session 35 (word for word)."""
    r, q, rq = shares
    ring = Z2_64
    x_hat = ring.add(mine, peer)
    p = (ring.add(x_hat, U64(1 << l_bits)) >> U64(l_bits)) & U64(1)
    sign = ring.sub(U64(1), ring.mul(U64(2), p))
    drelu = ring.mul(sign, ring.add(q, out[:, 0]))
    bxr = ring.add(ring.mul(sign, ring.add(rq, out[:, 1])), ring.mul(p, r))
    if party == 0:
        drelu = ring.add(drelu, p)
    return ring.sub(ring.mul(x_hat, drelu), bxr)


@settings(max_examples=80, deadline=None)
@given(
    words=st.lists(WORDS, min_size=7, max_size=7 * 12),
    l_bits=st.integers(1, 62),
    party=st.integers(0, 1),
)
def test_relu_kernels_match_the_numpy_form(words: list[int], l_bits: int, party: int) -> None:
    n = len(words) // 7
    w = np.array(words[: 7 * n], dtype=U64).reshape(7, n)
    mine, peer, r, q, rq = w[0], w[1], w[2], w[3], w[4]
    out = np.ascontiguousarray(w[5:7].T)
    x_hat, points, relu = (np.empty(n, U64) for _ in range(3))
    _k.open_points(mine, peer, l_bits, x_hat, points)
    assert np.array_equal(x_hat, mine + peer)
    assert np.array_equal(points, x_hat & U64((1 << l_bits) - 1))
    _k.relu_shares(x_hat, out, (r, q, rq), l_bits, party, relu)
    assert np.array_equal(relu, _reference(mine, peer, out, (r, q, rq), l_bits, party))


def _model() -> SecureModel:
    rng = np.random.default_rng(5)
    arch = Architecture((6,), (Linear(6, 12), ReLU(), Linear(12, 3)))
    w1, b1 = rng.uniform(-1, 1, (12, 6)), rng.uniform(-1, 1, 12)
    return SecureModel(arch, ((w1, b1), (rng.uniform(-1, 1, (3, 12)), np.zeros(3))))


def _non_canonical(what: str):  # type: ignore[no-untyped-def]
    def how(data: bytes) -> bytes:
        raw = bytearray(data)
        head = raw.rfind(b"FDCF")
        n, m = raw[head + 7], int.from_bytes(raw[head + 12 : head + 16], "little")
        at = head + 24  # the public part's body: cw_seeds[0, 0] first
        if what == "seed":
            raw[at + 16 * 5] |= 1  # level 0, key 5
        else:  # cw_bits follow the m keys' seeds and values (tau 2) on n levels
            raw[at + 2 * 16 * n * m + 7] = 9  # level 0, key 7
        return bytes(raw)

    return how


@pytest.mark.parametrize(
    ("what", "reason"),
    [("seed", "seed corrections must have bit 0 clear"), ("bits", "cw_bits entries")],
)
def test_non_canonical_public_parts_are_refused_by_both_evaluators(what: str, reason: str) -> None:
    x = np.random.default_rng(1).uniform(-1, 1, (2, 6))
    cfg = PrivHFLConfig(comparison="dcf")
    target = ("Q", "S", privhfl.DCF_KEYS)
    with pytest.raises(QuerierMessageError, match=f"DCF public part: {reason}"):
        secure_predict(
            [_model()], x, cfg, tamper=lambda s, r, k, d: _hook(target, what, s, r, k, d)
        )
    relay = ("S", "A1", privhfl.DCF_KEYS)
    res = secure_predict(
        [_model(), _model()], x, cfg, tamper=lambda s, r, k, d: _hook(relay, what, s, r, k, d)
    )
    assert res.included == (0,)
    assert f"DCF public part: {reason}" in res.dropped[1]
    model = _model()  # A0's session alone, unharmed
    bound = error_bound(model, 1.0) + 1e-5
    assert np.max(np.abs(res.logits - plaintext_forward(model, x))) <= bound


def _hook(target: tuple, what: str, s: str, r: str, k: int, d: bytes) -> bytes:  # type: ignore[type-arg]
    return _non_canonical(what)(d) if (s, r, k) == target else d
