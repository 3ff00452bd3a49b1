"""DPF key generation (BGI16 Gen) for many keys at once, written straight into the wire blob.

:func:`gen_public` computes the public part of ``m`` key pairs (the algorithm and its choices are
:mod:`flwr_fsl.crypto.dpf`'s; :func:`~flwr_fsl.crypto.dpf.generate_keys_batch` is the public
entry point) and returns it with its serialized form already made: the blob is allocated once
at its final size (:mod:`flwr_fsl.crypto.dpf_wire`), the kernels
(:mod:`flwr_fsl.kernels.dpf_gen_kernels`) write every seed and leaf correction word and the
packed control bits into their place in it, and the returned batch's ``cw_seeds`` and
``cw_leaf`` (and ``cw_proof``) are read-only views of the ``bytes`` object that
:meth:`~flwr_fsl.crypto.dpf_keys.DPFPublicBatch.to_bytes` then returns as it is. So a client's
upload is written once and copied once (buffer to ``bytes``).

Keys are processed in chunks of :data:`GEN_CHUNK` (:data:`NATIVE_GEN_CHUNK`) consecutive keys,
each chunk's keys in order of decreasing tree depth, so each level's AES calls cover the chunk's
keys that still have that level (one call per fixed key) and everything a chunk reads and writes
per key (root seeds, values, leaf and proof words, correction-word rows) lies in a window of the
chunk's keys.
Where OpenSSL's ``libcrypto`` loads (:func:`~flwr_fsl.kernels.aes.native_aes`), the whole chunk
loop is one GIL-free numba call that calls AES natively
(:func:`~flwr_fsl.kernels.dpf_gen_kernels.gen_run`); elsewhere, or with ``native=False``, the
same kernels run from Python between ``cryptography`` calls. Both write the same bytes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.threads import run_ranges
from flwr_fsl.crypto.dpf_keys import (
    _HEADER_BYTES,
    _KIND_PUBLIC,
    _NO_PARTY,
    _PROOF_VERSION,
    _U64,
    _VERSION,
    PROOF_WORDS,
    DPFPublicBatch,
    _group,
    _tree_levels,
    _write_header,
)
from flwr_fsl.crypto.dpf_wire import pack_cw_bits_into, public_layout, u64_view, write_prefix
from flwr_fsl.crypto.prg import (
    MMO_KEY,
    MMO_KEY_LEFT,
    MMO_KEY_PROOF,
    MMO_KEY_RIGHT,
    TAG_ROOT_SEED,
    MMOCiphers,
    derive_root_seeds,
)
from flwr_fsl.kernels import dpf_gen_kernels as _g
from flwr_fsl.kernels import dpf_kernels as _k
from flwr_fsl.kernels import vdpf_kernels as _vk
from flwr_fsl.kernels.aes import NativeAES, native_aes

__all__ = ["GEN_CHUNK", "NATIVE_GEN_CHUNK", "gen_public", "gen_roots"]

GEN_CHUNK = 1 << 13
"""Keys per chunk: 2 x 8192 blocks (256 KiB) per level call, so a chunk's blocks, their two
encryptions and its leaf buffers stay in a core's L2 (measured at m = 131,777 keys: 4096-8192
within noise of each other, 32768 about 8% slower, one call over all keys slower still)."""


NATIVE_GEN_CHUNK = 1 << 11
"""Keys per chunk of the native driver, which pays no Python call per AES call: its level,
leaf and proof buffers (about 1 MiB at 2048 keys, with proofs) stay in a core's L2 (measured at
131,072 keys, CPU time: 512-2048 within 1% of each other, 8192 about 12% slower)."""

_NATIVE = threading.local()  # one set of OpenSSL contexts per thread (a context is not shared)


def _native_contexts() -> tuple[int, NDArray[np.uint64]] | None:
    """Return this thread's ``(EVP_EncryptUpdate, (left, right, value, proof) contexts)``."""
    if not hasattr(_NATIVE, "ctxs"):
        ciphers = [native_aes(k) for k in (MMO_KEY_LEFT, MMO_KEY_RIGHT, MMO_KEY, MMO_KEY_PROOF)]
        if any(c is None for c in ciphers):
            _NATIVE.ctxs = None
        else:
            kept: list[NativeAES] = [c for c in ciphers if c is not None]
            _NATIVE.keep = kept
            _NATIVE.ctxs = (kept[0].fn, np.array([c.ctx for c in kept], dtype=_U64))
    ctxs: tuple[int, NDArray[np.uint64]] | None = _NATIVE.ctxs
    return ctxs  # None where libcrypto does not load (or FLWR_FSL_NATIVE_AES=0)


def gen_roots(master_seed: bytes, count: int) -> NDArray[np.uint64]:
    """Return :func:`~flwr_fsl.crypto.prg.derive_root_seeds`'s root seeds (validated inputs).

    Where OpenSSL loads natively (and on little-endian hosts, where the PRF's words are the
    native ones) one numba call lays out and encrypts the blocks in place
    (:func:`~flwr_fsl.kernels.dpf_gen_kernels.root_seeds`); elsewhere the PRF from Python.

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    aes = native_aes(master_seed) if sys.byteorder == "little" and count > 0 else None
    if aes is None:
        return derive_root_seeds(master_seed, count)
    out = np.empty((count + 1, 2), dtype=_U64)
    if not _g.root_seeds(aes.fn, aes.ctx, _U64(TAG_ROOT_SEED), out):
        raise RuntimeError("OpenSSL AES failed")
    aes.close()
    return out[:count]


_SCRATCH_MAX = 64 << 20
"""Largest blob buffer a thread keeps between Gen calls (bytes)."""


def _blob_scratch(nbytes: int) -> NDArray[np.uint8]:
    """Return ``nbytes`` of this thread's blob buffer, kept between calls up to a size.

    Every byte of the blob is written before it is copied out, and nothing returned views the
    buffer; keeping it saves a fresh allocation's page faults on every call (about a quarter
    of the kernels' time at 131k keys).
    """
    buf: NDArray[np.uint8] | None = getattr(_NATIVE, "blob", None)
    if buf is None or buf.shape[0] < nbytes:
        buf = np.empty(nbytes, np.uint8)
        if nbytes <= _SCRATCH_MAX:
            _NATIVE.blob = buf
    return buf[:nbytes]


def gen_public(  # noqa: PLR0913 - the four MMO keys' inputs, plus the driver choice and its log
    alphas: NDArray[np.uint64],
    betas: NDArray[np.uint64],
    dbits: NDArray[np.int64],
    root0: NDArray[np.uint64],
    root1: NDArray[np.uint64],
    epoch: int,
    aes: MMOCiphers,
    proof: bool = False,
    *,
    native: bool = True,
    log: list[int] | None = None,
    threads: int = 1,
    tail: tuple[int, Callable[[DPFPublicBatch], bytes]] | None = None,
) -> DPFPublicBatch:
    """Generate the public part of ``m`` keys for the given root seeds (validated inputs).

    ``aes`` are the four fixed-key ciphers (:func:`~flwr_fsl.crypto.prg._mmo_ciphers`, passed
    in so a benchmark can record the calls). With ``proof`` (even ``tau`` only) each key also
    gets its verifiable-DPF proof correction word ``cs = H(alpha, blk_0) ^ H(alpha, blk_1)``
    (:mod:`flwr_fsl.kernels.vdpf_kernels`). With ``native`` (the default) the chunk loop runs
    in one numba call with AES from OpenSSL where ``libcrypto`` loads (``aes`` is then unused
    and the block count of every AES call is appended to ``log`` when it is a list). With
    ``threads >= 2`` the native driver splits the keys into that many ranges of about equal
    work (:func:`_split`) and runs them at once on a pool (the kernels and OpenSSL release the
    GIL; every range writes its own keys' words), the same bytes as one thread.

    ``tail = (n, make)`` leaves ``n`` bytes after the public part for a trailer computed from it
    (a value check's): ``make`` gets the finished batch (its arrays views of this thread's
    buffer: it must not keep them) and returns the ``n`` bytes, which go into place before the
    one copy out; the returned batch's :meth:`~flwr_fsl.crypto.dpf_keys.DPFPublicBatch.blob`
    is then the public part followed by the trailer.

    Returns
    -------
    DPFPublicBatch
        The public part, its serialized form cached (read-only arrays).

    Raises
    ------
    RuntimeError
        If OpenSSL fails or ``make`` returns other than ``n`` bytes.
    """
    m, tau = betas.shape
    half_w = _group(tau) * tau // 2
    tl = _tree_levels(dbits, tau)
    offsets = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(tl, out=offsets[1:])
    n_levels = int(offsets[-1])
    ctxs = _native_contexts() if native else None
    chunk = NATIVE_GEN_CHUNK if ctxs is not None else GEN_CHUNK  # the drivers' chunks
    plan = _g.gen_plan(alphas, dbits, tl, offsets, _group(tau), min(chunk, max(m, 1)))
    lay = public_layout(_HEADER_BYTES, m, 2 * half_w, n_levels, proof, True)
    buf = _blob_scratch(lay.end + (0 if tail is None else tail[0]))
    _write_header(buf, _KIND_PUBLIC, _NO_PARTY, tau, m, _PROOF_VERSION if proof else _VERSION)
    domain_bits = dbits.astype(np.uint8)
    epochs = np.full(m, epoch, dtype=_U64)
    write_prefix(buf, lay, domain_bits, epochs)
    little = sys.byteorder == "little"  # the kernels write the little-endian words in place
    job = _Job(
        alphas=alphas,
        betas=betas,
        order=plan[0],
        depth=plan[1],
        path=plan[2],
        rows=plan[3],
        gpos=plan[4],
        roots=(root0, root1),
        epoch=_U64(epoch),
        aes=aes,
        cw_seeds=(
            u64_view(buf, lay.seeds, 2 * n_levels).reshape(n_levels, 2)
            if little
            else np.empty((n_levels, 2), _U64)
        ),
        cw_bits=np.empty(n_levels, dtype=np.uint8),
        cw_leaf=(
            u64_view(buf, lay.leaf, m * 2 * half_w).reshape(m, 2 * half_w)
            if little
            else np.empty((m, 2 * half_w), _U64)
        ),
        cw_proof=(
            None
            if not proof
            else u64_view(buf, lay.proof_at, PROOF_WORDS * m).reshape(m, PROOF_WORDS)
            if little
            else np.empty((m, PROOF_WORDS), dtype=_U64)
        ),
    )
    if ctxs is None:
        _run(job)
    else:
        _run_threads(job, log, threads)
    if not little:  # pragma: no cover - big-endian hosts: native words, converted here
        u64_view(buf, lay.seeds, 2 * n_levels)[:] = job.cw_seeds.reshape(-1)
        u64_view(buf, lay.leaf, m * 2 * half_w)[:] = job.cw_leaf.reshape(-1)
    pack_cw_bits_into(job.cw_bits, buf[lay.bits : lay.proof_at])
    if job.cw_proof is not None and not little:  # pragma: no cover - big-endian hosts
        u64_view(buf, lay.proof_at, PROOF_WORDS * m)[:] = job.cw_proof.reshape(-1)
    if tail is not None:  # the trailer, from the finished words, into the room left for it
        pre = {"tau": tau, "domain_bits": domain_bits, "epochs": epochs}
        pre |= {"cw_seeds": job.cw_seeds, "cw_bits": job.cw_bits, "cw_leaf": job.cw_leaf}
        pre |= {"cw_proof": job.cw_proof, "level_offsets": offsets}
        trailer = tail[1](DPFPublicBatch._from_wire(None, pre))
        if len(trailer) != tail[0]:
            raise RuntimeError(f"the trailer has {len(trailer)} bytes, {tail[0]} reserved")
        buf[lay.end :] = np.frombuffer(trailer, np.uint8)
    wire = buf.tobytes()
    if little:  # the batch's words are views of the blob it returns (no second copy)
        cw_seeds = np.frombuffer(wire, _U64, 2 * n_levels, lay.seeds).reshape(n_levels, 2)
        cw_leaf = np.frombuffer(wire, _U64, m * 2 * half_w, lay.leaf).reshape(m, 2 * half_w)
        cw_proof = (
            None
            if job.cw_proof is None
            else np.frombuffer(wire, _U64, PROOF_WORDS * m, lay.proof_at).reshape(m, PROOF_WORDS)
        )
    else:  # pragma: no cover
        cw_seeds, cw_leaf, cw_proof = job.cw_seeds, job.cw_leaf, job.cw_proof
    fields = {"tau": tau, "domain_bits": domain_bits, "epochs": epochs, "cw_seeds": cw_seeds}
    fields |= {"cw_bits": job.cw_bits, "cw_leaf": cw_leaf, "cw_proof": cw_proof}
    return DPFPublicBatch._from_wire(wire, fields | {"level_offsets": offsets}, lay.end)


@dataclass
class _Job:
    """One Gen call: its validated inputs, per-key geometry and the arrays it writes."""

    alphas: NDArray[np.uint64]
    betas: NDArray[np.uint64]
    order: NDArray[np.int64]  # key numbers chunk by chunk, each by decreasing tree depth
    depth: NDArray[np.int64]  # tree levels of each key, in `order`
    path: NDArray[np.uint64]  # tree-path bits of each key (MSB first), in `order`
    rows: NDArray[np.int64]  # each key's first row of cw_seeds / cw_bits, in `order`
    gpos: NDArray[np.int64]  # position of alpha in its leaf group, by key number
    roots: tuple[NDArray[np.uint64], NDArray[np.uint64]]
    epoch: np.uint64
    aes: MMOCiphers
    cw_seeds: NDArray[np.uint64]
    cw_bits: NDArray[np.uint8]
    cw_leaf: NDArray[np.uint64]
    cw_proof: NDArray[np.uint64] | None


def _run(job: _Job) -> None:
    """Run Gen chunk by chunk (each deepest keys first), writing into the job's output arrays."""
    m, half_w = job.betas.shape[0], job.cw_leaf.shape[1] // 2
    order, depth_sorted = job.order, job.depth
    aes = job.aes
    chunk = min(GEN_CHUNK, max(m, 1))
    seeds = np.empty((2 * chunk, 2), dtype=_U64)  # party b's block of key i at row 2 * i + b
    enc = np.empty((2, 2 * chunk + 1, 2), dtype=_U64)  # under the left key, the right key
    conv = np.empty((2 * chunk * half_w, 2), dtype=_U64)
    conv_enc = np.empty((2 * chunk * half_w + 1, 2), dtype=_U64)
    state_t = np.empty((chunk, 2), dtype=np.uint8)  # gen_init's; the blocks carry the bits
    if job.cw_proof is not None:
        p_in = np.empty((2 * chunk * _vk.BLOCKS, 2), dtype=_U64)
        p_enc = np.empty((2 * chunk * _vk.BLOCKS + 1, 2), dtype=_U64)
    for lo in range(0, m, chunk):
        n = min(chunk, m - lo)
        keys = order[lo : lo + n]
        depth, path, rows = depth_sorted[lo : lo + n], job.path[lo : lo + n], job.rows[lo : lo + n]
        _k.gen_init(order, lo, n, job.roots[0], job.roots[1], state_t, seeds)
        # depth is non-increasing: the keys that have level `level` are a prefix.
        prefix = np.searchsorted(-depth, -np.arange(depth[0]), side="left").tolist()
        for level, active in enumerate(prefix):
            aes.left.encrypt_prefix_into(seeds[: 2 * active], enc[0])
            aes.right.encrypt_prefix_into(seeds[: 2 * active], enc[1])
            _g.gen_level(enc, seeds, level, path[:active], depth[:active], rows,
                         job.cw_seeds, job.cw_bits)  # fmt: skip
        if job.cw_proof is not None:
            _vk.gen_proof_inputs(n, seeds, order, lo, job.alphas, p_in)
            aes.proof.encrypt_prefix_into(p_in[: 2 * n * _vk.BLOCKS], p_enc)
            _vk.gen_proof_words(p_enc, p_in, n, order, lo, job.cw_proof)
        _g.gen_leaf_blocks(n, seeds, job.epoch, half_w, conv)
        aes.value.encrypt_prefix_into(conv[: 2 * n * half_w], conv_enc)
        _g.gen_leaf_correction(conv_enc, conv, keys, seeds, job.gpos, job.betas, job.cw_leaf)


_MIN_KEYS_PER_THREAD = 4 * NATIVE_GEN_CHUNK
"""Fewest keys a thread of the native driver gets (below that a second thread costs more than
it saves)."""


def _split(depth: NDArray[np.int64], parts: int) -> list[tuple[int, int]]:
    """Cut the depth-sorted keys into ``parts`` ranges of about equal work, at chunk bounds.

    A key's work is about its tree levels plus two (its leaf and proof blocks).
    """
    work = np.cumsum(depth + 2)
    total = int(work[-1])
    cuts = [0]
    for q in range(1, parts):
        at = int(np.searchsorted(work, total * q // parts))
        at = min(depth.shape[0], -(-at // NATIVE_GEN_CHUNK) * NATIVE_GEN_CHUNK)
        cuts.append(max(at, cuts[-1]))
    cuts.append(depth.shape[0])
    return [(lo, hi) for lo, hi in pairwise(cuts) if hi > lo]


def _run_threads(job: _Job, log: list[int] | None, threads: int) -> None:
    """Run the native driver over key ranges, on ``threads`` threads where it pays.

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    m = job.betas.shape[0]
    parts = max(1, min(threads, m // _MIN_KEYS_PER_THREAD))
    ranges = _split(job.depth, parts) if parts > 1 else [(0, m)]
    logs: list[list[int] | None] = [None if log is None else [] for _ in ranges]

    def work(q: int) -> None:
        ctxs = _native_contexts()  # this thread's OpenSSL contexts
        if ctxs is None:  # pragma: no cover - libcrypto loaded in the caller's thread
            raise RuntimeError("OpenSSL AES is not available in a Gen thread")
        _run_native(job, ctxs, logs[q], ranges[q])

    run_ranges(work, len(ranges), len(ranges), "fsl-dpf-gen")
    if log is not None:
        for part in logs:
            log.extend(part or [])


def _run_native(
    job: _Job,
    ctxs: tuple[int, NDArray[np.uint64]],
    log: list[int] | None,
    keys: tuple[int, int],
) -> None:
    """Run Gen of the keys ``keys[0]:keys[1]`` (in plan order) in one GIL-free numba call.

    :func:`~flwr_fsl.kernels.dpf_gen_kernels.gen_run` on those keys' slice of the plan; it
    writes only their words.

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    lo, hi = keys
    m, half_w = hi - lo, job.cw_leaf.shape[1] // 2
    geom = (job.order[lo:hi], job.depth[lo:hi], job.path[lo:hi], job.rows[lo:hi])
    depth_s = geom[1]
    chunk = min(NATIVE_GEN_CHUNK, max(m, 1))
    proof = job.cw_proof is not None
    cw_proof = job.cw_proof if job.cw_proof is not None else np.empty((0, PROOF_WORDS), _U64)
    n_log = 0
    if log is not None and m:  # per chunk: two calls per level, then proof and value
        n_chunks = -(-m // chunk)
        n_log = n_chunks * (2 * int(depth_s.max()) + 2)
    calls_log = np.zeros(n_log, dtype=np.int64)
    fn, ctx = ctxs
    inputs = (job.alphas, job.betas, job.roots[0], job.roots[1], job.gpos)
    outs = (job.cw_seeds, job.cw_bits, job.cw_leaf, cw_proof)
    shape = np.array([chunk, half_w, int(proof)], dtype=np.int64)
    calls = _g.gen_run(fn, ctx, inputs, geom, outs, shape, job.epoch, calls_log)
    if calls < 0:
        raise RuntimeError("OpenSSL AES failed")
    if log is not None:
        log.extend(calls_log[:calls].tolist())
