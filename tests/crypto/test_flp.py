"""The bit-vector FLP over F_(2^61 - 1) (flwr_fsl.crypto.flp): arithmetic, soundness."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto import flp
from flwr_fsl.crypto.prg import PRGStream

P = flp.MODULUS
elements = st.integers(0, P - 1)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(elements, elements), min_size=1, max_size=40))
def test_field_ops_match_python_integers(pairs: list[tuple[int, int]]) -> None:
    a = np.array([x for x, _ in pairs], np.uint64)
    b = np.array([y for _, y in pairs], np.uint64)
    assert [int(v) for v in flp.mul(a, b)] == [x * y % P for x, y in pairs]
    assert [int(v) for v in flp.add(a, b)] == [(x + y) % P for x, y in pairs]
    assert [int(v) for v in flp.sub(a, b)] == [(x - y) % P for x, y in pairs]
    assert int(flp.sum_mod(a)) == sum(x for x, _ in pairs) % P


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40))
def test_reduce_is_mod_p(words: list[int]) -> None:
    assert [int(v) for v in flp.reduce(np.array(words, np.uint64))] == [w % P for w in words]


def _share(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    other = flp.field_words(PRGStream.fresh(), n)
    return flp.sub(x, other), other


def _verify(shape: flp.FLPShape, y: np.ndarray, proof: np.ndarray, joint: np.ndarray) -> bool:
    y0, y1 = _share(y, y.shape[0])
    p0, p1 = _share(proof, proof.shape[0])
    t = random.randrange(2 * shape.calls + 1, P)
    rho = flp.field_words(PRGStream.fresh(), shape.calls)
    v = flp.add(flp.query(shape, y0, p0, joint, t, rho), flp.query(shape, y1, p1, joint, t, rho))
    return flp.decide(shape, v, joint)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 400), width=st.integers(0, 30), seed=st.integers(0, 2**16))
def test_bit_vectors_are_accepted(n: int, width: int, seed: int) -> None:
    shape = flp.FLPShape(n, width)
    y = np.random.default_rng(seed).integers(0, 2, n).astype(np.uint64)
    joint = flp.field_words(PRGStream.fresh(), shape.width)
    proof = flp.prove(shape, y, joint, PRGStream.fresh())
    assert proof.shape == (shape.proof_length,)
    assert _verify(shape, y, proof, joint)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 300),
    width=st.integers(0, 20),
    where=st.integers(0, 10**6),
    bad=st.one_of(st.integers(2, P - 1), st.sampled_from([2, P - 1, (P + 1) // 2])),
)
def test_one_non_bit_is_rejected_even_with_an_honest_proof_for_it(
    n: int, width: int, where: int, bad: int
) -> None:
    shape = flp.FLPShape(n, width)
    y = np.random.default_rng(where).integers(0, 2, n).astype(np.uint64)
    y[where % n] = np.uint64(bad)
    joint = flp.field_words(PRGStream.fresh(), shape.width)
    proof = flp.prove(shape, y, joint, PRGStream.fresh())  # G_r o f: then out != 0
    assert not _verify(shape, y, proof, joint)


def test_a_proof_whose_gadget_outputs_say_zero_fails_at_the_query_point() -> None:
    """The other cheat: p(1..m) = 0 so that ``out = 0``; then ``p != G_r o f`` and ``p(t)`` is
    caught except with probability ``<= 2m / p`` (no accept in 200 independent draws)."""
    shape = flp.FLPShape(64, 8)
    y = np.zeros(64, np.uint64)
    y[5] = 3
    joint = flp.field_words(PRGStream.fresh(), shape.width)
    proof = flp.prove(shape, y, joint, PRGStream.fresh())
    proof[shape.width + 1 : shape.width + 1 + shape.calls] = 0
    assert sum(_verify(shape, y, proof, joint) for _ in range(200)) == 0
    assert flp.soundness_error(shape) < 2.0**-55


def test_a_tampered_proof_word_is_rejected() -> None:
    shape = flp.FLPShape(100)
    y = np.ones(100, np.uint64)
    joint = flp.field_words(PRGStream.fresh(), shape.width)
    proof = flp.prove(shape, y, joint, PRGStream.fresh())
    for j in (0, shape.width, shape.proof_length - 1):
        bad = proof.copy()
        bad[j] = flp.add(bad[j : j + 1], np.ones(1, np.uint64))[0]
        assert not _verify(shape, y, bad, joint)


def test_a_query_point_on_a_node_is_refused() -> None:
    shape = flp.FLPShape(10, 2)
    with pytest.raises(ConfigurationError, match="node"):
        flp.query(
            shape,
            np.zeros(10, np.uint64),
            np.zeros(shape.proof_length, np.uint64),
            np.zeros(2, np.uint64),
            3,
            np.zeros(shape.calls, np.uint64),
        )


def test_shape_validation() -> None:
    with pytest.raises(ConfigurationError, match="length"):
        flp.FLPShape(0)
    with pytest.raises(ConfigurationError, match="width"):
        flp.FLPShape(5, -1)
    assert flp.FLPShape(10**6).calls <= flp.DEFAULT_CALLS
