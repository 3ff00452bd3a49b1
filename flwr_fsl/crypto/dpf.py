"""Distributed point functions (BGI16 tree, λ = 128) over Z_2^64, batched, with Cui's U-DPF.

A DPF shares the point function ``f(x) = beta if x == alpha else 0`` on the domain
``[0, 2**domain_bits)`` between two servers: ``evaluate(k0, x) + evaluate(k1, x) == f(x)`` in
``Z_2^64`` (``beta`` is one word, or a vector of ``tau`` words: a mega-element / a row with a
count word appended). Construction: Boyle–Gilboa–Ishai, "Function Secret Sharing: Improvements
and Extensions" (CCS 2016), Fig. 1, with these choices:

* PRG: fixed-key AES-128 in Matyas–Meyer–Oseas mode with two fixed keys, as in
  google/distributed_point_functions (:mod:`flwr_fsl.crypto.prg`): the children of seed ``s``
  are ``AES_{K_L}(x) ^ x`` and ``AES_{K_R}(x) ^ x`` of the block ``x = s | t``: a seed is a
  128-bit block whose lowest bit is reserved for the control bit, and the PRG input is the seed
  *with* the node's control bit in that bit (children's bit 0 are their control bits). Root
  seeds and correction seeds keep bit 0 clear on the wire. A whole tree level of many keys is
  two AES calls (one per key) over the same buffer of blocks.
* Early termination (BGI16 §3.2.1) when ``tau`` is odd: one leaf seed converts to one or more
  whole AES blocks, i.e. ``W = group * tau`` words with ``group = 2`` points per leaf seed for
  odd ``tau`` and ``group = 1`` for even ``tau``; the tree then has ``domain_bits - 1`` levels
  (odd ``tau``, ``domain_bits >= 1``) or ``domain_bits`` levels (even ``tau``).
* Leaf conversion ``H(s, e)``: MMO blocks ``s ^ (2 + q, e)``, ``q < W / 2``, under the third
  fixed key (:data:`~flwr_fsl.crypto.prg.MMO_KEY`); ``e`` is the key's epoch (0 unless
  updated), so the conversion doubles as Cui's epoch-keyed hash (§5).

The key format (:class:`DPFPublicBatch`, :class:`DPFKeyBatch`, :class:`UpdateHint`, the wire
format) is in :mod:`flwr_fsl.crypto.dpf_keys`, Cui's U-DPF hints and updates
(:func:`next_hint_batch`, :func:`update_batch`) in :mod:`flwr_fsl.crypto.udpf`; this module
re-exports both, so ``from flwr_fsl.crypto.dpf import DPFKeyBatch, update_batch`` keeps working.

**Verifiable keys** (issue 21; de Castro & Polychroniadou, "Lightweight, Maliciously Secure
Verifiable Function Secret Sharing", Eurocrypt 2022): with ``verifiable=True`` (even ``tau``
only: no early termination, so one leaf is one point) each key carries a 64-byte proof
correction word ``cs = H(alpha, blk_0) ^ H(alpha, blk_1)`` over the two parties' leaf blocks
*with their control bits*, and :func:`evaluate_batch` (``proofs=``) returns each evaluated
point's ``H(x, blk_x) ^ t_x * cs`` in the same pass (:mod:`flwr_fsl.kernels.vdpf_kernels`).
For an honest key pair the two parties' proofs are equal at every point (equal blocks off
``alpha``; at ``alpha`` ``cs`` corrects one side onto the other); a pair that differs at two
points must find ``H(x1, a) ^ H(x1, b) = H(x2, c) ^ H(x2, d)`` for 512-bit ``H``, or a
collision. Hashing the control bit matters: with equal seeds and different control bits at
many leaves a key is nonzero there and ``cs = 0`` would pass. U-DPF hints change only the leaf
correction word, so updated keys stay covered. Which points are checked is the caller's choice
(the evaluated ``lengths``); the SSA servers' use of it is :mod:`flwr_fsl.families.ssa.verify`.

**Threat model.** Semi-honest servers that do not collude; a client may send malformed keys,
which the decoders reject with :class:`DPFKeyError`; a well-formed *plain* key is not verified
to encode a point function; a verifiable key's proofs are, against a client that builds its
keys however it likes (not the value it puts at its point: that needs a range proof). Each
server alone sees its root seed and the public part; both are pseudorandom and independent
of ``alpha`` and ``beta`` (BGI16 Thm. 3.3 with AES-MMO modelled as a PRG; a proof word is a
hash masked by the other party's leaf block at ``alpha``, which the server does not hold): the
server learns only what is public by design — ``domain_bits``, ``tau`` and the epoch. A U-DPF
hint (§5) is a fresh leaf correction word masked by ``H(s_0, e) - H(s_1, e)`` at
a new epoch ``e``; its security needs every epoch to be used once per key pair, which
:func:`update` and :func:`next_hint` enforce (epochs strictly increase).

**Errors.** :class:`DPFKeyError` (a :class:`ValueError`) for any malformed key, public part,
hint or serialized blob and for keys that do not fit together; plain :class:`ValueError` for a
bad argument (alpha or a point outside the domain, wrong beta shape, bad epoch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf_gen import gen_public, gen_roots
from flwr_fsl.crypto.dpf_keys import (
    _U64,
    MAX_DOMAIN_BITS,
    MAX_TAU,
    PROOF_WORDS,
    DPFKey,
    DPFKeyBatch,
    DPFKeyError,
    DPFPublicBatch,
    DPFPublicKey,
    _as_index,
    _as_u64,
    _betas_matrix,
    _check_epoch,
    _group,
    _seed_from_bytes,
    _tree_levels,
)
from flwr_fsl.crypto.prg import (
    MMO_KEY,
    MMO_KEY_LEFT,
    MMO_KEY_PROOF,
    MMO_KEY_RIGHT,
    SEED_BYTES,
    _mmo_ciphers,
    derive_root_seeds,
    random_seeds,
)
from flwr_fsl.crypto.udpf import UpdateHint, next_hint, next_hint_batch, update, update_batch
from flwr_fsl.kernels import dpf_eval as _fde
from flwr_fsl.kernels import dpf_kernels as _k
from flwr_fsl.kernels import vdpf_eval as _vde
from flwr_fsl.kernels import vdpf_kernels as _vk

__all__ = [
    "MAX_DOMAIN_BITS",
    "MAX_TAU",
    "DPFKey",
    "DPFKeyBatch",
    "DPFKeyError",
    "DPFPublicBatch",
    "DPFPublicKey",
    "UpdateHint",
    "check_words_out",
    "evaluate",
    "evaluate_at",
    "evaluate_at_batch",
    "evaluate_batch",
    "generate_keys",
    "generate_keys_batch",
    "key_range",
    "next_hint",
    "next_hint_batch",
    "update",
    "update_batch",
]

# AES blocks per full-domain chunk (256 KiB per level buffer). With the chunk loop in one
# native call the per-chunk cost is small, and 2^14 measured 2-3% (depth 9), 2-4% (depth 20)
# and 5-8% (depths 4..9) faster than 2^15 on 2 MiB-L2 cores (dpf_bench, same run). On a
# 512 KiB-L2 core (session 31, load 3-5) 2^13 ran as fast as 2^14 within the noise and
# smaller chunks slower: the level passes alone took 66 / 68 / 73 / 87 / 106 ms at 2^14 ..
# 2^10 (100k keys, depth 9; per-chunk overhead outweighs the cache misses it saves).
_FD_BUDGET = 1 << 14

# Parts of the native chunk loop that run (kernels.dpf_eval.fd_core; 15: all). The benchmark
# switches parts off to time the others; any other value leaves the output undefined.
_FD_PARTS = 15

# Outputs at least this large are written with non-temporal stores by the native driver: no
# cache keeps them anyway, and a store that does not first read its line halves the traffic.
# With whole-line stores (dpf_vectors._leaf_line_nt) an 8 MiB output (one depth-20 key) took
# 2.34 instead of 2.57 ms this way (session 38, best of 300, load 0.8; 64 MiB before), and the
# SSA servers' round (checked-v3, 8 clients) was no slower.
_NT_MIN_BYTES = 8 << 20

# The native driver (:mod:`flwr_fsl.kernels.dpf_eval`: the chunk loop in one numba call, OpenSSL
# called from it) evaluates, and Gen (:mod:`flwr_fsl.crypto.dpf_gen`) generates keys, whenever
# OpenSSL's libcrypto loads; False forces the Python drivers (the benchmark's old path).
# Evaluations with proofs run natively too (:mod:`flwr_fsl.kernels.vdpf_eval`).
_NATIVE_AES = True
_NATIVE = threading.local()
_AES_LOG: list[int] | None = None  # when a list: block counts of every native AES call (tests)


def _split_points(
    points: NDArray[np.uint64], domain_bits: NDArray[np.int64], tau: int
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Split points into (tree path bits, position inside the leaf group)."""
    if _group(tau) == 2:
        has_tree = domain_bits >= 1
        path = np.where(has_tree, points >> _U64(1), _U64(0)).astype(_U64)
        pos = np.where(has_tree, points & _U64(1), _U64(0)).astype(np.int64)
        return path, pos
    return points.astype(_U64, copy=True), np.zeros(points.shape, dtype=np.int64)


def _check_domain_bits(domain_bits: ArrayLike, m: int) -> NDArray[np.int64]:
    d = np.asarray(domain_bits)
    if d.dtype == np.bool_ or not np.issubdtype(d.dtype, np.integer):
        raise ConfigurationError(f"domain_bits must be integers, got dtype {d.dtype}")
    if d.ndim == 0:
        d = np.full(m, int(d), dtype=np.int64)
    if d.shape != (m,):
        raise ConfigurationError(
            f"domain_bits must be a scalar or have shape ({m},), got {d.shape}"
        )
    if m and (int(d.min()) < 0 or int(d.max()) > MAX_DOMAIN_BITS):
        raise ConfigurationError(f"domain_bits must be in [0, {MAX_DOMAIN_BITS}]")
    return d.astype(np.int64)


# ------------------------------------------------------------------------------------------------
# Gen
# ------------------------------------------------------------------------------------------------


def generate_keys_batch(
    alphas: ArrayLike,
    betas: ArrayLike,
    domain_bits: ArrayLike,
    *,
    master_seeds: tuple[bytes, bytes] | None = None,
    epoch: int = 0,
    verifiable: bool = False,
    threads: int = 1,
    tail: tuple[int, Callable[[tuple[DPFKeyBatch, DPFKeyBatch]], bytes]] | None = None,
) -> tuple[DPFKeyBatch, DPFKeyBatch]:
    """Generate ``m`` DPF key pairs at once (e.g. one per cuckoo bin).

    Root seeds of party ``b`` are ``PRF(master_seeds[b], j)`` for key ``j``, so each server's
    private material is one 16-byte master seed (Cui §4).

    Parameters
    ----------
    alphas : array_like
        ``(m,)`` points, ``alphas[j] < 2**domain_bits[j]``.
    betas : array_like
        ``(m,)`` (``tau = 1``) or ``(m, tau)`` values in Z_2^64 (integers; negative values wrap).
    domain_bits : int or array_like
        Domain size in bits, one for all keys or ``(m,)``; each in ``[0, 63]``.
    master_seeds : tuple of bytes, optional
        The two 16-byte master seeds; fresh random ones from the OS by default.
    epoch : int, optional
        Initial U-DPF epoch (default 0).
    verifiable : bool, optional
        Add each key's proof correction word (de Castro–Polychroniadou verifiable DPF,
        :mod:`flwr_fsl.crypto.vdpf`); needs an even ``tau`` (no early termination).
    threads : int, optional
        Threads of the native Gen driver (default 1; :func:`~flwr_fsl.crypto.dpf_gen.gen_public`
        splits large batches into key ranges). The keys do not depend on it.
    tail : tuple, optional
        ``(n, make)``: ``make`` gets the finished key pair and returns ``n`` bytes (a trailer)
        that go after the public part in its blob, :meth:`DPFPublicBatch.blob`. The pair it
        gets views a buffer that is reused: it must not keep it.

    Returns
    -------
    tuple of DPFKeyBatch
        Party 0's and party 1's shares; both hold the same :class:`DPFPublicBatch`.

    Raises
    ------
    ConfigurationError
        If an alpha is outside its domain, shapes disagree, values are not integers, a
        master seed is not 16 bytes, or ``verifiable`` keys get an odd ``tau``.
    """
    a = _as_index(alphas, "alphas")
    if a.ndim != 1:
        raise ConfigurationError(f"alphas must be 1-D, got shape {a.shape}")
    m = a.shape[0]
    b = _betas_matrix(betas, m)
    d = _check_domain_bits(domain_bits, m)
    e = _check_epoch(epoch)
    if m and np.any((d < 64) & (a >> np.minimum(d, 63).astype(_U64) != 0)):
        raise ConfigurationError("every alpha must be below 2**domain_bits")
    if master_seeds is None:
        msk = (random_seeds(1).tobytes(), random_seeds(1).tobytes())
    else:
        if len(master_seeds) != 2:
            raise ConfigurationError("master_seeds must be a pair of 16-byte seeds")
        msk = (bytes(master_seeds[0]), bytes(master_seeds[1]))
        if any(len(s) != SEED_BYTES for s in msk):
            raise ConfigurationError(f"master seeds must be {SEED_BYTES} bytes each")
    roots = gen_roots if _NATIVE_AES else derive_root_seeds
    root0, root1 = roots(msk[0], m), roots(msk[1], m)
    if verifiable and b.shape[1] % 2:
        raise ConfigurationError("verifiable keys need an even tau (no early termination)")
    if isinstance(threads, bool) or not isinstance(threads, int | np.integer) or threads < 1:
        raise ConfigurationError(f"threads must be an integer >= 1, got {threads!r}")
    pub = gen_public(
        a, b, d, root0, root1, e, _mmo_ciphers(), verifiable, native=_NATIVE_AES, log=_AES_LOG,
        threads=threads, tail=None if tail is None else (tail[0], _pair(tail[1], root0, root1)),
    )  # fmt: skip
    return (
        DPFKeyBatch(party=0, root_seeds=root0, public=pub),
        DPFKeyBatch(party=1, root_seeds=root1, public=pub),
    )


def _pair(
    make: Callable[[tuple[DPFKeyBatch, DPFKeyBatch]], bytes],
    root0: NDArray[np.uint64],
    root1: NDArray[np.uint64],
) -> Callable[[DPFPublicBatch], bytes]:
    """Return ``make`` of the key pair a public part and these root seeds form.

    The pair is Gen's own seeds and words, not validated again.
    """

    def trusted(party: int, roots: NDArray[np.uint64], pub: DPFPublicBatch) -> DPFKeyBatch:
        batch = object.__new__(DPFKeyBatch)  # Gen's own seeds: no second validation
        for name, value in (("party", party), ("root_seeds", roots), ("public", pub)):
            object.__setattr__(batch, name, value)
        return batch

    return lambda pub: make((trusted(0, root0, pub), trusted(1, root1, pub)))


def generate_keys(
    alpha: int,
    beta: int | ArrayLike,
    domain_bits: int,
    *,
    root_seeds: tuple[bytes, bytes] | None = None,
    epoch: int = 0,
) -> tuple[DPFKey, DPFKey]:
    """Generate a DPF key pair for ``f(x) = beta if x == alpha else 0`` on ``[0, 2**domain_bits)``.

    Parameters
    ----------
    alpha : int
        The point, ``0 <= alpha < 2**domain_bits``.
    beta : int or array_like
        Value in Z_2^64 (an int; ``tau = 1``) or a 1-D vector of ``tau`` integers.
    domain_bits : int
        Domain size in bits, ``0 <= domain_bits <= 63``.
    root_seeds : tuple of bytes, optional
        The two 16-byte root seeds (lowest bit 0); fresh random ones by default.
    epoch : int, optional
        Initial U-DPF epoch (default 0).

    Returns
    -------
    tuple of DPFKey
        ``(k0, k1)``, sharing one :class:`DPFPublicKey`.

    Raises
    ------
    ConfigurationError
        If an argument is out of range or malformed (root seeds: :class:`DPFKeyError`).
    """
    if not isinstance(domain_bits, int | np.integer) or isinstance(domain_bits, bool):
        raise ConfigurationError(f"domain_bits must be an integer, got {domain_bits!r}")
    if not isinstance(alpha, int | np.integer) or isinstance(alpha, bool):
        raise ConfigurationError(f"alpha must be an integer, got {alpha!r}")
    if not 0 <= int(domain_bits) <= MAX_DOMAIN_BITS:
        raise ConfigurationError(
            f"domain_bits must be in [0, {MAX_DOMAIN_BITS}], got {domain_bits}"
        )
    if not 0 <= int(alpha) < 1 << int(domain_bits):
        raise ConfigurationError(f"alpha={alpha} is outside [0, 2**{domain_bits})")
    bvec = _as_u64(beta, "beta")
    if bvec.ndim > 1 or bvec.size == 0:
        raise ConfigurationError(
            f"beta must be an integer or a non-empty 1-D vector, got {bvec.shape}"
        )
    bmat = bvec.reshape(1, -1)
    if bmat.shape[1] > MAX_TAU:
        raise ConfigurationError(f"tau must be at most {MAX_TAU}")
    if root_seeds is None:
        r0, r1 = random_seeds(1), random_seeds(1)
    else:
        if len(root_seeds) != 2:
            raise ConfigurationError("root_seeds must be a pair of 16-byte seeds")
        r0 = _seed_from_bytes(root_seeds[0], "root seed 0")
        r1 = _seed_from_bytes(root_seeds[1], "root seed 1")
    pub = gen_public(
        np.array([alpha], dtype=_U64),
        bmat,
        np.array([domain_bits], dtype=np.int64),
        r0,
        r1,
        _check_epoch(epoch),
        _mmo_ciphers(),
        native=_NATIVE_AES,
        log=_AES_LOG,
    ).key(0)
    return (
        DPFKey(party=0, seed=r0.astype("<u8").tobytes(), public=pub),
        DPFKey(party=1, seed=r1.astype("<u8").tobytes(), public=pub),
    )


# ------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------


def evaluate_at_batch(
    keys: DPFKeyBatch, key_indices: ArrayLike, points: ArrayLike
) -> NDArray[np.uint64]:
    """Evaluate key ``key_indices[i]`` of a batch at ``points[i]`` for all ``i``.

    Parameters
    ----------
    keys : DPFKeyBatch
        One server's key shares.
    key_indices : array_like
        ``(n,)`` indices into the batch.
    points : array_like
        ``(n,)`` points, each inside its key's domain.

    Returns
    -------
    numpy.ndarray
        ``(n, tau)`` uint64 shares of ``f(points[i])``.

    Raises
    ------
    ConfigurationError
        If an index or point is out of range or the shapes differ.
    """
    pub = keys.public
    idx = _as_index(key_indices, "key_indices").astype(np.int64)
    pts = _as_index(points, "points")
    if idx.ndim != 1 or pts.shape != idx.shape:
        raise ConfigurationError(
            f"key_indices and points must be 1-D of one length: {idx.shape} {pts.shape}"
        )
    n = idx.shape[0]
    if n and int(idx.max()) >= pub.num_keys:
        raise ConfigurationError(f"key index out of range (batch has {pub.num_keys} keys)")
    tau = pub.tau
    out = np.empty((n, tau), dtype=_U64)
    if n == 0:
        return out
    d = pub.domain_bits.astype(np.int64)[idx]
    if np.any(pts >> d.astype(_U64) != 0):
        raise ConfigurationError("every point must be below 2**domain_bits of its key")
    tl_all = _tree_levels(pub.domain_bits, tau)
    path, gpos = _split_points(pts, d, tau)
    key_s = np.ascontiguousarray(idx)
    path_s = np.ascontiguousarray(path)
    seed = np.array(keys.root_seeds[key_s], dtype=_U64, order="C")
    seed[:, 0] |= _U64(keys.party)  # the control bit rides in bit 0 of the seed block
    t_state = np.full(n, keys.party, dtype=np.uint8)
    # Each level's AES input: the seeds of points going left (left key), then right (right key).
    blocks = np.empty((n, 2), dtype=_U64)
    enc = np.empty((n + 1, 2), dtype=_U64)
    who = np.arange(n, dtype=np.int64)
    who_next = np.empty(n, dtype=np.int64)
    mv_b, mv_e = blocks.data.cast("B"), enc.data.cast("B")
    aes = _mmo_ciphers()
    count, n_left = _k.point_place(who, n, 0, key_s, path_s, tl_all, seed, who_next, blocks)
    level = 0
    while count:
        who, who_next = who_next, who
        aes.left.encrypt_view_into(mv_b[: 16 * n_left], mv_e)
        aes.right.encrypt_view_into(mv_b[16 * n_left : 16 * count], mv_e[16 * n_left :])
        _k.point_level(
            enc,
            blocks,
            count,
            n_left,
            level,
            who,
            key_s,
            pub.level_offsets,
            pub.cw_seeds,
            pub.cw_bits,
            seed,
            t_state,
        )
        level += 1
        count, n_left = _k.point_place(
            who, count, level, key_s, path_s, tl_all, seed, who_next, blocks
        )
    half_w = pub.leaf_words // 2
    conv = np.empty((n * half_w, 2), dtype=_U64)
    conv_enc = np.empty((n * half_w + 1, 2), dtype=_U64)
    _k.point_leaf_blocks(seed, key_s, pub.epochs, half_w, conv)
    aes.value.encrypt_prefix_into(conv, conv_enc)
    _k.point_leaves(
        conv_enc,
        conv,
        t_state,
        key_s,
        np.ascontiguousarray(gpos),
        pub.cw_leaf,
        half_w,
        tau,
        keys.party,
        out,
    )
    return out


def evaluate_at(key: DPFKey, points: ArrayLike) -> NDArray[np.uint64]:
    """Evaluate one key share at ``points``.

    Parameters
    ----------
    key : DPFKey
        One server's share.
    points : array_like
        1-D points (or one int) inside the key's domain.

    Returns
    -------
    numpy.ndarray
        ``(n, tau)`` uint64 shares; ``evaluate_at(k0, x) + evaluate_at(k1, x) == f(x)``.

    Raises
    ------
    ValueError
        If a point is outside the domain.
    """
    pts = _as_index(points, "points").reshape(-1)
    return evaluate_at_batch(key.as_batch(), np.zeros(pts.shape[0], dtype=np.int64), pts)


def _native_mmo() -> _fde.NativeMMO | None:
    """Return the calling thread's native OpenSSL contexts of the tree, or ``None``."""
    if not _NATIVE_AES:
        return None
    if not hasattr(_NATIVE, "mmo"):
        _NATIVE.mmo = _fde.native_mmo((MMO_KEY_LEFT, MMO_KEY_RIGHT, MMO_KEY))
    mmo: _fde.NativeMMO | None = _NATIVE.mmo
    return mmo


def _native_vmmo() -> _vde.NativeVMMO | None:
    """Return the calling thread's native contexts of the tree and the proof hash, or ``None``."""
    if not _NATIVE_AES:
        return None
    if not hasattr(_NATIVE, "vmmo"):
        _NATIVE.vmmo = _vde.native_vmmo((MMO_KEY_LEFT, MMO_KEY_RIGHT, MMO_KEY, MMO_KEY_PROOF))
    vmmo: _vde.NativeVMMO | None = _NATIVE.vmmo
    return vmmo


def _plan(
    keys: DPFKeyBatch, lengths: ArrayLike | None, sizes: tuple[int, int, int]
) -> tuple[
    NDArray[np.int64], NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint8],
    NDArray[np.int64], int,
]:  # fmt: skip
    """:func:`evaluate_batch`'s plan: ``(offsets, tasks_i, seeds, t, bounds, cap)``.

    One GIL-free :func:`~flwr_fsl.kernels.dpf_eval.fd_plan` call (the row offsets, the length
    checks, the root tasks and their chunks; ``sizes = (group, per_leaf, budget)``), so a
    server's evaluation threads hold the GIL for almost none of a segment's prologue. An
    ``(m,)`` int64 array of lengths (a server's) goes in as it is; anything else is converted
    and checked here first.

    Raises
    ------
    ConfigurationError
        If ``lengths`` has the wrong shape, is not integers, or is out of range.
    """
    pub = keys.public
    m = pub.num_keys
    if lengths is None:
        npts: NDArray[np.int64] = pub.num_points
    elif isinstance(lengths, np.ndarray) and lengths.dtype == np.int64 and lengths.shape == (m,):
        npts = lengths  # checked in fd_plan, without the GIL
    else:
        npts = _as_index(lengths, "lengths").astype(np.int64)
        if npts.shape != (m,):
            raise ConfigurationError(f"lengths must have shape ({m},), got {npts.shape}")
    status, offsets, tasks_i, seeds, t, bounds, cap = _fde.fd_plan(
        pub.domain_bits, npts, keys.root_seeds, keys.party, sizes
    )
    if status == _fde.PLAN_NEGATIVE:
        raise ConfigurationError("lengths must be non-negative")
    if status == _fde.PLAN_TOO_LONG:
        raise ConfigurationError("lengths must not exceed 2**domain_bits")
    return offsets, tasks_i, seeds, t, bounds, int(cap)


def evaluate_batch(  # noqa: C901, PLR0915
    keys: DPFKeyBatch,
    *,
    lengths: ArrayLike | None = None,
    out: NDArray[np.uint64] | None = None,
    proofs: NDArray[np.uint64] | None = None,
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Full-domain evaluation of every key of a batch (keys may have different domains).

    Levels of many keys are expanded together, one AES call per fixed key and level, in
    cache-sized chunks. With ``lengths``, subtrees holding no point below a key's length are
    skipped (a key padded to a power of two costs AES blocks for its evaluated points only).
    The chunk loop runs in one GIL-free numba call that calls OpenSSL natively
    (:mod:`flwr_fsl.kernels.dpf_eval`; with ``proofs``, :mod:`flwr_fsl.kernels.vdpf_eval`)
    where ``libcrypto`` loads, with the same output words and proofs as the Python driver.

    Parameters
    ----------
    keys : DPFKeyBatch
        One server's key shares.
    lengths : array_like, optional
        ``(m,)`` number of leading points to produce per key (e.g. a simple-hash bin's real
        length, at most ``2**domain_bits``); default: the whole domain.
    out : numpy.ndarray, optional
        Preallocated ``(P, tau)`` uint64 output to fill (``P`` = total points).
    proofs : numpy.ndarray, optional
        Verifiable keys only: a ``(P, PROOF_WORDS)`` uint64 array that receives every
        point's leaf proof ``H(x, blk) ^ t * cs`` (:mod:`flwr_fsl.crypto.vdpf`), computed in
        the same pass (the same chunks, one more batched AES call per chunk).

    Returns
    -------
    values : numpy.ndarray
        ``(P, tau)`` uint64; key ``j``'s shares are rows ``offsets[j]:offsets[j+1]``.
    offsets : numpy.ndarray
        ``(m + 1,)`` int64 row offsets.

    Raises
    ------
    ConfigurationError
        If ``lengths`` or ``out`` has the wrong shape or range.
    """
    pub = keys.public
    tau = pub.tau
    group = _group(tau)
    half_w = pub.leaf_words // 2
    per_leaf = max(1, half_w)  # AES blocks per leaf: one seed per child, half_w to convert
    offsets, tasks_i, seeds, t, bounds, cap = _plan(keys, lengths, (group, per_leaf, _FD_BUDGET))
    total = int(offsets[-1])
    if out is None:
        out = np.empty((total, tau), dtype=_U64)
    else:
        check_words_out("out", out, (total, tau))
    if proofs is not None:
        _check_proofs_out(pub, proofs, total)
    if total == 0:
        return out, offsets
    max_h = max(0, int(np.log2(max(_FD_BUDGET // per_leaf, 1))))
    native = _native_mmo() if proofs is None else _native_vmmo()
    if tasks_i.shape[0] and int(tasks_i[0, 2]) > max_h:  # tallest first (fd_tasks)
        if native is not None:
            cws = (pub.level_offsets, pub.cw_seeds, pub.cw_bits)
            tasks_i, seeds, t = _fde.split_native(
                native, (tasks_i, seeds, t), (max_h, group), cws, _AES_LOG
            )
        else:
            tasks_i, seeds, t = _fde.split_tasks(
                tasks_i, seeds, t, max_h, group, pub.level_offsets,
                _fde.split_expander(native, _mmo_ciphers, pub.cw_seeds, pub.cw_bits, _AES_LOG),
            )  # fmt: skip
        # Subtree skipping: a task costs only the leaves that hold a point below its limit (a
        # bin padded to a power of two evaluates its real points; no level holds more nodes).
        bounds, cap, desc = _fde.fd_chunks(tasks_i, group, per_leaf, _FD_BUDGET)
        if not desc:  # chunks need tasks sorted by height, tallest first
            order = np.argsort(-tasks_i[:, 2], kind="stable")
            tasks_i, seeds, t = tasks_i[order], seeds[order], t[order]
            bounds, cap, _ = _fde.fd_chunks(tasks_i, group, per_leaf, _FD_BUDGET)
    cap += 2 * per_leaf  # room for a skipped pair's spare child (fd_levels writes it, unused)
    if native is not None:
        key = (pub.level_offsets, pub.cw_seeds, pub.cw_bits, pub.epochs, pub.cw_leaf)
        nt = int(out.nbytes >= _NT_MIN_BYTES)
        shape = (half_w, tau, group, keys.party, nt, _FD_PARTS)
        tasks = (bounds, tasks_i, seeds, t)
        sizes = (cap, max_h)
        if proofs is None:
            _fde.run_native(native, tasks, key, shape, sizes, out.reshape(-1), _AES_LOG)
        else:
            assert isinstance(native, _vde.NativeVMMO) and pub.cw_proof is not None
            proof = (np.ascontiguousarray(offsets[:-1]), pub.cw_proof, proofs)
            _vde.run_native_checked(
                native, tasks, key, shape, sizes, proof, out.reshape(-1), _AES_LOG
            )
        return out, offsets
    # Level buffers, allocated once and reused by every chunk (fd_scratch's layout: depth d's
    # nodes in bufs[d & 1], the left and right ciphertexts in bufs[2] and bufs[3]).
    bufs, tbufs, no_log = _fde.fd_scratch(cap, None, 0)
    scratch = (bufs, tbufs, np.empty((int(np.diff(bounds).max()), 4), dtype=_U64))
    enc_l = bufs[2]
    if proofs is not None:
        p_in = np.empty((_vk.BLOCKS * cap, 2), dtype=_U64)
        p_enc = np.empty((_vk.BLOCKS * cap + 1, 2), dtype=_U64)
        key_first = np.ascontiguousarray(offsets[:-1])
    flat = out.reshape(-1)
    aes = _mmo_ciphers()
    left, right, value = (
        aes.left.encrypt_view_into,
        aes.right.encrypt_view_into,
        aes.value.encrypt_view_into,
    )
    # Byte views taken once: slicing a memoryview is far cheaper than re-viewing arrays per call.
    mv = [b.data.cast("B") for b in bufs]
    # fn = 0: fd_levels runs no AES (one level per call, the ciphers above between calls).
    no_aes = (0, np.zeros(0, dtype=_U64), np.zeros(1, dtype=np.int32), no_log, 0, 2)
    pub4 = (pub.level_offsets, pub.cw_seeds, pub.cw_bits, pub.epochs)
    fd_levels = _k.fd_levels
    for c in range(len(bounds) - 1):
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        h = int(tasks_i[lo, 2])
        n, _ = fd_levels(
            no_aes, scratch, (lo, hi, -1, 0, h, 0), (tasks_i, seeds), pub4, half_w, group
        )
        for level in range(h):
            mv_src = mv[level & 1][: 16 * n]
            left(mv_src, mv[2])
            right(mv_src, mv[3])
            chunk = (lo, hi, level, level + 1, h, n)
            n, _ = fd_levels(no_aes, scratch, chunk, (tasks_i, seeds), pub4, half_w, group)
        src, t_src = bufs[h & 1], tbufs[h & 1]
        value(mv[h & 1][: 16 * n * half_w], mv[2])
        _k.fd_leaves(
            enc_l, src, t_src, lo, hi, tasks_i, pub.cw_leaf, half_w, tau, group, keys.party, flat
        )
        if proofs is not None and pub.cw_proof is not None:
            chunk_tasks = tasks_i[lo:hi]
            _vk.fd_proof_inputs(src, t_src, chunk_tasks, key_first, pub.epochs, half_w, p_in)
            aes.proof.encrypt_prefix_into(p_in[: _vk.BLOCKS * n], p_enc)  # n: chunk's leaves
            _vk.fd_proof_finish(p_enc, p_in, t_src, chunk_tasks, pub.cw_proof, proofs)
    return out, offsets


def key_range(keys: DPFKeyBatch, lo: int, hi: int) -> DPFKeyBatch:
    """Return keys ``lo..hi-1`` of a batch as a batch of their own: views, not validated again.

    The batch was validated when it was built, so a consecutive range of its keys is valid
    too (a server evaluates one client's keys in many ranges; re-checking each would cost a
    second parse).

    Raises
    ------
    DPFKeyError
        If ``0 <= lo <= hi <= num_keys`` does not hold.
    """
    pub = keys.public
    if not 0 <= lo <= hi <= pub.num_keys:
        raise DPFKeyError(f"key range [{lo}, {hi}) outside [0, {pub.num_keys})")
    if (lo, hi) == (0, pub.num_keys):
        return keys
    a, b = int(pub.level_offsets[lo]), int(pub.level_offsets[hi])
    part = object.__new__(DPFPublicBatch)
    for name, value in (
        ("tau", pub.tau),
        ("domain_bits", pub.domain_bits[lo:hi]),
        ("epochs", pub.epochs[lo:hi]),
        ("cw_seeds", pub.cw_seeds[a:b]),
        ("cw_bits", pub.cw_bits[a:b]),
        ("cw_leaf", pub.cw_leaf[lo:hi]),
        ("cw_proof", None if pub.cw_proof is None else pub.cw_proof[lo:hi]),
        ("level_offsets", pub.level_offsets[lo : hi + 1] - a),
    ):
        object.__setattr__(part, name, value)
    # Not DPFKeyBatch(...): its checks (a reduction over the seeds) ran on the whole batch, and
    # a server makes about 50 ranges of each client (the checked constructor took ~0.2 ms a
    # call on caches a segment's evaluation had left cold).
    batch = object.__new__(DPFKeyBatch)
    object.__setattr__(batch, "party", keys.party)
    object.__setattr__(batch, "root_seeds", keys.root_seeds[lo:hi])
    object.__setattr__(batch, "public", part)
    return batch


def _check_proofs_out(pub: DPFPublicBatch, proofs: NDArray[np.uint64], total: int) -> None:
    """Check the ``proofs`` output of :func:`evaluate_batch` and that the keys are verifiable."""
    if pub.cw_proof is None:
        raise ConfigurationError("proofs need verifiable keys (with proof correction words)")
    check_words_out("proofs", proofs, (total, PROOF_WORDS))


def check_words_out(name: str, buf: object, shape: tuple[int, ...]) -> None:
    """Refuse an output array that compiled code, writing by shape, would overrun or misread.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    buf : object
        The array the caller passed.
    shape : tuple of int
        The shape the kernel writes.

    Raises
    ------
    ConfigurationError
        Unless ``buf`` is a writeable, C-contiguous uint64 array of ``shape``.
    """
    if (
        isinstance(buf, np.ndarray)
        and buf.dtype == _U64
        and buf.shape == shape
        and buf.flags.c_contiguous
        and buf.flags.writeable
    ):
        return
    got = (
        f"{buf.dtype} {buf.shape}{'' if buf.flags.c_contiguous else ' (not C-contiguous)'}"
        f"{'' if buf.flags.writeable else ' (read-only)'}"
        if isinstance(buf, np.ndarray)
        else type(buf).__name__
    )
    raise ConfigurationError(
        f"{name} must be a writeable C-contiguous uint64 array of shape {shape}, got {got}"
    )


def evaluate(key: DPFKey) -> NDArray[np.uint64]:
    """Full-domain evaluation of one key share.

    Parameters
    ----------
    key : DPFKey
        One server's share.

    Returns
    -------
    numpy.ndarray
        ``(2**domain_bits, tau)`` uint64 shares of ``f`` on the whole domain.
    """
    values, _ = evaluate_batch(key.as_batch())
    return values
