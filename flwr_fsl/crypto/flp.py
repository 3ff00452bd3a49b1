"""A fully linear proof that a secret-shared vector is a bit vector, over F_p with p = 2^61 - 1.

Boneh, Boyle, Corrigan-Gibbs, Gilboa and Ishai, "Zero-Knowledge Proofs on Secret-Shared Data
via Fully Linear PCPs" (Crypto 2019), §4 (the polynomial-identity FLP with a parallel-sum
gadget, as in Prio3's ``SumVec``, draft-irtf-cfrg-vdaf §7.4): a prover who knows ``y in F_p^N``
convinces two verifiers, each holding an additive share of ``y`` and of the proof, that every
``y_k`` is 0 or 1. Each verifier's work is *linear* in its shares; the verifiers add their
short *verifier shares* (``c + 2`` field elements) and decide on the sum, which is
zero-knowledge: it is the same for every bit vector.

**Construction.** Pad ``y`` with zeros to ``m * c`` and lay it out as ``m`` rows of ``c``
(:class:`FLPShape`). Wire polynomial ``f_j`` (degree ``<= m``) interpolates column ``j`` at
nodes ``1..m`` and a random *wire seed* at node 0. With joint randomness ``r in F_p^c`` the
gadget is ``G_r(x) = sum_j r_j (x_j^2 - x_j)`` and the proof polynomial
``p = G_r(f_1, ..., f_c)`` (degree ``<= 2m``); the proof is the ``c`` wire seeds and
``p(0), ..., p(2m)``. With query randomness ``t`` (a point outside ``0..2m``) and
``rho in F_p^m`` each verifier computes its shares of ``f_j(t)`` (Lagrange at nodes ``0..m``),
``p(t)`` (Lagrange at ``0..2m``) and ``out = sum_i rho_i p(i)``; the sums are accepted iff
``out = 0`` and ``p(t) = G_r(f(t))``.

**Soundness.** Let ``e_k = y_k^2 - y_k`` with some ``e_k != 0``. If ``r`` is drawn after
``y`` is fixed, ``E r != 0`` (``E`` the ``m x c`` matrix of ``e``) except with probability
``1/p``. A proof polynomial other than ``G_r o f`` agrees with it at a random ``t`` with
probability at most ``2m / (p - 2m - 1)``; if it is ``G_r o f`` then ``p(i) = (E r)_i`` and
``sum_i rho_i (E r)_i = 0`` with probability ``1/p``. So a cheating prover is accepted with
probability at most ``(2m + 2) / (p - 2m - 1)`` per ``(r, t, rho)``, about ``2^-50`` for
``m = 2^10`` (:func:`soundness_error`). ``t`` and ``rho`` must be unknown to the prover when it
commits its shares (the verifiers draw them); ``r`` may be derived by Fiat-Shamir from a
commitment to *both* input shares (Prio3's joint randomness), which a prover can re-draw only by
re-sharing: each try succeeds with probability ``1/p``.

**Zero knowledge.** ``t`` is never a node, so ``lambda_0(t) != 0`` and each ``f_j(t)`` is
uniform (the wire seed is uniform); ``p(t) = G_r(f(t))`` and ``out = 0`` for an honest prover.

Field arithmetic is exact on ``uint64`` arrays (:func:`mul`: 32-bit halves, Mersenne folding);
scalars and Lagrange coefficients are Python integers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.kernels.field61 import matmul_mod61

__all__ = [
    "DEFAULT_CALLS",
    "MODULUS",
    "FLPShape",
    "add",
    "decide",
    "decide_words",
    "field_words",
    "lagrange_at",
    "mul",
    "neg",
    "prove",
    "query",
    "reduce",
    "soundness_error",
    "sub",
    "sum_mod",
]

MODULUS = (1 << 61) - 1
"""The Mersenne prime ``p = 2^61 - 1``."""
_P = np.uint64(MODULUS)
_M32 = np.uint64(0xFFFFFFFF)
_M29 = np.uint64((1 << 29) - 1)
_S61 = np.uint64(61)
_S32 = np.uint64(32)
_S29 = np.uint64(29)
_EIGHT = np.uint64(8)

_U64Array = NDArray[np.uint64]
_Words = NDArray[np.uint64] | np.uint64

DEFAULT_CALLS = 64
"""Gadget calls of the default :class:`FLPShape` (fewer when there are fewer inputs)."""


def _fold(s: _Words) -> _U64Array:
    """Reduce values below ``2^63`` to ``[0, p)``."""
    t = np.asarray((s & _P) + (s >> _S61), np.uint64)
    return np.asarray(t - _P * (t >= _P), np.uint64)


def reduce(a: _Words) -> _U64Array:
    """Reduce any uint64 words to ``[0, p)`` (``a mod p``)."""
    a = np.asarray(a, np.uint64)
    return _fold(_fold(a & _P) + (a >> _S61))


def add(a: _Words, b: _Words) -> _U64Array:
    """Return ``a + b mod p`` (elementwise, canonical inputs)."""
    s = np.asarray(a, np.uint64) + np.asarray(b, np.uint64)
    return s - _P * (s >= _P)


def neg(a: _U64Array) -> _U64Array:
    """Return ``-a mod p``."""
    a = np.asarray(a, np.uint64)
    return (_P - a) * (a != 0)


def sub(a: _U64Array, b: _U64Array) -> _U64Array:
    """Return ``a - b mod p``."""
    return add(a, neg(b))


def mul(a: _Words, b: _Words) -> _U64Array:
    """Return ``a * b mod p`` (elementwise, canonical inputs, broadcasting)."""
    a = np.asarray(a, np.uint64)
    b = np.asarray(b, np.uint64)
    ah, al = a >> _S32, a & _M32
    bh, bl = b >> _S32, b & _M32
    mid = ah * bl + al * bh  # < 2^62
    low = al * bl  # < 2^64, exact
    # a*b = ah*bh*2^64 + mid*2^32 + low; 2^64 = 8 and 2^61 = 1 mod p.
    s = _EIGHT * (ah * bh) + (mid >> _S29) + ((mid & _M29) << _S32)
    s = s + (low >> _S61) + (low & _P)  # < 3 * 2^61 + 2^34 < 2^63
    return _fold(s)


def sum_mod(a: _U64Array, axis: int | None = None) -> _U64Array:
    """Sum of canonical elements mod p along ``axis`` (exact for up to 2^32 terms)."""
    a = np.asarray(a, np.uint64)
    hi = np.sum(a >> _S32, axis=axis, dtype=np.uint64)  # < 2^29 * n
    lo = np.sum(a & _M32, axis=axis, dtype=np.uint64)  # < 2^32 * n
    return add(mul(_fold(hi), np.uint64(1 << 32)), _fold(lo))


def field_words(stream: PRGStream, n: int) -> _U64Array:
    """Draw ``n`` field elements from a PRG stream (61-bit words; ``p`` itself maps to 0)."""
    w = stream.words(n) >> np.uint64(3)
    return np.where(w == _P, np.uint64(0), w)


def lagrange_at(x: int, nodes: int) -> _U64Array:
    """Return ``lambda_i(x)`` for the Lagrange basis on nodes ``0..nodes-1`` (``x`` not a node).

    Raises
    ------
    ConfigurationError
        If ``x`` is one of the nodes.
    """
    x %= MODULUS
    if x < nodes:
        raise ConfigurationError(f"query point {x} is an interpolation node")
    total = 1
    for j in range(nodes):
        total = total * (x - j) % MODULUS
    out = np.empty(nodes, np.uint64)
    # w_i = 1 / prod_{j != i} (i - j) = (-1)^(n-1-i) / (i! (n-1-i)!)
    fact = [1] * nodes
    for i in range(1, nodes):
        fact[i] = fact[i - 1] * i % MODULUS
    denoms = [fact[i] * fact[nodes - 1 - i] % MODULUS * (x - i) % MODULUS for i in range(nodes)]
    for i, inv in enumerate(_batch_inverse(denoms)):
        val = total * inv % MODULUS
        if (nodes - 1 - i) % 2:
            val = (MODULUS - val) % MODULUS
        out[i] = val
    return out


def _batch_inverse(values: list[int]) -> list[int]:
    """Inverses mod p of nonzero values with one exponentiation (Montgomery's trick)."""
    prefix = [1] * (len(values) + 1)
    for i, v in enumerate(values):
        prefix[i + 1] = prefix[i] * v % MODULUS
    inv = pow(prefix[-1], MODULUS - 2, MODULUS)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % MODULUS
        inv = inv * values[i] % MODULUS
    return out


@functools.lru_cache(maxsize=32)
def _lagrange_matrix(start: int, stop: int, rows: int) -> _U64Array:
    """Return ``lambda_i(x)`` for ``x`` in ``range(start, stop)`` (cached: shape only)."""
    lam = np.empty((stop - start, rows), np.uint64)
    for n, x in enumerate(range(start, stop)):
        lam[n] = lagrange_at(x, rows)
    lam.setflags(write=False)
    return lam


def _extrapolate(values: _U64Array, points: range) -> _U64Array:
    """Evaluate the columns' interpolants (nodes ``0..rows-1``) at ``points``."""
    rows = values.shape[0]
    lam = _lagrange_matrix(points.start, points.stop, rows)
    out = np.empty((len(points), values.shape[1]), np.uint64)
    matmul_mod61(lam, np.ascontiguousarray(values), out)
    return out


@dataclass(frozen=True)
class FLPShape:
    """The proof's layout for ``length`` inputs: ``calls`` rows of ``width`` wires.

    Parameters
    ----------
    length : int
        Inputs ``N >= 1``.
    width : int, optional
        Wires per gadget call ``c`` (default ``ceil(N / 64)``: at most :data:`DEFAULT_CALLS`
        gadget calls, so the prover's ``O(N m)`` extrapolation stays cheap; the proof is
        ``c + 2m + 1`` and the verifier share ``c + 2`` words).

    Raises
    ------
    ConfigurationError
        If ``length`` or ``width`` is not a positive integer.
    """

    length: int
    width: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ConfigurationError(f"length must be an integer >= 1, got {self.length!r}")
        if self.width == 0:
            object.__setattr__(self, "width", max(1, -(-self.length // DEFAULT_CALLS)))
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ConfigurationError(f"width must be an integer >= 1, got {self.width!r}")

    @property
    def calls(self) -> int:
        """Gadget calls ``m = ceil(N / c)``."""
        return -(-self.length // self.width)

    @property
    def proof_length(self) -> int:
        """Proof words: ``c`` wire seeds and ``2m + 1`` values of the proof polynomial."""
        return self.width + 2 * self.calls + 1

    @property
    def verifier_length(self) -> int:
        """Verifier-share words: ``f(t)`` (``c``), ``p(t)`` and ``out``."""
        return self.width + 2

    def wires(self, inputs: _U64Array, seeds: _U64Array) -> _U64Array:
        """Return the ``(m + 1, c)`` wire table: seeds at node 0, inputs (zero-padded) below."""
        table = np.zeros((self.calls + 1, self.width), np.uint64)
        table[0] = seeds
        table[1:].reshape(-1)[: self.length] = inputs
        return table


def soundness_error(shape: FLPShape) -> float:
    """Probability that a non-bit vector passes one ``(r, t, rho)`` draw (module docstring)."""
    m = shape.calls
    return (2 * m + 2) / (MODULUS - 2 * m - 1)


def prove(shape: FLPShape, inputs: _U64Array, joint: _U64Array, stream: PRGStream) -> _U64Array:
    """Return the proof (``shape.proof_length`` field elements) that ``inputs`` are bits.

    Parameters
    ----------
    shape : FLPShape
        The layout.
    inputs : numpy.ndarray
        ``N`` field elements (0 or 1 for an honest prover).
    joint : numpy.ndarray
        The joint randomness ``r`` (``c`` field elements).
    stream : PRGStream
        Secret randomness for the wire seeds.
    """
    seeds = field_words(stream, shape.width)
    table = shape.wires(np.asarray(inputs, np.uint64), seeds)
    m = shape.calls
    ext = _extrapolate(table, range(m + 1, 2 * m + 1))
    full = np.concatenate([table, ext])  # f_j(0..2m)
    gadget = sum_mod(mul(joint[None, :], sub(mul(full, full), full)), axis=1)
    return np.concatenate([seeds, gadget])


def query(
    shape: FLPShape,
    inputs: _U64Array,
    proof: _U64Array,
    joint: _U64Array,
    point: int,
    rho: _U64Array,
) -> _U64Array:
    """Return one verifier's share ``(f_1(t), ..., f_c(t), p(t), out)`` (linear in its shares).

    Parameters
    ----------
    shape : FLPShape
        The layout.
    inputs, proof : numpy.ndarray
        This verifier's shares of the inputs and of the proof.
    joint : numpy.ndarray
        The joint randomness (unused by the linear queries; kept for symmetry with
        :func:`decide`).
    point : int
        The query point ``t`` (not in ``0..2m``).
    rho : numpy.ndarray
        ``m`` field elements combining the gadget outputs.

    Raises
    ------
    ConfigurationError
        If ``point`` is an interpolation node or a share has the wrong length.
    """
    del joint
    m = shape.calls
    if proof.shape != (shape.proof_length,) or rho.shape != (m,):
        raise ConfigurationError("proof or rho has the wrong length for the FLP shape")
    table = shape.wires(np.asarray(inputs, np.uint64), proof[: shape.width])
    poly = proof[shape.width :]
    f_t = sum_mod(mul(lagrange_at(point, m + 1)[:, None], table), axis=0)
    p_t = sum_mod(mul(lagrange_at(point, 2 * m + 1), poly))
    out = sum_mod(mul(rho, poly[1 : m + 1]))
    return np.concatenate([f_t, np.array([p_t, out], np.uint64)])


def decide(shape: FLPShape, verifier: _U64Array, joint: _U64Array) -> bool:
    """Decide on the *sum* of both verifier shares: ``out = 0`` and ``p(t) = G_r(f(t))``."""
    if verifier.shape != (shape.verifier_length,):
        return False
    return decide_words(verifier, joint)


def decide_words(verifier: _U64Array, joint: _U64Array) -> bool:
    """Like :func:`decide`, the shape read off the lengths (``c`` joint words, ``c + 2``)."""
    if verifier.ndim != 1 or joint.ndim != 1 or verifier.shape[0] != joint.shape[0] + 2:
        return False
    f_t = verifier[:-2]
    p_t, out = int(verifier[-2]), int(verifier[-1])
    want = int(sum_mod(mul(joint, sub(mul(f_t, f_t), f_t))))
    return out == 0 and p_t == want
