"""Range check of a client's SSA value words on the servers' shares (issue 21 item 4).

In every round with :attr:`SSAParams.value_check
<flwr_fsl.families.ssa.messages.SSAParams.value_check>` ``"exact"`` (a checked round that opts
in: the default is the projected check, :mod:`flwr_fsl.families.ssa.projected_check`, which
runs this module's machinery on ``r`` projections of the words) both servers run it
(:mod:`flwr_fsl.families.ssa.verify`). Given, per value word
``n``, the two servers' Z_2^64 shares ``v^(0)_n + v^(1)_n = v_n`` (the sum of a key's value
word over its evaluated points, which the key check makes the word at its one nonzero point),
the servers verify ``-bound <= v_n <= bound`` (signed fixed point, ``bound =
ceil(max_abs * 2^frac_bits)``: :func:`round_bound`) for every ``n``, exchanging only a digest
that is equal for honest clients and a short zero-knowledge verifier share.

**Why not a random linear check over Z_2^64.** An error of high 2-adic valuation (``2^63``)
survives a random combination with probability 1/2. The check below never combines ring
values at random: every Z_2^64 relation is checked *exactly* (both servers hash a whole vector
that is equal for honest clients), and the only random check runs in the prime field
F_p, ``p = 2^61 - 1`` (:mod:`flwr_fsl.crypto.flp`).

**Construction** (``R = 2 bound``, ``L = bit_length(R)``, coefficients
``c = (1, 2, ..., 2^(L-2), R - 2^(L-1) + 1)`` whose 0/1 combinations are exactly ``[0, R]``;
:func:`coefficients`):

1. *Bits.* The client writes ``a_n = v_n + bound`` as ``a_n = sum_k c_k beta_{n,k}`` with bits
   ``beta`` (:func:`decompose`).
2. *Integer shares with bounded masks.* For each bit the client draws ``u`` uniform in
   ``[0, 2^59)`` from a seed it gives S1 (:class:`RangeUpload` ``seed1``): S1's share is the
   integer ``-u``, S0's is the integer ``x = beta + u`` (for S0 only: in a round it travels in
   the public trailer encrypted under a key derived from S0's key shares). S0 refuses any
   ``x > 2^59``; S1's ``-u`` is in ``(-2^59, 0]`` by construction. So the shared integer
   ``X = x - u`` lies in ``(-2^59, 2^59 + 1)``, and the same shares read mod 2^64 and mod p are
   shares of ``X`` in both. S1's view ``-u`` and S0's view ``x`` are each within statistical
   distance ``2^-59`` of independent of ``beta``.
3. *Bits in F_p.* An FLP (:mod:`flwr_fsl.crypto.flp`) proves every ``X mod p`` is 0 or 1;
   since ``|X| < p - 1`` that makes every ``X`` the integer 0 or 1.
4. *Exact relation in Z_2^64.* Each server computes its share of
   ``sum_k c_k X_{n,k} - bound - v_n`` (S0 subtracts ``bound``); the vectors are equal up to
   sign exactly when every ``v_n = sum_k c_k beta_{n,k} - bound in [-bound, bound]``. S0 hashes
   its vector, S1 the negation of its own (:func:`server_check`): equal digests for honest
   clients, a differing one otherwise.
5. *Randomness.* The FLP's joint randomness ``r`` is Fiat-Shamir from ``part0 = H(blind0, x)``
   and ``part1 = H(seed1)`` (both in the public material; each server recomputes its own part
   and refuses a mismatch, as in Prio3), so it is fixed after both input shares: a client can
   only re-share and try again, each try accepted with probability ``1/p``. The query point
   ``t`` and the combination ``rho`` come from a 16-byte *query seed* S0 draws after receiving
   the upload and sends with its verifier share; S1 uses it. ``t`` is never an interpolation
   node (it is drawn from ``[2m + 1, p)``).

**One query per upload.** The verifier shares are zero-knowledge for one query point: two
answers of S1 on the same upload at different points would give S0 a linear combination of
the client's bits (two evaluations of each wire polynomial eliminate its random seed). S1
answers at most once per client and round (the helper claims the client before evaluating, and
refused uploads get a reason, never a verifier share); the wire seeds are fresh every round.

**False accept.** A client with some ``|v_n| > bound`` passes only if the FLP accepts a non-bit,
probability at most ``(2m + 2)/(p - 2m - 1) + 1/p`` per upload (``m`` the FLP's gadget calls;
:func:`false_accept_bound`), or by a hash collision.

**Cost per client** (``N = values * L`` bits): S0 receives ``N + proof`` words (the integer
shares and its proof share), S1 a 16-byte seed (``u`` and its proof share expand from it),
both 64 public bytes (``part0``, ``part1``); each server sends the other
``32 + 16 + 16 + 8 (c + 2)`` bytes (digest, query seed, joint-randomness key, verifier share).
The client's proof costs ``O(N m)`` field multiplications, each server's check ``O(N)``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto import flp
from flwr_fsl.crypto.dpf import DPFKeyBatch
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.families.ssa.messages import SSAInputError, SSAParams

__all__ = [
    "CHECK_HEAD",
    "MASK_BITS",
    "PreparedServerCheck",
    "RangeUpload",
    "ServerCheck",
    "client_trailer",
    "coefficients",
    "cut_trailer",
    "decompose",
    "false_accept_bound",
    "make_upload",
    "party_key",
    "prepare_server_check",
    "round_bound",
    "round_check",
    "round_shape",
    "same_check",
    "server_check",
    "server_range",
    "split_trailer",
    "trailer_bytes",
    "upload_bits",
]

MASK_BITS = 59
"""Bits of a bit share's mask ``u``: ``2^59 + 1 < p - 1`` keeps the shared integer exact."""
_MASK = np.uint64((1 << MASK_BITS) - 1)
_SEED = 16
_TAG = b"flwr_fsl/ssa-range-check/v1\x00"
_U64Array = NDArray[np.uint64]


def coefficients(bound: int) -> NDArray[np.uint64]:
    """Return the ``L`` bit weights whose 0/1 combinations are exactly ``[0, 2 bound]``.

    Raises
    ------
    ConfigurationError
        If ``bound`` is not an integer in ``[1, 2^61)``.
    """
    if isinstance(bound, bool) or not isinstance(bound, int) or not 1 <= bound < 1 << 61:
        raise ConfigurationError(f"bound must be an integer in [1, 2**61), got {bound!r}")
    r = 2 * bound
    bits = r.bit_length()
    low = [1 << i for i in range(bits - 1)]
    return np.array([*low, r - (1 << (bits - 1)) + 1], np.uint64)


def decompose(values: _U64Array, bound: int) -> _U64Array:
    """Return the ``(n, L)`` bits of ``values + bound`` on :func:`coefficients`.

    ``values`` are signed fixed-point Z_2^64 words.

    Raises
    ------
    ConfigurationError
        If a value is outside ``[-bound, bound]`` (an honest client never has one).
    """
    coef = coefficients(bound)
    signed = np.asarray(values, np.uint64).view(np.int64)
    if signed.size and (signed.min() < -bound or signed.max() > bound):
        raise ConfigurationError(f"a value word is outside [-{bound}, {bound}]")
    a = signed.astype(np.int64) + bound  # in [0, 2 bound]
    top = int(coef[-1])
    half = (1 << (coef.shape[0] - 1)) - 1  # the low bits reach [0, half]
    hi = a > half
    rest = np.where(hi, a - top, a).astype(np.uint64)
    out = np.zeros((a.shape[0], coef.shape[0]), np.uint64)
    for i in range(coef.shape[0] - 1):
        out[:, i] = (rest >> np.uint64(i)) & np.uint64(1)
    out[:, -1] = hi
    return out


def false_accept_bound(values: int, bound: int) -> float:
    """Upper bound on the probability a client with an out-of-range word passes one check."""
    shape = flp.FLPShape(values * coefficients(bound).shape[0])
    return flp.soundness_error(shape) + 1.0 / flp.MODULUS


@dataclass(frozen=True)
class RangeUpload:
    """A client's range-check material for ``values`` words.

    Attributes
    ----------
    shares0 : numpy.ndarray
        S0's integer bit shares ``x = beta + u`` (``(values * L,)`` uint64), S0 only.
    proof0 : numpy.ndarray
        S0's share of the FLP proof (field elements), S0 only.
    blind0 : bytes
        16 bytes binding ``part0`` (S0 only).
    seed1 : bytes
        16 bytes S1 expands into its masks and its proof share (S1 only).
    part0, part1 : bytes
        The joint-randomness parts (public to both servers).
    """

    shares0: _U64Array
    proof0: _U64Array
    blind0: bytes
    seed1: bytes
    part0: bytes
    part1: bytes

    @property
    def s0_bytes(self) -> int:
        """Bytes only S0 receives."""
        return 8 * (self.shares0.size + self.proof0.size) + len(self.blind0)


def _part0(blind0: bytes, shares0: _U64Array) -> bytes:
    return hashlib.sha256(_TAG + b"part0" + blind0 + shares0.astype("<u8").tobytes()).digest()


def _part1(seed1: bytes) -> bytes:
    return hashlib.sha256(_TAG + b"part1" + seed1).digest()


def _joint_key(part0: bytes, part1: bytes) -> bytes:
    return hashlib.sha256(_TAG + b"joint" + part0 + part1).digest()[:_SEED]


def _joint(shape: flp.FLPShape, part0: bytes, part1: bytes) -> _U64Array:
    return flp.field_words(PRGStream(_joint_key(part0, part1)), shape.width)


def _expand1(seed1: bytes, n: int, shape: flp.FLPShape) -> tuple[_U64Array, _U64Array]:
    """S1's masks ``u`` (``n`` words below ``2^59``) and its proof share."""
    masks = PRGStream.from_seed(seed1, 0).words(n) & _MASK
    return masks, flp.field_words(PRGStream.from_seed(seed1, 1), shape.proof_length)


def make_upload(
    values: _U64Array,
    bound: int,
    *,
    seed1: bytes | None = None,
    blind0: bytes | None = None,
    prover: bytes | None = None,
) -> RangeUpload:
    """Client: build the range-check material for its value words (``(n,)`` uint64).

    ``seed1``, ``blind0`` and ``prover`` (the FLP's wire seeds; 16 secret bytes each) default
    to fresh OS randomness.

    Raises
    ------
    ConfigurationError
        If a value is outside ``[-bound, bound]``.
    """
    bits = decompose(values, bound).reshape(-1)
    return upload_bits(bits, seed1=seed1, blind0=blind0, prover=prover)


def upload_bits(
    bits: _U64Array,
    *,
    seed1: bytes | None = None,
    blind0: bytes | None = None,
    prover: bytes | None = None,
) -> RangeUpload:
    """Share and prove a flat vector of claimed bits (:func:`make_upload`'s second half).

    An honest client passes 0/1 words; tests pass other words to play a cheating client (the
    proof is then made for the shared integer as the servers read it, mod p).
    """
    bits = np.asarray(bits, np.uint64)
    shape = flp.FLPShape(max(bits.size, 1))
    seed1 = os.urandom(_SEED) if seed1 is None else seed1
    blind0 = os.urandom(_SEED) if blind0 is None else blind0
    masks, proof1 = _expand1(seed1, bits.size, shape)
    shares0 = bits + masks
    part0, part1 = _part0(blind0, shares0), _part1(seed1)
    joint = _joint(shape, part0, part1)
    inputs = (
        flp.sub(flp.reduce(shares0), flp.reduce(masks)) if bits.size else np.zeros(1, np.uint64)
    )
    stream = PRGStream.fresh() if prover is None else PRGStream.from_seed(prover, 3)
    proof = flp.prove(shape, inputs, joint, stream)
    return RangeUpload(shares0, flp.sub(proof, proof1), blind0, seed1, part0, part1)


@dataclass(frozen=True)
class ServerCheck:
    """One server's range check of one client: its digest and its verifier share.

    Attributes
    ----------
    digest : bytes
        SHA-256 of the tag, both parts, the query seed and this server's (signed) residual
        vector; equal at both servers for an honest client.
    query_seed : bytes
        The 16-byte seed of ``t`` and ``rho`` (S0 draws it, S1 uses S0's).
    verifier : numpy.ndarray
        This server's FLP verifier share.
    joint_key : bytes
        16 bytes the joint randomness expands from (a hash of ``part0 || part1``).
    joint : numpy.ndarray
        The joint randomness.
    """

    digest: bytes
    query_seed: bytes
    joint_key: bytes
    verifier: _U64Array
    joint: _U64Array

    def to_bytes(self) -> bytes:
        """Return ``digest || query_seed || joint_key || verifier`` (little-endian words)."""
        return (
            self.digest + self.query_seed + self.joint_key + self.verifier.astype("<u8").tobytes()
        )


def _query(shape: flp.FLPShape, seed: bytes) -> tuple[int, _U64Array]:
    stream = PRGStream(hashlib.sha256(_TAG + b"query" + seed).digest()[:_SEED])
    nodes = 2 * shape.calls + 1
    t = nodes + int(stream.words(1)[0]) % (flp.MODULUS - nodes)
    return t, flp.field_words(stream, shape.calls)


def _own_shares(
    party: int,
    private: RangeUpload | bytes,
    shape: flp.FLPShape,
    size: int,
    public: tuple[bytes, bytes],
) -> tuple[_U64Array, _U64Array, _U64Array]:
    """Check and return a server's ring shares, field shares and proof share."""
    part0, part1 = public
    if party == 0:
        if not isinstance(private, RangeUpload):
            raise ConfigurationError("S0 checks a RangeUpload")
        shares = np.asarray(private.shares0, np.uint64)
        proof = np.asarray(private.proof0, np.uint64)
        if shares.shape != (size,) or proof.shape != (shape.proof_length,):
            raise SSAInputError("range check: S0's material has the wrong size")
        if not hmac.compare_digest(_part0(private.blind0, shares), part0):
            raise SSAInputError("range check: part0 does not match S0's shares")
        if size and int(shares.max()) > 1 << MASK_BITS:
            raise SSAInputError("range check: a bit share of S0 is out of range")
        if int(proof.max(initial=0)) >= flp.MODULUS:
            raise SSAInputError("range check: S0's proof share is not a field element")
        return shares, shares, proof  # shares < 2^59 + 1 < p: already canonical
    if not isinstance(private, bytes) or len(private) != _SEED:
        raise SSAInputError("range check: S1's seed must be 16 bytes")
    if not hmac.compare_digest(_part1(private), part1):
        raise SSAInputError("range check: part1 does not match S1's seed")
    masks, proof = _expand1(private, size, shape)
    return np.uint64(0) - masks, flp.neg(masks), proof


def server_check(
    party: int,
    value_shares: _U64Array,
    bound: int,
    public: tuple[bytes, bytes],
    private: RangeUpload | bytes,
    query_seed: bytes | None = None,
) -> ServerCheck:
    """Server ``party``: check a client's range material against its value-word shares.

    Parameters
    ----------
    party : int
        0 (S0) or 1 (S1).
    value_shares : numpy.ndarray
        This server's Z_2^64 shares of the client's value words, ``(n,)``.
    bound : int
        The fixed-point bound.
    public : tuple[bytes, bytes]
        ``(part0, part1)`` as the client sent them.
    private : RangeUpload or bytes
        S0: the client's upload (only ``shares0``, ``proof0``, ``blind0`` are read); S1: its
        16-byte ``seed1``.
    query_seed : bytes, optional
        S1: S0's; None (S0, or a server checked alone): a fresh one.

    Raises
    ------
    SSAInputError
        If this server's part does not match its material, a share of S0 exceeds ``2^59``,
        the material has the wrong size, or the query seed is malformed.
    ConfigurationError
        If ``party`` is not 0 or 1.
    """
    n = np.asarray(value_shares).shape[0]
    return prepare_server_check(party, n, bound, public, private, query_seed).finish(value_shares)


@dataclass(frozen=True)
class PreparedServerCheck:
    """:func:`server_check`'s work that does not read the value-word shares (its checks too).

    :func:`prepare_server_check` makes it (every check that can refuse the client), then
    :meth:`finish` adds the residual digest: the SSA servers prepare while they evaluate the
    client's keys, whose sums are the value-word shares.
    """

    party: int
    n: int
    bound: int
    public: tuple[bytes, bytes]
    query_seed: bytes
    ring: _U64Array
    verifier: _U64Array
    joint: _U64Array
    joint_key: bytes

    def finish(self, value_shares: _U64Array) -> ServerCheck:
        """Return the :class:`ServerCheck` for this server's value-word shares ``(n,)``.

        Raises
        ------
        ConfigurationError
            If ``value_shares`` does not have the ``n`` words it was prepared for.
        """
        coef, n = coefficients(self.bound), self.n
        shares = np.asarray(value_shares, np.uint64)
        if shares.shape != (n,):
            raise ConfigurationError(f"expected {n} value-word shares, got {shares.shape}")
        part0, part1 = self.public
        # Exact Z_2^64 relation: share of sum_k c_k X_{n,k} - bound - v_n (S0 subtracts bound).
        residual = (self.ring.reshape(n, coef.shape[0]) * coef[None, :]).sum(
            axis=1, dtype=np.uint64
        )
        residual = residual - shares
        if self.party == 0:
            residual = residual - np.uint64(self.bound)
        else:
            residual = np.uint64(0) - residual
        digest = hashlib.sha256(
            _TAG + part0 + part1 + self.query_seed + residual.astype("<u8").tobytes()
        ).digest()
        return ServerCheck(digest, self.query_seed, self.joint_key, self.verifier, self.joint)


def prepare_server_check(
    party: int,
    n: int,
    bound: int,
    public: tuple[bytes, bytes],
    private: RangeUpload | bytes,
    query_seed: bytes | None = None,
) -> PreparedServerCheck:
    """:func:`server_check` for ``n`` value words, all but the residual digest.

    The same arguments as :func:`server_check` (``n`` in place of the shares), the same
    checks in the same order and the same errors; :meth:`PreparedServerCheck.finish` with the
    shares returns :func:`server_check`'s result.
    """
    if party not in (0, 1):
        raise ConfigurationError(f"party must be 0 or 1, got {party!r}")
    coef = coefficients(bound)
    size = n * coef.shape[0]
    shape = flp.FLPShape(max(size, 1))
    part0, part1 = public
    if query_seed is None:  # the first to check draws it (S0)
        query_seed = os.urandom(_SEED)
    if len(query_seed) != _SEED:
        raise SSAInputError("range check: the query seed must be 16 bytes")
    ring, field, proof = _own_shares(party, private, shape, size, public)
    joint = _joint(shape, part0, part1)
    t, rho = _query(shape, query_seed)
    inputs = field if size else np.zeros(1, np.uint64)
    verifier = flp.query(shape, inputs, proof, joint, t, rho)
    joint_key = _joint_key(part0, part1)
    return PreparedServerCheck(
        party, n, bound, (part0, part1), query_seed, ring, verifier, joint, joint_key
    )


CHECK_HEAD = 32 + 2 * _SEED
"""Bytes of a check blob before its verifier words: digest, query seed, joint key."""


def same_check(mine: bytes, other: bytes) -> bool:
    """Decide on both servers' :meth:`ServerCheck.to_bytes` (symmetric: both decide alike).

    True iff the digests, query seeds and joint keys are equal and the FLP accepts the sum of
    the verifier shares (their length gives the FLP's width).
    """
    if not isinstance(mine, bytes) or not isinstance(other, bytes):
        return False
    if len(mine) != len(other) or len(mine) < CHECK_HEAD + 24 or len(mine) % 8:
        return False
    if not hmac.compare_digest(mine[:CHECK_HEAD], other[:CHECK_HEAD]):
        return False
    a = np.frombuffer(mine[CHECK_HEAD:], "<u8").astype(np.uint64)
    b = np.frombuffer(other[CHECK_HEAD:], "<u8").astype(np.uint64)
    if max(int(a.max()), int(b.max())) >= flp.MODULUS:
        return False
    width = a.shape[0] - 2
    joint = flp.field_words(PRGStream(mine[32 + _SEED : CHECK_HEAD]), width)
    return flp.decide_words(flp.add(a, b), joint)


def fixed_point_bound(max_abs: float, frac_bits: int) -> int:
    """``ceil(max_abs * 2^frac_bits)``: the largest word the codec writes for ``|x| <= max_abs``."""
    return math.ceil(max_abs * 2.0**frac_bits)


# ------------------------------------------------------------------------------------------------
# In a round: the range material travels as a trailer of the client's public part (fresh keys)
# or of its U-DPF hint. S0's words are encrypted under a key only S0 can derive (from its own
# key shares), S1's seed is derived from S1's key shares; ``part0`` and ``part1`` are in clear.
# ------------------------------------------------------------------------------------------------


def round_bound(params: SSAParams) -> int:
    """Return the round's bound on a value word: ``ceil(max_abs * 2^frac_bits)``."""
    return fixed_point_bound(params.max_abs, params.frac_bits)


def round_shape(params: SSAParams) -> flp.FLPShape:
    """Return the FLP layout of a round: ``num_keys * value_width * L`` bits."""
    bits = params.num_keys * params.value_width * coefficients(round_bound(params)).shape[0]
    return flp.FLPShape(max(bits, 1))


def trailer_bytes(params: SSAParams) -> int:
    """Bytes of a client's range trailer in a checked round."""
    shape = round_shape(params)
    bits = params.num_keys * params.value_width * coefficients(round_bound(params)).shape[0]
    return 8 * (bits + shape.proof_length) + 64


def party_key(params: SSAParams, keys: DPFKeyBatch) -> bytes:
    """16 secret bytes one server (and the client) derive from that server's key shares."""
    head = _TAG + b"party" + bytes([keys.party])
    head += int(params.round_id).to_bytes(8, "little") + int(params.epoch).to_bytes(8, "little")
    h = hashlib.sha256(head)
    h.update(np.ascontiguousarray(keys.root_seeds, "<u8").reshape(-1).view(np.uint8).data)
    return h.digest()[:_SEED]  # the seeds' little-endian bytes, hashed where they lie


def _pad(key: bytes, n: int) -> _U64Array:
    return PRGStream.from_seed(key, 2).words(n)


def client_trailer(
    params: SSAParams, keys: tuple[DPFKeyBatch, DPFKeyBatch], betas: _U64Array
) -> bytes:
    """Client: the range trailer for its keys' payload ``betas`` (``(keys, key_tau)``).

    Raises
    ------
    ConfigurationError
        If a value word is outside the round's bound (the codec never writes one).
    """
    values = np.ascontiguousarray(betas[:, : params.value_width]).reshape(-1)
    k0, k1 = party_key(params, keys[0]), party_key(params, keys[1])
    blind0 = hashlib.sha256(_TAG + b"blind0" + k0).digest()[:_SEED]
    prover = hashlib.sha256(_TAG + b"prover" + k0 + k1).digest()[:_SEED]
    up = make_upload(values, round_bound(params), seed1=k1, blind0=blind0, prover=prover)
    words = np.concatenate([up.shares0, up.proof0])
    return (words ^ _pad(k0, words.shape[0])).astype("<u8").tobytes() + up.part0 + up.part1


def split_trailer(params: SSAParams, blob: bytes) -> tuple[bytes, bytes]:
    """Split a checked round's public part (or hint) into its head and range trailer.

    Raises
    ------
    SSAInputError
        If the blob is not longer than a trailer (truncated, or keys without one).
    """
    return cut_trailer(blob, trailer_bytes(params))


def cut_trailer(blob: bytes, size: int) -> tuple[bytes, bytes]:
    """Split ``blob`` into its head and its last ``size`` bytes (a value check's trailer).

    Raises
    ------
    SSAInputError
        If the blob is not longer than ``size`` (truncated, or keys without a trailer).
    """
    if len(blob) <= size:
        raise SSAInputError(
            "malformed public part: truncated, or without the value-check trailer the round needs"
        )
    return bytes(blob[:-size]), bytes(blob[-size:])


def server_range(
    params: SSAParams,
    keys: DPFKeyBatch,
    value_sums: _U64Array,
    trailer: bytes,
    expect: bytes | None,
    check_head: int,
) -> bytes:
    """One server's range check of a client in a round; return its check blob.

    ``value_sums`` are the server's shares of every key's value words (``(keys, width)``);
    ``expect`` is the other server's whole check (S1) or None (S0, which draws the query
    seed); the query seed is read from it after ``check_head`` bytes (the key-check digest)
    and the range digest.

    Raises
    ------
    SSAInputError
        If the trailer does not match this server's material (:func:`server_check`).
    """
    k = party_key(params, keys)
    part0, part1 = trailer[-64:-32], trailer[-32:]
    bound = round_bound(params)
    if keys.party == 0:
        n_words = (len(trailer) - 64) // 8
        words = np.frombuffer(trailer[:-64], "<u8").astype(np.uint64) ^ _pad(k, n_words)
        size = value_sums.size * coefficients(bound).shape[0]
        blind0 = hashlib.sha256(_TAG + b"blind0" + k).digest()[:_SEED]
        private: RangeUpload | bytes = RangeUpload(
            words[:size], words[size:], blind0, b"", part0, part1
        )
    else:
        private = k
    query_seed = None  # without the other's check: draw one (S0, or a server checked alone)
    if expect is not None:
        start = check_head + 32  # after the key-check digest and the range digest
        if len(expect) < start + _SEED:
            raise SSAInputError("range check: the other server's check is malformed")
        query_seed = bytes(expect[start : start + _SEED])
    flat = np.ascontiguousarray(value_sums, np.uint64).reshape(-1)
    return server_check(keys.party, flat, bound, (part0, part1), private, query_seed).to_bytes()


def round_check(
    params: SSAParams,
    keys: DPFKeyBatch,
    values: _U64Array,
    offsets: NDArray[np.int64],
    trailer: bytes,
    expect: bytes | None,
) -> bytes:
    """:func:`server_range` on a server's evaluated points (``offsets``: each key's first row).

    Each key's value words summed over its evaluated points are its one point's words (the key
    check allows no second nonzero point).

    Raises
    ------
    SSAInputError
        As :func:`server_range`.
    """
    sums = np.add.reduceat(values[:, : params.value_width], offsets[:-1], axis=0)
    return server_range(params, keys, sums, trailer, expect, 32)
