"""Distributed comparison functions (Boyle et al. EUROCRYPT'21), batched, over Z_2^64.

A DCF shares the comparison function ``f(x) = beta if x < alpha else 0`` on the domain
``[0, 2**domain_bits)`` between two parties: ``evaluate_at(k0, x) + evaluate_at(k1, x) ==
f(x)`` in ``Z_2^64`` (``beta`` is one word or a vector of ``tau`` words; each output word is
``beta[w] * 1{x < alpha}``). It is the comparison gate of Boyle, Chandran, Gilboa, Gupta, Ishai,
Kumar and Rathee, "Function Secret Sharing for Mixed-Mode and Fixed-Point Secure Computation"
(EUROCRYPT 2021), Fig. 3, on the same tree-PRG machinery as :mod:`flwr_fsl.crypto.dpf`
(fixed-key AES in Matyas–Meyer–Oseas mode, whole tree levels of many keys per AES call, numba
kernels in :mod:`flwr_fsl.kernels.dcf_kernels`; the level loop runs in one numba call with
OpenSSL called from it, :mod:`flwr_fsl.kernels.dcf_native`, or from Python with ``cryptography``
where ``libcrypto`` does not load natively or ``FLWR_FSL_NATIVE_AES=0``: the same words):

* **Tree** (key format version 2). Each party walks the path of ``x`` (most significant bit
  first) from its root seed. A node's PRG output is a seed and control bit for each child plus
  *one* ``tau``-word value of the node itself: ``H(s ^ (0, tweak))`` with ``H(y) = AES_K(y) ^
  y`` under the fixed public key :data:`MMO_KEY_DCF` and public tweaks in the high word
  (``SEED | c``, ``VALUE | q``, and ``LEAF | q`` for a leaf's value; :mod:`~flwr_fsl.kernels.
  dcf_kernels`). Seeds are 128-bit blocks with bit 0 clear (127 random bits); bit 0 of a
  child block is its control bit. Version 1 drew a value for each *child* (``2 + 2Q`` blocks
  per node in Gen, ``Q = ceil(tau / 2)``); one value per node needs ``2 + Q``: Gen encrypts
  a quarter fewer blocks at ``tau = 2`` (6 instead of 8 per key and level) and Eval the same
  number (a seed and ``Q`` value blocks per level, ``Q`` at the leaf).
* **Gen** (per level ``i``, ``keep`` = the child on the path of ``alpha``, ``lose`` the other;
  ``v_b`` party ``b``'s value of the path's node at depth ``i``, ``t_1`` party 1's control bit
  there): ``s_CW = s_0^lose ^ s_1^lose``; ``V_CW = (-1)^t1 (v_1 - v_0 - V_alpha + beta
  alpha_i)``; then ``V_alpha = beta alpha_i``; control-bit corrections ``t_CW^L = t_0^L ^ t_1^L
  ^ alpha_i ^ 1``, ``t_CW^R = t_0^R ^ t_1^R ^ alpha_i``. Last word ``CW_final = (-1)^t1
  (v_1 - v_0 - V_alpha)`` with the leaf values ``v_b``.
* **Eval** (party ``b``, at the node of depth ``i`` with seed ``s`` and control bit ``t``):
  ``V += (-1)^b (v(s) + t V_CW_i)``, then at the leaf ``V += (-1)^b (v(s) + t CW_final)``. Up
  to the node where ``x`` leaves the path the nodes are the path's, and the two parties'
  terms of depth ``i`` add up to ``v_0 - v_1 + (-1)^t1 V_CW_i``: the sum after depth ``i`` is
  ``beta alpha_i``. Where ``x`` leaves the path (``x_i != alpha_i``: ``x < alpha`` iff
  ``alpha_i = 1``) that is ``beta`` or ``0``, and below it the parties hold equal seeds and
  control bits, so every later term cancels; at ``x = alpha`` the leaf's term makes it ``0``.

**Keys.** Key shares, public parts and their wire format are in
:mod:`flwr_fsl.crypto.dcf_keys` (re-exported here): a key share is ``(party, root seed, public
part)``, and the public part is the same for both parties.

**Threat model.** Semi-honest evaluators that do not collude. Each party alone sees its root seed
and the public part, which are pseudorandom and independent of ``alpha`` and ``beta`` (Boyle et al.
Thm. 3.2, with AES-MMO modelled as a PRG): it learns ``domain_bits`` and ``tau`` only. Version 2's
argument is the same hybrid over the levels: to party ``b`` the other party's seed at the path's
node of depth ``i`` is pseudorandom (a child output of a seed it never saw, XORed with values it
knows), so that node's PRG output, two child blocks and its value ``v_{1-b}`` (distinct tweaks:
independent pseudorandom strings), is replaced by uniform strings. Then ``s_CW``, the two ``t_CW``
bits (from the lost and the kept child block) and ``V_CW_i`` (masked by ``v_{1-b}`` of depth ``i``,
used in no other correction word) are uniform, and the kept child's seed is uniform and unused so
far, for the next level; the leaf value masks ``CW_final`` alike. A lost child's value is never
drawn: below the exit both parties hold the same seed, so its values cancel without a correction. A
key is for one comparison: evaluating it at several points is fine (it is a function share), but the
*mask* a protocol hides behind ``alpha`` must be used once.

**Errors.** :class:`DCFKeyError` (:mod:`~flwr_fsl.crypto.dcf_keys`) for a malformed key, public
part or blob; :class:`~flwr_fsl.core.errors.ConfigurationError` for bad arguments (alpha or a
point outside the domain, bad beta).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dcf_keys import (
    MAX_DOMAIN_BITS,
    MAX_TAU,
    DCFKeyBatch,
    DCFKeyError,
    DCFPublicBatch,
    assemble_public,
    public_size,
    public_views,
)
from flwr_fsl.crypto.prg import SEED_BYTES, derive_root_seeds, random_seeds
from flwr_fsl.kernels import dcf_kernels as _k
from flwr_fsl.kernels import dcf_native as _nat
from flwr_fsl.kernels.aes import BatchedAES

__all__ = [
    "MAX_DOMAIN_BITS",
    "MAX_TAU",
    "MMO_KEY_DCF",
    "DCFKeyBatch",
    "DCFKeyError",
    "DCFPublicBatch",
    "evaluate_at",
    "evaluate_at_batch",
    "evaluate_paired",
    "generate_keys",
    "generate_keys_batch",
    "public_size",
    "public_views",
]

MMO_KEY_DCF = b"flwr_fsl/dcf/v1\x00"
"""Public fixed AES key of the DCF tree PRG (``H(y) = AES_K(y) ^ y`` with public tweaks)."""

_U64 = np.uint64
_CHUNK = 1 << 12  # points per AES batch in Eval (256 KiB buffers; ~10% less than 1 << 15)
_GEN_CHUNK = 1 << 12  # keys per AES batch in Gen: 2 x 512 KiB buffers stay in L2 (~8% less)

_AES = threading.local()
_NATIVE_AES = True  # Gen/Eval's level loop in one numba call with OpenSSL inside (dcf_native)


def _cipher() -> BatchedAES:
    """Return this thread's fixed-key AES object (a ``cryptography`` context is not thread-safe)."""
    aes: BatchedAES | None = getattr(_AES, "dcf", None)
    if aes is None:
        aes = BatchedAES(MMO_KEY_DCF)
        _AES.dcf = aes
    return aes


# ------------------------------------------------------------------------------------- Gen


def _as_u64(values: ArrayLike, name: str) -> NDArray[np.uint64]:
    """Integers (numpy int/uint, or Python ints; negatives wrap mod 2^64) as uint64."""
    arr = np.asarray(values) if not isinstance(values, np.ndarray) else values
    if arr.dtype == object:
        try:
            flat = [int(v) % (1 << 64) for v in arr.reshape(-1)]
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{name} must be integers") from exc
        return np.array(flat, dtype=_U64).reshape(arr.shape)
    if arr.size and (arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigurationError(f"{name} must be integers, got dtype {arr.dtype}")
    return arr.astype(_U64, copy=False)


def _check_points(values: ArrayLike, domain_bits: int, name: str) -> NDArray[np.uint64]:
    arr = np.asarray(values)
    if arr.size and (arr.dtype == np.bool_ or arr.dtype.kind not in "iuO"):
        raise ConfigurationError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.size and arr.dtype.kind in "iO" and min(int(v) for v in arr.reshape(-1)) < 0:
        raise ConfigurationError(f"{name} must be non-negative")
    if arr.size and arr.dtype == object and max(int(v) for v in arr.reshape(-1)) >= 1 << 64:
        raise ConfigurationError(f"{name} must be below 2**64")
    pts = np.ascontiguousarray(arr.astype(_U64, copy=False).reshape(-1))
    if domain_bits < 64 and pts.size and int(pts.max()) >> domain_bits:
        raise ConfigurationError(f"every {name[:-1]} must be below 2**{domain_bits}")
    return pts


def _gen_into(
    a: NDArray[np.uint64],
    b: NDArray[np.uint64],
    n: int,
    root: tuple[NDArray[np.uint64], NDArray[np.uint64]],
    cws: tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint8], NDArray[np.uint64]],
) -> None:
    """Fill the correction words of keys ``(a[j], b[j])`` from both parties' root seeds.

    Chunks of :data:`_GEN_CHUNK` keys; per level one AES call over the chunk's ``2 + Q``
    blocks per party and one kernel (which also writes the next level's inputs).
    """
    if _NATIVE_AES and (nat := _nat.context(MMO_KEY_DCF)) is not None:  # one numba call
        return _nat.generate(nat, _GEN_CHUNK, a, b, n, root, cws)
    m, tau = b.shape
    nq = (tau + 1) // 2
    nb = 2 + nq
    aes = _cipher()
    chunk = min(_GEN_CHUNK, max(m, 1))
    inp = np.empty((chunk * 2 * nb, 2), dtype=_U64)
    enc = np.empty((chunk * 2 * nb + 1, 2), dtype=_U64)
    src, dst = inp.data.cast("B"), enc.data.cast("B")
    for lo in range(0, m, chunk):
        hi = min(m, lo + chunk)
        c = hi - lo
        seeds = np.empty((c, 2, 2), dtype=_U64)
        seeds[:, 0] = root[0][lo:hi]
        seeds[:, 1] = root[1][lo:hi]
        t = np.zeros((c, 2), dtype=np.uint8)
        t[:, 1] = 1
        v_alpha = np.zeros((c, tau), dtype=_U64)
        level_bytes = c * 2 * nb * 16
        _k.gen_blocks(seeds, nb, inp)
        state = np.empty((c if tau == 2 else 0, _k.GEN_STATE_WORDS), dtype=_U64)
        _k.pack_gen_state(seeds, t, v_alpha, state)  # tau = 2: a key's seeds, V_alpha, bits
        for level in range(n):  # one AES call and one kernel per level (it writes the next inputs)
            aes.encrypt_view_into(src[:level_bytes], dst)
            if tau == 2:
                _k.gen_step_tau2(enc, level, n, lo, (a, b), state, cws[:3], inp)
            else:
                _k.gen_step(enc, nb, level, n, lo, a, b, seeds, t, v_alpha, *cws[:3], inp)
        _k.unpack_gen_state(state, seeds, t, v_alpha)
        _k.leaf_blocks(seeds.reshape(2 * c, 2), nq, inp)
        aes.encrypt_view_into(src[: 2 * c * nq * 16], dst)
        _k.gen_final(inp, enc, nq, t, v_alpha, cws[3][lo:hi])


def _fresh_arrays(
    n: int, m: int, tau: int
) -> tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint8], NDArray[np.uint64]]:
    """Fresh ``(cw_seeds, cw_values, cw_bits, cw_final)`` to generate into (one allocation)."""
    sizes = (n * m * 2, n * m * tau, m * tau, (n * m + 7) // 8)  # bits last: words stay aligned
    buffer = np.empty(sum(sizes), dtype=_U64)
    views, start = [], 0
    for size in sizes:
        views.append(buffer[start : start + size])
        start += size
    seeds, values, final, bits = views
    return (
        seeds.reshape(n, m, 2),
        values.reshape(n, m, tau),
        bits.view(np.uint8)[: n * m].reshape(n, m),
        final.reshape(m, tau),
    )


def _out_arrays(
    out: object, n: int, m: int, tau: int
) -> tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint8], NDArray[np.uint64]]:
    """``(cw_seeds, cw_values, cw_bits, cw_final)`` at their wire offsets in ``out``."""
    try:
        return public_views(out, n, tau, m)  # type: ignore[arg-type]
    except DCFKeyError as err:
        raise ConfigurationError(str(err)) from err


def generate_keys_batch(
    alphas: ArrayLike,
    betas: ArrayLike,
    domain_bits: int,
    *,
    master_seeds: tuple[bytes, bytes] | None = None,
    out: NDArray[np.uint8] | None = None,
) -> tuple[DCFKeyBatch, DCFKeyBatch]:
    """Generate ``m`` DCF key pairs for ``f_j(x) = betas[j] if x < alphas[j] else 0``.

    Parameters
    ----------
    alphas : array_like
        ``(m,)`` thresholds, each below ``2**domain_bits``.
    betas : array_like
        ``(m,)`` (``tau = 1``) or ``(m, tau)`` payloads in Z_2^64 (negative values wrap).
    domain_bits : int
        Domain size in bits, in ``[1, 64]``.
    master_seeds : tuple of bytes, optional
        Each party's 16-byte master seed (its root seeds are ``PRF(seed, j)``); fresh OS
        randomness by default.
    out : numpy.ndarray, optional
        A writable ``uint8`` buffer of :func:`public_size` bytes that receives the
        *serialized* public part (:func:`public_views`), e.g. the blob of a message being
        built, so the keys are never copied into it; the keys are views of it. Fresh arrays
        by default.

    Returns
    -------
    tuple of DCFKeyBatch
        Party 0's and party 1's shares; both hold the same :class:`DCFPublicBatch`.

    Raises
    ------
    ConfigurationError
        If an argument is malformed or out of range.
    """
    if isinstance(domain_bits, bool) or not isinstance(domain_bits, int | np.integer):
        raise ConfigurationError(f"domain_bits must be an integer, got {domain_bits!r}")
    if not 1 <= int(domain_bits) <= MAX_DOMAIN_BITS:
        raise ConfigurationError(
            f"domain_bits must be in [1, {MAX_DOMAIN_BITS}], got {domain_bits}"
        )
    n = int(domain_bits)
    a = _check_points(alphas, n, "alphas")
    if np.ndim(alphas) != 1:
        raise ConfigurationError(f"alphas must be 1-D, got shape {np.shape(alphas)}")
    m = a.shape[0]
    b = _as_u64(betas, "betas")
    if b.ndim == 1 and b.shape[0] == m:
        b = b.reshape(m, 1)
    if b.ndim != 2 or b.shape[0] != m or not 1 <= b.shape[1] <= MAX_TAU:
        raise ConfigurationError(
            f"betas must have shape ({m},) or ({m}, tau) with 1 <= tau <= {MAX_TAU}"
        )
    b = np.ascontiguousarray(b)
    tau = b.shape[1]
    if master_seeds is None:
        msk = (random_seeds(1).tobytes(), random_seeds(1).tobytes())
    else:
        if len(master_seeds) != 2 or any(
            not isinstance(s, bytes) or len(s) != SEED_BYTES for s in master_seeds
        ):
            raise ConfigurationError(f"master_seeds must be two {SEED_BYTES}-byte seeds")
        msk = (master_seeds[0], master_seeds[1])
    root = (derive_root_seeds(msk[0], m), derive_root_seeds(msk[1], m))
    cws = _fresh_arrays(n, m, tau) if out is None else _out_arrays(out, n, m, tau)
    _gen_into(a, b, n, root, cws)
    # Built here, canonical by construction: skip the validating constructor's pass over it.
    pub = assemble_public(n, tau, cws, deferred=False)
    return DCFKeyBatch(0, root[0], pub), DCFKeyBatch(1, root[1], pub)


def generate_keys(
    alpha: int,
    beta: int | Sequence[int] | NDArray[np.integer],
    domain_bits: int,
    *,
    master_seeds: tuple[bytes, bytes] | None = None,
) -> tuple[DCFKeyBatch, DCFKeyBatch]:
    """Generate one DCF key pair for ``f(x) = beta if x < alpha else 0``.

    Parameters
    ----------
    alpha : int
        Threshold, ``0 <= alpha < 2**domain_bits``.
    beta : int or array_like
        One word or a 1-D vector of ``tau`` words in Z_2^64.
    domain_bits : int
        Domain size in bits, in ``[1, 64]``.
    master_seeds : tuple of bytes, optional
        Each party's 16-byte master seed.

    Returns
    -------
    tuple of DCFKeyBatch
        ``(k0, k1)``, batches of one key.

    Raises
    ------
    ConfigurationError
        If an argument is malformed or out of range.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, int | np.integer):
        raise ConfigurationError(f"alpha must be an integer, got {alpha!r}")
    bvec = _as_u64(np.asarray(beta, dtype=object) if isinstance(beta, int) else beta, "beta")
    if bvec.ndim > 1 or bvec.size == 0:
        raise ConfigurationError(
            f"beta must be an integer or a non-empty 1-D vector, got {bvec.shape}"
        )
    alphas = np.array([int(alpha)], dtype=object)
    return generate_keys_batch(alphas, bvec.reshape(1, -1), domain_bits, master_seeds=master_seeds)


# ------------------------------------------------------------------------------------ Eval


def evaluate_at_batch(
    keys: DCFKeyBatch, key_indices: ArrayLike, points: ArrayLike
) -> NDArray[np.uint64]:
    """Evaluate key ``key_indices[i]`` of a batch at ``points[i]`` for every ``i``.

    Parameters
    ----------
    keys : DCFKeyBatch
        One party's key shares.
    key_indices : array_like
        ``(n,)`` indices into the batch.
    points : array_like
        ``(n,)`` points in the domain.

    Returns
    -------
    numpy.ndarray
        ``(n, tau)`` uint64 shares of ``f_{key_indices[i]}(points[i])``.

    Raises
    ------
    ConfigurationError
        If an index or point is out of range or the shapes differ.
    DCFKeyError
        If the public part was decoded with a deferred check and is not canonical.
    """
    return _evaluate(keys, key_indices, points, paired=False)


def _evaluate(
    keys: DCFKeyBatch, key_indices: ArrayLike, points: ArrayLike, paired: bool
) -> NDArray[np.uint64]:
    """Run :func:`evaluate_at_batch`; ``paired``: ``key_indices`` is every key once.

    A deferred canonical check then rides on the evaluation's own reads of the corrections.
    """
    if not isinstance(keys, DCFKeyBatch):
        raise ConfigurationError(f"keys must be a DCFKeyBatch, got {type(keys).__name__}")
    pub = keys.public
    n_bits = pub.domain_bits
    idx = np.asarray(key_indices)
    if idx.size and (idx.dtype.kind not in "iu" or int(idx.min()) < 0):
        raise ConfigurationError("key_indices must be non-negative integers")
    idx = np.ascontiguousarray(idx.astype(np.int64).reshape(-1))
    pts = _check_points(points, n_bits, "points")
    if np.ndim(points) > 1 or np.ndim(key_indices) > 1 or pts.shape != idx.shape:
        raise ConfigurationError(
            f"key_indices and points must be 1-D of one length: {idx.shape} {pts.shape}"
        )
    if idx.size and int(idx.max()) >= pub.num_keys:
        raise ConfigurationError(f"key index out of range (batch has {pub.num_keys} keys)")
    fused = pub.deferred and paired and pub.tau == 2  # eval_step_tau2 ORs what it reads
    if not fused:
        pub.verify()
    cws = (pub.cw_seeds, pub.cw_values, pub.cw_bits, pub.cw_final)
    if _NATIVE_AES and (nat := _nat.context(MMO_KEY_DCF)) is not None:  # one numba call
        out, flags = _nat.evaluate(nat, _CHUNK, idx, pts, n_bits, keys.party, keys.root_seeds, cws)
    else:
        out, flags = _evaluate_python(keys, idx, pts)
    if fused:
        pub.settle(flags)  # raises before any share leaves
    return out


def _evaluate_python(
    keys: DCFKeyBatch, idx: NDArray[np.int64], pts: NDArray[np.uint64]
) -> tuple[NDArray[np.uint64], int]:
    """Run the level loop from Python with ``cryptography``'s AES (no ``libcrypto``)."""
    pub = keys.public
    n_bits = pub.domain_bits
    flags = 0
    count, tau = idx.shape[0], pub.tau
    nq = (tau + 1) // 2
    nb = 1 + nq
    out = np.zeros((count, tau), dtype=_U64)
    aes = _cipher()
    chunk = min(_CHUNK, max(count, 1))
    inp = np.empty((chunk * nb, 2), dtype=_U64)
    enc = np.empty((chunk * nb + 1, 2), dtype=_U64)
    src, dst = inp.data.cast("B"), enc.data.cast("B")
    for lo in range(0, count, chunk):
        hi = min(count, lo + chunk)
        c = hi - lo
        kid = idx[lo:hi]
        p = pts[lo:hi]
        seeds = np.ascontiguousarray(keys.root_seeds[kid])
        t = np.full(c, keys.party, dtype=np.uint8)
        acc = out[lo:hi]
        level_bytes = c * nb * 16
        _k.eval_blocks(seeds, p, 0, n_bits, nb, inp)
        for level in range(n_bits):  # one AES call and one kernel per level
            aes.encrypt_view_into(src[:level_bytes], dst)
            if tau == 2:
                flags |= int(_k.eval_step_tau2(
                    enc, level, n_bits, p, kid, pub.cw_seeds, pub.cw_values, pub.cw_bits,
                    keys.party, seeds, t, acc, inp,
                ))  # fmt: skip
            else:
                _k.eval_step(
                    enc, nb, level, n_bits, p, kid, pub.cw_seeds, pub.cw_values, pub.cw_bits,
                    keys.party, seeds, t, acc, inp,
                )  # fmt: skip
        _k.leaf_blocks(seeds, nq, inp)
        aes.encrypt_view_into(src[: c * nq * 16], dst)
        _k.eval_final(inp, enc, nq, kid, pub.cw_final, keys.party, t, acc)
    return out, flags


def evaluate_paired(keys: DCFKeyBatch, points: ArrayLike) -> NDArray[np.uint64]:
    """Evaluate key ``j`` at ``points[j]`` for every key of the batch (one point per key).

    Parameters
    ----------
    keys : DCFKeyBatch
        One party's key shares (``m`` keys).
    points : array_like
        ``(m,)`` points.

    Returns
    -------
    numpy.ndarray
        ``(m, tau)`` uint64 shares.

    Raises
    ------
    ConfigurationError
        If the number of points is not ``m`` or a point is outside the domain.
    DCFKeyError
        If the public part was decoded with a deferred check and is not canonical (checked
        in the evaluation's pass when ``tau = 2``; refused before any share is returned).
    """
    pts = np.asarray(points)
    if pts.ndim != 1 or pts.shape[0] != keys.num_keys:
        raise ConfigurationError(f"need one point per key ({keys.num_keys}), got shape {pts.shape}")
    return _evaluate(keys, np.arange(keys.num_keys, dtype=np.int64), pts, paired=True)


def evaluate_at(keys: DCFKeyBatch, points: ArrayLike) -> NDArray[np.uint64]:
    """Evaluate a batch of *one* key at every point.

    Parameters
    ----------
    keys : DCFKeyBatch
        One party's share of a single key.
    points : array_like
        An int or 1-D points in the domain.

    Returns
    -------
    numpy.ndarray
        ``(n, tau)`` uint64 shares; ``evaluate_at(k0, x) + evaluate_at(k1, x) == f(x)``.

    Raises
    ------
    ConfigurationError
        If the batch does not hold exactly one key or a point is outside the domain.
    """
    if not isinstance(keys, DCFKeyBatch) or keys.num_keys != 1:
        raise ConfigurationError("evaluate_at needs a DCFKeyBatch of exactly one key")
    pts = np.asarray(points).reshape(-1)
    return evaluate_at_batch(keys, np.zeros(pts.shape[0], dtype=np.int64), pts)
