"""Projected range check of a client's SSA value words: the default value check (issue 21 item 4).

In every checked round with :attr:`SSAParams.value_check
<flwr_fsl.families.ssa.messages.SSAParams.value_check>` ``"projected"`` (the default) both
servers run it (:mod:`flwr_fsl.families.ssa.verify`). It is the approximate range check of
PINE (Rothblum, Omri, Chen, Talwar 2023, "wraparound" checks) and of approximate range
proofs: instead of range-checking each of the ``n = num_keys * value_width`` value words
(:mod:`flwr_fsl.families.ssa.range_check`, ``8 L`` upload bytes per word), the servers
range-check ``r`` random {-1, 0, +1} projections of them, with the exact machinery of
``range_check`` (bits, integer shares with bounded masks, an FLP in F_p, an exact Z_2^64
relation). Its cost does not depend on ``n``.

**Construction.** Let ``a_n`` (``n < N``) be the client's value words in Z_2^64 and
``a^(s)_n`` server ``s``'s share of them: the sum of a key's value words over its evaluated
points, which the key check makes the word at the key's one nonzero point.

1. *Commitments.* ``k_s = range_check.party_key(keys_s)`` is a secret hash of server ``s``'s
   root seeds (and the round), known to the client and server ``s`` only. The client writes in
   the public trailer ``part_a = H(k_0)``, ``part_b = H(k_1)`` and a 16-byte ``salt``; each
   server recomputes its own part and refuses a mismatch. Both servers hash the keys' public
   part (:func:`public_binding`: with :attr:`SSAParams.projected_digest
   <flwr_fsl.families.ssa.messages.SSAParams.projected_digest>` 1 every public field,
   :func:`public_digest`; with 2 the fields that fix the value shares, :func:`public_digest_v2`,
   below). ``zseed = H(tag, salt, part_a, part_b, public)`` is therefore fixed after everything
   that decides the value shares (root seeds and correction words): a client that changes a
   word changes ``zseed``.
2. *Projections.* ``z_(k,n)`` in {-1, 0, +1} with probabilities 1/4, 1/2, 1/4 (two PRG bits:
   ``b0 - b1``) from an AES-CTR stream on ``zseed`` (:func:`projection_matrix`); each server
   computes its share ``y^(s)_k = sum_n z_(k,n) a^(s)_n`` in Z_2^64 locally (:func:`project`,
   ``r * N`` adds), so ``y^(0) + y^(1) = y = Z a``.
3. *Exact range check of y.* The client range-checks ``y`` against ``T`` with
   :func:`range_check.make_upload <flwr_fsl.families.ssa.range_check.make_upload>` (``r * L_T``
   bits, ``L_T = bit_length(2T)``); the servers run
   :func:`range_check.server_check <flwr_fsl.families.ssa.range_check.server_check>` on their
   shares of ``y``. The same guarantees hold: ``|y_k| <= T`` for every ``k`` exactly (centered
   Z_2^64), except with the FLP's false-accept probability (about ``2^-54``).

**Bound.** ``T = c * B2`` with ``c = 4`` (:data:`~flwr_fsl.families.ssa.messages.PROJECTION_SLACK`)
and ``B2`` the public bound on an honest client's L2 norm
(:attr:`SSAParams.value_l2_bound <flwr_fsl.families.ssa.messages.SSAParams.value_l2_bound>`:
``sqrt(k w) * bound`` with ``k w`` the words a client can fill, tighter in a DP round, whose
clients clip to ``C``: ``W C 2^f + sqrt(k w)``).

**Completeness.** Each ``z`` is sub-Gaussian with variance proxy 1/2 (``E e^(l z) = (1 +
cosh l)/2 <= e^(l^2/4)``, term by term), so ``P(|y_k| > c ||a||_2) <= 2 exp(-c^2)`` and an honest
client (``||a||_2 <= B2``) fails a try with probability at most ``r * 2 exp(-c^2)``
(``1.4e-5`` at ``c = 4``, ``r = 64``; the lead's Hoeffding bound ``r * 2 exp(-c^2/2)`` is the
loose version). The client computes ``y`` itself before uploading and, if some ``|y_k| > T``,
draws the next salt (no new keys): at most :data:`MAX_TRIES` tries, then it raises (only a
client that did not clip can get there). The salt a server sees is one whose projections pass:
against any fixed alternative input a server can rule it out with probability at most
``r * 2 exp(-c^2)``.

**Soundness (per word, exact in Z_2^64).** Suppose some value word has centered ``|a_n| > 2T``.
Fix every ``z`` but ``z_(k,n)`` and let ``rest = y_k - z_(k,n) a_n``. ``y_k`` is ``rest``
(probability 1/2) or ``rest +- a_n`` (1/4 each). If ``rest`` is in ``[-T, T]`` then neither
``rest + a_n`` nor ``rest - a_n`` is (their distance to ``rest`` is ``|a_n| > 2T`` mod 2^64);
otherwise at most the two of them are. Either way projection ``k`` passes with probability at
most 1/2; the ``r`` projections use independent ``z``, so all pass with probability at most
``2^-r`` per salt (modelling the PRG and the hash as random), and a client grinding salts
(or keys) needs about ``2^r`` tries. **Guarantee:** a client that passes has every centered
``|a_n| <= 2T``, except with probability ``2^-r`` per try plus the FLP's ``~2^-54``.

**Slack against the exact check.** The exact check holds each word to ``bound``; this one to
``2T = 2c B2 = 2c sqrt(k w) bound`` at the defaults (``8 sqrt(k w)`` times ``bound``: about
460x at ``k = 3277``, ``w = 1``). In a DP round ``B2`` is the clipped norm, so ``2T`` is ``8``
times the clip (plus rounding) whatever ``k``.

**An L2 statement** holds only without wraparound: if every ``|a_n| <= 2T`` (above) and
``N * 2T < 2^63`` (true for every round with ``N < 2^63 / 2T``; :func:`l2_statement` says
whether it applies), then ``y_k`` in Z_2^64 is the integer ``sum z a``, with ``E y^2 =
||a||^2/2`` and ``E y^4 <= (3/4) ||a||^4``; by Paley-Zygmund (``theta = 1/4``) a client with
``||a||_2 > 2 sqrt(2) T`` passes one projection with probability at most ``13/16``, all ``r``
with at most ``(13/16)^r`` (``1.7e-6`` at ``r = 64``). So such a client passes with probability
at most ``2^-r + (13/16)^r``. This is weaker than the per-word guarantee; we document it, the
code relies on the per-word one only.

**Digest version 2** (:func:`public_digest_v2`, rounds with ``projected_digest=2``, parameter
version 8). Version 1 hashes every public field; about 40% of its bytes at ``m = 2**20``
(``k/m = 10%``: 8.4 of 22.9 MB) are the verifiable keys' proof correction words ``cw_proof``,
and 1 MB the per-key epochs. Version 2 hashes ``tau``, the number of keys, the domain bits, the
epochs (8 bytes when every key has the same epoch, as Gen writes them), ``cw_seeds``,
``cw_bits`` and ``cw_leaf``, each cut into pieces of :data:`DIGEST_PIECE` bytes whose SHA-256
runs on the encode's threads, then one SHA-256 over the field lengths and the piece digests.
*Why it still binds the value shares.* Server ``s``'s value share of key ``j`` at a point is
:func:`~flwr_fsl.crypto.dpf.evaluate_batch`'s output: the leaf conversion of the seed reached
by walking key ``j``'s tree from its root seed, each level's seed and control bit corrected
by that level's ``cw_seeds`` / ``cw_bits`` row, the tree's depth and the leaf groups fixed by
the domain bits and ``tau``, the conversion keyed by the key's epoch, plus the control bit
times the ``cw_leaf`` row. It is a deterministic function of (root seed of ``s``, domain bits,
epochs, ``tau``, ``cw_seeds``, ``cw_bits``, ``cw_leaf``); ``cw_proof`` only enters the key
check's proof (whether both servers' proofs agree), never an output word. The root seeds are
bound by ``part_a`` / ``part_b`` (hashes of ``k_s``, which hashes the root seeds); the other
inputs by the version 2 digest: the field lengths are hashed, so the pieces of the fields are
unambiguous, and two different inputs with one digest give a SHA-256 collision (of the outer
hash, or of a piece). A malicious client that fixes ``zseed`` and then picks other correction
words therefore breaks SHA-256; one that changes ``cw_proof`` after ``zseed`` changes no value
share, and the key check accepts or rejects its keys exactly as for any other ``cw_proof``.
So the soundness statement below holds unchanged for version 2. Version 2 is the default of
a checked round (:data:`~flwr_fsl.families.ssa.messages.DEFAULT_PROJECTED_DIGEST`); version 1
(parameter version 7: its bytes and known answers are frozen) is still written when asked and
both versions are decoded and checked.

**Trailer** (after the keys' public part, or the U-DPF hint; :func:`trailer_bytes`):
``salt (16) || part_a (32) || part_b (32) || E(x || proof0) || part0 (32) || part1 (32)``,
where ``x || proof0`` are S0's integer bit shares and FLP proof share (``r L_T`` and
``O(sqrt(r L_T))`` words) encrypted with a pad only S0 derives (from ``k_0``); S1's masks and
proof share expand from ``H(k_1, salt)``. The check blobs the servers exchange have
``range_check``'s layout (digest, query seed, joint key, verifier share): :func:`range_check.
same_check <flwr_fsl.families.ssa.range_check.same_check>` decides both.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from concurrent.futures import wait

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.threads import run_ranges, worker_pool
from flwr_fsl.crypto import flp
from flwr_fsl.crypto.dpf import DPFKeyBatch, DPFPublicBatch
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.families.ssa import range_check as rc
from flwr_fsl.families.ssa.messages import PROJECTION_SLACK, SSAInputError, SSAParams
from flwr_fsl.families.ssa.verify import default_threads
from flwr_fsl.kernels.projection import project_range

__all__ = [
    "DIGEST_PIECE",
    "MAX_TRIES",
    "client_trailer",
    "honest_failure_bound",
    "l2_statement",
    "prepare_projected",
    "project",
    "project_shares",
    "projection_matrix",
    "public_binding",
    "public_digest",
    "public_digest_v2",
    "round_check",
    "soundness_bound",
    "split_trailer",
    "trailer_bytes",
    "value_trailer_bytes",
    "zseed",
]

MAX_TRIES = 32
"""Salts an honest client tries before it gives up (each fails with probability <= 1.4e-5)."""
_TAG = b"flwr_fsl/ssa-projected-check/v1\x00"
_TAG_V2 = b"flwr_fsl/ssa-projected-check/digest-v2\x00"
DIGEST_PIECE = 1 << 20
"""Bytes per piece of a field that :func:`public_digest_v2` hashes on its own (on a thread)."""
_SEED = 16
_HEAD = _SEED + 64  # salt, part_a, part_b
_CHUNK = 1 << 14  # value words per projection block (bounds the z matrix's memory)
_U64Array = NDArray[np.uint64]


def _h(*parts: bytes) -> bytes:
    return hashlib.sha256(_TAG + b"".join(parts)).digest()


def public_digest(public: DPFPublicBatch) -> bytes:
    """SHA-256 of a key batch's public fields (epochs, correction words, proof words)."""
    h = hashlib.sha256(_TAG + b"public" + int(public.tau).to_bytes(8, "little"))
    for arr in (public.domain_bits, public.epochs, public.cw_seeds, public.cw_bits, public.cw_leaf):
        h.update(np.ascontiguousarray(arr).data)  # the bytes of tobytes(), no copy
    if public.cw_proof is not None:
        h.update(np.ascontiguousarray(public.cw_proof).data)
    return h.digest()


def _binding_fields(public: DPFPublicBatch) -> list[NDArray[np.uint8]]:
    """Return the public fields that fix the value shares, as little-endian bytes (no LE copy).

    Epochs are ``01 || epoch`` when every key has the same one (Gen's keys), else ``00 ||``
    every key's epoch.
    """
    epochs = np.ascontiguousarray(public.epochs, "<u8")
    shared = epochs.shape[0] > 0 and bool((epochs == epochs[0]).all())
    head = np.frombuffer(b"\x01" if shared else b"\x00", np.uint8)
    epoch_bytes = np.concatenate([head, (epochs[:1] if shared else epochs).view(np.uint8)])
    fields = [np.ascontiguousarray(public.domain_bits, np.uint8), epoch_bytes]
    for arr, dtype in (
        (public.cw_seeds, "<u8"),
        (public.cw_bits, np.uint8),
        (public.cw_leaf, "<u8"),
    ):
        fields.append(np.ascontiguousarray(arr, dtype).reshape(-1).view(np.uint8))
    return fields


def public_digest_v2(public: DPFPublicBatch, threads: int = 1) -> bytes:
    """Digest version 2 of a key batch's public part: the fields that fix the value shares.

    ``tau``, the number of keys, the domain bits, the epochs, ``cw_seeds``, ``cw_bits`` and
    ``cw_leaf`` (not ``cw_proof``: module docstring, *Digest version 2*). Each field is cut
    into :data:`DIGEST_PIECE`-byte pieces, hashed on ``threads`` threads (``hashlib`` releases
    the GIL); the result is ``SHA-256(tag, tau, keys, every field's length, every piece's
    SHA-256)``, the same bytes for any thread count.
    """
    fields = _binding_fields(public)
    pieces = [
        (f, lo) for f in range(len(fields)) for lo in range(0, fields[f].shape[0], DIGEST_PIECE)
    ]

    def piece(j: int) -> bytes:
        f, lo = pieces[j]
        return hashlib.sha256(fields[f][lo : lo + DIGEST_PIECE].data).digest()  # no copy

    leaves = run_ranges(piece, len(pieces), min(threads, len(pieces)), "fsl-ssa-digest")
    sizes = [int(public.tau), int(public.num_keys), *(f.shape[0] for f in fields)]
    head = b"".join(n.to_bytes(8, "little") for n in sizes)
    return hashlib.sha256(_TAG_V2 + b"public" + head + b"".join(leaves)).digest()


def public_binding(params: SSAParams, public: DPFPublicBatch, threads: int = 1) -> bytes:
    """Return the round's digest of the keys' public part for ``zseed`` (``projected_digest``).

    :func:`public_digest` (version 1) or :func:`public_digest_v2` (version 2, on ``threads``
    threads); ``zseed`` binds it.
    """
    if params.projected_digest == 2:
        return public_digest_v2(public, threads)
    return public_digest(public)


def zseed(salt: bytes, part_a: bytes, part_b: bytes, public: bytes) -> bytes:
    """Return the 16-byte seed of the projections: ``H(tag, salt, part_a, part_b, public)``."""
    return _h(b"z", salt, part_a, part_b, public)[:_SEED]


def _z_block(stream: PRGStream, r: int, count: int) -> NDArray[np.int64]:
    """Draw the next ``count`` columns of ``Z`` (``(count, r)`` in {-1, 0, 1}) from the stream."""
    bits = 2 * r * count
    words = stream.words((bits + 63) // 64).astype("<u8")
    flat = np.unpackbits(words.view(np.uint8), bitorder="little")[:bits]
    pairs = flat.reshape(count, r, 2).astype(np.int64)
    return pairs[:, :, 0] - pairs[:, :, 1]


def projection_matrix(seed: bytes, r: int, n: int) -> NDArray[np.int64]:
    """Return ``Z`` (``(r, n)`` in {-1, 0, 1}, probabilities 1/4, 1/2, 1/4) of ``seed``."""
    stream = PRGStream(seed)
    blocks = [_z_block(stream, r, min(_CHUNK, n - lo)) for lo in range(0, n, _CHUNK)]
    return np.concatenate(blocks, axis=0).T if blocks else np.zeros((r, 0), np.int64)


def project(seed: bytes, r: int, words: _U64Array) -> _U64Array:
    """Return ``Z words`` in Z_2^64 (``(r,)`` uint64), ``Z`` the projections of ``seed``.

    Linear: applied to a server's shares it gives that server's shares of the projections.
    The columns of ``Z`` are read from the keystream's words as they come, never laid out
    (:func:`~flwr_fsl.kernels.projection.project_range` over every column; the stream draws of
    :func:`projection_matrix`'s blocks, ``2 r`` bits per column, are one contiguous stream).
    """
    from flwr_fsl.kernels.projection import project_range  # (kept out of the import block)

    a = np.ascontiguousarray(words, np.uint64).reshape(-1)
    return project_range(seed, r, a, 0, a.shape[0])


def _signed(y: _U64Array) -> NDArray[np.int64]:
    return np.asarray(y, np.uint64).view(np.int64)


def honest_failure_bound(r: int) -> float:
    """Probability an honest client's try fails (some ``|y_k| > T``): ``r * 2 exp(-c^2)``."""
    return min(1.0, r * 2.0 * math.exp(-(float(PROJECTION_SLACK) ** 2)))


def soundness_bound(params: SSAParams) -> float:
    """Probability a client with a word beyond ``2T`` passes one try: ``2^-r`` plus the FLP's."""
    r = params.projections
    return 2.0**-r + rc.false_accept_bound(r, params.projection_bound)


def l2_statement(params: SSAParams) -> bool:
    """Whether the L2 statement of the module docstring applies (``N * 2T < 2^63``)."""
    return params.num_keys * params.value_width * 2 * params.projection_bound < 1 << 63


def trailer_bytes(params: SSAParams) -> int:
    """Bytes of a client's projected-check trailer in a round."""
    bits = params.projections * rc.coefficients(params.projection_bound).shape[0]
    return _HEAD + 8 * (bits + flp.FLPShape(bits).proof_length) + 64


def _parts(params: SSAParams, keys: DPFKeyBatch) -> tuple[bytes, bytes]:
    """``(k_s, H(k_s))``: a server's secret key and its public part."""
    k = rc.party_key(params, keys)
    return k, _h(b"part" + bytes([keys.party]), k)


def _bindings(
    params: SSAParams, keys: tuple[DPFKeyBatch, DPFKeyBatch], threads: int
) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes], bytes]:
    """Return both servers' ``(k_s, H(k_s))`` and the digest of the public part.

    With ``threads >= 2`` the two party keys (SHA-256 of each server's root seeds) are hashed
    on a pool thread while this one hashes the public part (``hashlib`` releases the GIL), the
    digest's own pieces (version 2) on ``threads`` threads of their pool: the same bytes.
    """
    if threads < 2:
        return (
            _parts(params, keys[0]),
            _parts(params, keys[1]),
            public_binding(params, keys[0].public),
        )
    pool = worker_pool(1, "fsl-ssa-parts")  # not the digest's pool: no wait on itself
    parts = pool.submit(lambda: (_parts(params, keys[0]), _parts(params, keys[1])))
    try:
        public = public_binding(params, keys[0].public, threads)
    finally:
        wait([parts])  # nothing left running on the caller's keys
    part0, part1 = parts.result()
    return part0, part1, public


def client_trailer(
    params: SSAParams,
    keys: tuple[DPFKeyBatch, DPFKeyBatch],
    betas: _U64Array,
    threads: int | None = None,
) -> bytes:
    """Client: the projected-check trailer for its keys' payload ``betas`` (``(keys, key_tau)``).

    Salts are ``H(k_0, k_1, i)`` for ``i = 0, 1, ...`` (pseudorandom to each server); the first
    whose projections all lie in ``[-T, T]`` is used. The digest of the public part (version 2)
    and the projections run on ``threads`` threads (None:
    :func:`~flwr_fsl.families.ssa.verify.default_threads`, as Gen's); the same bytes.

    Raises
    ------
    ConfigurationError
        If no salt passes in :data:`MAX_TRIES` tries (value words far beyond the round's L2
        bound: a client that did not clip), or a value word is outside the fixed-point bound.
    """
    threads = default_threads() if threads is None else threads
    values = np.ascontiguousarray(betas[:, : params.value_width]).reshape(-1)
    (k0, part_a), (k1, part_b), public = _bindings(params, keys, threads)
    bound = params.projection_bound
    for i in range(MAX_TRIES):
        salt = _h(b"salt", k0, k1, i.to_bytes(4, "little"))[:_SEED]
        y = project_shares(zseed(salt, part_a, part_b, public), params.projections, values, threads)
        if int(np.abs(_signed(y)).max(initial=0)) <= bound:
            break
    else:
        raise ConfigurationError(
            f"the value words exceed the round's L2 bound ({params.value_l2_bound} in fixed "
            "point): no projection salt passes"
        )
    up = rc.make_upload(
        y,
        bound,
        seed1=_h(b"seed1", k1, salt)[:_SEED],
        blind0=_h(b"blind0", k0, salt)[:_SEED],
        prover=_h(b"prover", k0, k1, salt)[:_SEED],
    )
    words = np.concatenate([up.shares0, up.proof0])
    pad = PRGStream(_h(b"pad", k0, salt)[:_SEED]).words(words.shape[0])
    head = salt + part_a + part_b
    return head + (words ^ pad).astype("<u8").tobytes() + up.part0 + up.part1


def split_trailer(params: SSAParams, blob: bytes) -> tuple[bytes, bytes]:
    """Split a round's public part (or hint) into its head and projected-check trailer.

    Raises
    ------
    SSAInputError
        If the blob is not longer than a trailer (truncated, or keys without one).
    """
    return rc.cut_trailer(blob, trailer_bytes(params))


def project_shares(seed: bytes, r: int, words: _U64Array, threads: int = 1) -> _U64Array:
    """:func:`project` on the server: column ranges on ``threads`` threads, the same words.

    Each range reads its part of the keystream directly
    (:func:`flwr_fsl.kernels.projection.project_range`); the partial sums add up modulo
    ``2**64``.
    """
    flat = np.ascontiguousarray(words, np.uint64).reshape(-1)
    parts = max(1, min(threads, flat.shape[0] // _CHUNK))
    bounds = np.linspace(0, flat.shape[0], parts + 1).astype(np.int64)
    partial = run_ranges(
        lambda j: project_range(seed, r, flat, int(bounds[j]), int(bounds[j + 1])), parts, threads
    )
    y = np.zeros(r, np.uint64)
    for part in partial:
        y += part
    return y


def server_projected(
    params: SSAParams,
    keys: DPFKeyBatch,
    value_sums: _U64Array,
    trailer: bytes,
    expect: bytes | None,
    check_head: int,
    *,
    prepared: tuple[bytes, rc.PreparedServerCheck] | None = None,
    threads: int = 1,
) -> bytes:
    """One server's projected check of a client in a round; return its check blob.

    ``value_sums`` are the server's shares of every key's value words (``(keys, width)``);
    ``expect`` is the other server's whole check (S1) or None (S0, which draws the query
    seed), read after ``check_head`` bytes (the key-check digest) and the range digest.
    ``prepared`` is :func:`prepare_projected` of the same arguments if already computed (the
    server runs it on its pool while it evaluates the keys); ``threads`` project on that many
    threads (:func:`project_shares`).

    Raises
    ------
    SSAInputError
        If the trailer has the wrong size or does not match this server's material.
    """
    if prepared is None:
        args = (params, keys, trailer, expect, check_head)
        prepared = prepare_projected(*args, threads=threads)
    seed, check = prepared
    return check.finish(project_shares(seed, params.projections, value_sums, threads)).to_bytes()


def prepare_projected(
    params: SSAParams,
    keys: DPFKeyBatch,
    trailer: bytes,
    expect: bytes | None,
    check_head: int,
    *,
    public_hash: bytes | None = None,
    threads: int = 1,
) -> tuple[bytes, rc.PreparedServerCheck]:
    """:func:`server_projected`'s work that does not read the value sums; every one of its checks.

    Arguments as :func:`server_projected`'s; ``public_hash`` is :func:`public_binding` of the
    keys if already computed. Returns the projection seed and the prepared
    range check (:func:`~flwr_fsl.families.ssa.range_check.prepare_server_check`): the
    checks run in :func:`server_projected`'s order and raise its errors (projecting the
    value sums, the only step that reads them, refuses nothing).

    Raises
    ------
    SSAInputError
        As :func:`server_projected`.
    """
    if len(trailer) != trailer_bytes(params):
        raise SSAInputError("value check: the trailer has the wrong size")
    salt, part_a, part_b = trailer[:_SEED], trailer[_SEED : _SEED + 32], trailer[_SEED + 32 : _HEAD]
    k, mine = _parts(params, keys)
    if not hmac.compare_digest(mine, part_a if keys.party == 0 else part_b):
        name = "part_a" if keys.party == 0 else "part_b"
        raise SSAInputError(f"value check: {name} does not match this server's keys")
    seed = zseed(salt, part_a, part_b, public_hash or public_binding(params, keys.public, threads))
    bound = params.projection_bound
    body, part0, part1 = trailer[_HEAD:-64], trailer[-64:-32], trailer[-32:]
    if keys.party == 0:
        n_words = len(body) // 8
        pad = PRGStream(_h(b"pad", k, salt)[:_SEED]).words(n_words)
        words = np.frombuffer(body, "<u8").astype(np.uint64) ^ pad
        size = params.projections * rc.coefficients(bound).shape[0]
        blind0 = _h(b"blind0", k, salt)[:_SEED]
        private: rc.RangeUpload | bytes = rc.RangeUpload(
            words[:size], words[size:], blind0, b"", part0, part1
        )
    else:
        private = _h(b"seed1", k, salt)[:_SEED]
    query_seed = None  # without the other's check: draw one (S0, or a server checked alone)
    if expect is not None:
        start = check_head + 32  # after the key-check digest and the range digest
        if len(expect) < start + _SEED:
            raise SSAInputError("value check: the other server's check is malformed")
        query_seed = bytes(expect[start : start + _SEED])
    public = (part0, part1)
    check = rc.prepare_server_check(
        keys.party, params.projections, bound, public, private, query_seed
    )
    return seed, check


def round_check(
    params: SSAParams,
    keys: DPFKeyBatch,
    values: _U64Array,
    offsets: NDArray[np.int64],
    trailer: bytes,
    expect: bytes | None,
) -> bytes:
    """:func:`server_projected` on a server's evaluated points (``offsets``: each key's first row).

    Raises
    ------
    SSAInputError
        As :func:`server_projected`.
    """
    sums = np.add.reduceat(values[:, : params.value_width], offsets[:-1], axis=0)
    return server_projected(params, keys, sums, trailer, expect, 32)


# ------------------------------------------------------------------------------------------------
# The round's value check, whichever it is (protocol.py calls these).
# ------------------------------------------------------------------------------------------------


def value_trailer(
    params: SSAParams,
    keys: tuple[DPFKeyBatch, DPFKeyBatch],
    betas: _U64Array,
    threads: int | None = None,
) -> bytes:
    """Client: the round's value-check trailer (empty when the round has none).

    ``threads``: the projected check's digest and projections (:func:`client_trailer`; None:
    :func:`~flwr_fsl.families.ssa.verify.default_threads`); the same bytes for any count.
    """
    if params.value_check_mode == "projected":
        return client_trailer(params, keys, betas, threads)
    if params.value_check_mode == "exact":
        return rc.client_trailer(params, keys, betas)
    return b""


def value_trailer_bytes(params: SSAParams) -> int:
    """Bytes of the round's value-check trailer (0 when the round has none)."""
    if params.value_check_mode == "projected":
        return trailer_bytes(params)
    if params.value_check_mode == "exact":
        return rc.trailer_bytes(params)
    return 0


def split_value_trailer(params: SSAParams, blob: bytes) -> tuple[bytes, bytes | None]:
    """Split off the round's value-check trailer (None when the round has none).

    Raises
    ------
    SSAInputError
        If the blob is too short for the trailer.
    """
    if params.value_check_mode == "projected":
        return split_trailer(params, blob)
    if params.value_check_mode == "exact":
        return rc.split_trailer(params, blob)
    return bytes(blob), None


def value_round_check(
    params: SSAParams,
    keys: DPFKeyBatch,
    values: _U64Array,
    offsets: NDArray[np.int64],
    trailer: bytes,
    expect: bytes | None,
) -> bytes:
    """Return a server's check blob of the round's value check (projected or exact).

    Raises
    ------
    SSAInputError
        If the client's material does not match this server's.
    """
    if params.value_check_mode == "projected":
        return round_check(params, keys, values, offsets, trailer, expect)
    return rc.round_check(params, keys, values, offsets, trailer, expect)
