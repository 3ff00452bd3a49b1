"""Both servers check a client's SSA keys: one point per key, count 1, value words in range.

In a round with :attr:`SSAParams.verify <flwr_fsl.families.ssa.messages.SSAParams.verify>`
(the default) every client key is a *verifiable* DPF key (de Castro & Polychroniadou,
"Lightweight, Maliciously Secure Verifiable Function Secret Sharing", Eurocrypt 2022;
:mod:`flwr_fsl.kernels.vdpf_kernels`) and the layout leaves no key without a point:

* **Dummy slots.** Simple bin ``b`` with ``n_b`` elements gets a key over
  ``bit_length(n_b)`` bits (room for ``n_b + 1`` points) and the servers evaluate ``n_b + 1``
  points: ranks ``0..n_b-1`` are the bin's elements, point ``n_b`` is the bin's *dummy slot*,
  discarded when scattering. A stash key covers ``m + 1`` points, its dummy slot at ``m``. A
  real bin points at its element's rank, an empty bin (or stash slot) at its dummy slot.
* **Padding.** With an odd ``tau`` (early termination would put two points under one leaf seed,
  and the proof then bounds nonzero *pairs*) the keys carry one extra zero word per point
  (:attr:`SSAParams.key_tau`), which the servers ignore: early termination is never used for
  checked keys.
* **Count word.** With unit weights (``count_weighted`` and not ``weighted``) every key's point
  carries the count word exactly ``1`` (in fixed point), real or dummy.

Each server evaluates a client's keys once, computing in the same pass every evaluated point's
leaf proof ``pi_x = H(x, blk_x) ^ t_x * cs`` (equal at both servers, for every point, exactly
when the key pair differs at no more than one point), and sums each key's count words over its
evaluated points (a share ``C_b^(s)`` of key ``b``'s count). Its digest
(:func:`client_digest`) is SHA-256 over a domain tag (with the key-check version), one short
hash of each segment's proofs in segment order (a segment: consecutive keys of a fixed number of
points, fixed by the round's lengths; 64 bytes a point, in point order; segments are evaluated
and hashed on several threads: :func:`run_ranges`) and the normalized count vector (S0:
``C^(0) - 1``; S1: ``-C^(1)``; equal iff every key's count is exactly 1). The two servers'
digests of an honest client are equal, so exchanging them tells neither anything new; one that
differs drops the client at both.

**Digest version 3: a keyed universal hash** (issue 26; :data:`DIGEST_KEY_BYTES`). A segment's
hash is its GMAC tag, ``AES-GCM(K).encrypt(nonce, b"", aad=proofs)``, under the round's *digest
key* ``K``, with the nonce ``LE64(client) || LE32(segment)`` (a segment longer than one AES-GCM
call takes, a stash key past ``m = 2**24``, is fed in pieces: the same tag); version 2 (no key)
hashes each segment with SHA-256 and is kept for rounds opened without a key (an S0 that sends
the old ``OpenRound``). GHASH reads the proofs about 8x faster than SHA-256 (at ``m = 2**20``,
``k/m = 10%`` each server hashes about 210 MB of proofs per client). Why a keyed universal hash
suffices:

* *What must hold.* A forger wins if its two proof streams differ in some segment ``j``
  (``P_j^(0) != P_j^(1)``, equal lengths: the round fixes them) and the servers' digests are
  still equal: by SHA-256's collision resistance, equal tags ``T_j^(0) = T_j^(1)``. Both tags
  use the same key and nonce, so the mask ``AES_K(J0)`` cancels: ``GHASH_H(P_j^(0)) ^
  GHASH_H(P_j^(1)) = 0`` with ``H = AES_K(0^128)``, a nonzero polynomial in ``H`` of degree
  at most ``l_j + 1`` (``l_j`` 16-byte blocks). With ``K`` uniform and independent of the
  streams, this holds with probability at most ``(l_j + 1) / 2**128`` (plus AES's PRP
  advantage); over every segment of a client, at most ``(points * 4 + segments) / 2**128``,
  about ``2**-104`` at ``m = 2**20``. Only collisions matter, not preimages: the client knows
  both streams (it made both keys), so the hash need only be one the *client* cannot make
  collide, and a universal hash keyed by a key the client never sees is one.
* *Who knows the key.* A fresh key per round, drawn by S0 at round opening
  (:func:`new_digest_key`) and sent to S1 in that round's ``OpenCheckedRound`` message
  (:mod:`flwr_fsl.helper.wire`, over the S0-S1 channel); never in the round's parameters,
  nor in anything else a client receives (``tests/families/ssa/test_digest_key.py``). Either
  server could draw it: a server that knows ``K`` can make GHASH collide, but a server
  colluding with a client can corrupt the output anyway (S0 applies the verdicts and
  reconstructs, S1 can shift its share by anything), so ``K`` need only be secret from
  clients. S0 draws it because S0 opens the round: no extra message.
* *Adaptive clients.* A client learns at most one bit per upload (accepted or dropped); a
  rejection only rules out the ``H`` that are roots of its polynomial, so ``q`` tries in one
  round succeed with probability at most ``q (l + 1) / 2**128``; the next round's key is fresh.
  The nonces are distinct per (client, segment) within a round, so even a tag that leaked
  would be a one-time Wegman-Carter MAC revealing nothing about ``H`` (tags never leave the
  servers anyway: only their SHA-256 does, and only between S0 and S1).

**What this verifies** (a client that passes, against servers following the protocol):
every key pair is nonzero at no more than one evaluated point (soundness: a forgery needs
``H(x1, a) ^ H(x1, b) = H(x2, c) ^ H(x2, d)`` for 512-bit ``H``, or a collision); with unit
weights, that point's count word is exactly 1 — so per element, a client adds 0 or 1 per key
that can reach it; a forged count (0, 2, 2**63, a negative count to erase an honest client, a
value with count 0 in a dummy bin) is caught.

**Value words** (issue 21 item 4), per :attr:`SSAParams.value_check
<flwr_fsl.families.ssa.messages.SSAParams.value_check>`. Since a key that passes is nonzero at
no more than one point, each key's value words summed over its evaluated points are the words
at its point; both servers check those sums. ``"projected"`` (the default,
:mod:`flwr_fsl.families.ssa.projected_check`): ``r = 64`` random {-1, 0, 1} projections of all
of them are range-checked exactly against ``T = 4 B2`` (``B2`` the public L2 bound of an honest
client), so every word is within ``2T`` of zero except with probability ``2^-r``; a few
thousand upload words. ``"exact"`` (:mod:`flwr_fsl.families.ssa.range_check`): every word
within ``ceil(max_abs * 2**frac_bits)`` (the codec's bound), ``8 * L`` upload bytes per value
word per key, 2-3x the checked upload. Both use an FLP over F_(2^61-1) on integer bit shares
and an exact Z_2^64 relation (never a random combination over Z_2^64). ``"off"``: value words
unchecked, and one client can move an element's sum arbitrarily (e.g. an average of
``-1.1e9`` against an honest ``0.01``). The material travels as a trailer of the public part
(or hint); the value check's blob follows the 32-byte digest in what the servers exchange,
and :func:`same_digest` decides on both parts. A client that fails is dropped like any other
failing client (the FLP's false accept at most ``(2m + 2)/(p - 2m - 1) + 1/p``, about
``2^-54``, per upload). Within the bound (``2T`` projected, the codec's bound exact) a client
still chooses its words freely (Cui et al.'s functionality lets a corrupted client choose any
``w in G^k``; DP clipping binds honest clients only). Nor does it check that a client used
at most ``k`` real slots or placed an element once: a client may point all ``B`` bins at real
slots and reach one element from each of its ``eta`` candidate bins and every
stash slot (count up to ``eta + sigma`` there). With ``weighted=True`` (documented, leaky,
not the default) the count word is a weight: only the one-point property is checked, the
weight's range is not.

**Threads** (issue 26). Both servers evaluate a client's keys in key ranges on ``threads``
threads (:class:`~flwr_fsl.families.ssa.protocol.SSAServer`'s argument; default the
environment variable ``FLWR_FSL_SSA_THREADS``, else every core the process may use;
:func:`run_ranges`): the shares and the digest do not depend on the thread count.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.threads import StartedRanges, run_ranges, start_ranges
from flwr_fsl.crypto.dpf import (
    PROOF_WORDS,
    DPFKeyBatch,
    check_words_out,
    evaluate_batch,
    key_range,
)
from flwr_fsl.crypto.hashing import SimpleTable
from flwr_fsl.families.ssa.messages import SSAInputError, SSAParams
from flwr_fsl.families.ssa.range_check import same_check
from flwr_fsl.kernels.dpf_kernels import chunk_bounds
from flwr_fsl.kernels.ring import key_sums_rows

__all__ = [
    "DIGEST_BYTES",
    "DIGEST_KEY_BYTES",
    "THREADS_ENV",
    "KeyCheck",
    "StartedCheck",
    "check_digest_key",
    "checks_counts",
    "client_digest",
    "default_threads",
    "dummy_alphas",
    "key_domain_bits_checked",
    "key_lengths_checked",
    "new_digest_key",
    "one_word",
    "resolve_threads",
    "run_adding",
    "same_digest",
    "segments",
]

DIGEST_BYTES = 32
"""Bytes of a key-check digest (SHA-256)."""
DIGEST_KEY_BYTES = 16
"""Bytes of a round's digest key (AES-128; digest version 3)."""
_TAG = b"flwr_fsl/ssa-key-check/v2\x00"
_TAG_V3 = b"flwr_fsl/ssa-key-check/v3\x00"
_NONCE = struct.Struct("<QI")  # GMAC nonce: client id, segment index (12 bytes)
_ONE_SHOT_BYTES = (1 << 31) - 1  # the most associated data one AESGCM.encrypt call takes
_PIECE_BYTES = 1 << 30  # longer segments (a stash key past m = 2**24) are streamed in pieces
_T = TypeVar("_T")


def new_digest_key() -> bytes:
    """Draw a round's digest key: 16 uniform bytes from the OS (S0, at each round's opening)."""
    return os.urandom(DIGEST_KEY_BYTES)


def check_digest_key(key: object, name: str = "digest_key") -> bytes | None:
    """Validate a digest key (None: digest version 2, SHA-256 without a key).

    Raises
    ------
    ConfigurationError
        If ``key`` is not None or 16 bytes, or is all zeros (a key nobody drew), naming
        ``name``.
    """
    if key is None:
        return None
    if not isinstance(key, bytes | bytearray) or len(key) != DIGEST_KEY_BYTES:
        size = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
        raise ConfigurationError(f"{name} must be {DIGEST_KEY_BYTES} bytes, got {size}")
    if not any(key):
        raise ConfigurationError(f"{name} is all zeros: draw one with new_digest_key()")
    return bytes(key)


def checks_counts(params: SSAParams) -> bool:
    """Return True if the round checks every key's count word is exactly 1 (unit weights)."""
    return params.verify and params.count_weighted and not params.weighted


def key_domain_bits_checked(params: SSAParams, table: SimpleTable) -> NDArray[np.int64]:
    """Return each key's domain bits with room for its dummy slot (bins, then stash slots)."""
    # bit_length(n) (room for n + 1 points), at least 1; exact for bins below 2**52 elements.
    sizes = np.maximum(table.bin_sizes.astype(np.int64), 1)
    bins = np.floor(np.log2(sizes)).astype(np.int64) + 1
    stash = max(1, int(params.domain_size).bit_length())
    return np.concatenate([bins, np.full(params.stash_size, stash, np.int64)])


def key_lengths_checked(params: SSAParams, table: SimpleTable) -> NDArray[np.int64]:
    """Return each key's evaluated points: its bin's ranks and the dummy slot."""
    return np.concatenate(
        [table.bin_sizes + 1, np.full(params.stash_size, params.domain_size + 1, np.int64)]
    )


def dummy_alphas(params: SSAParams, table: SimpleTable) -> NDArray[np.uint64]:
    """Return every key's dummy slot: ``n_b`` for bin ``b``, ``m`` for a stash slot."""
    return np.concatenate(
        [table.bin_sizes, np.full(params.stash_size, params.domain_size, np.int64)]
    ).astype(np.uint64)


def one_word(params: SSAParams) -> np.uint64:
    """Return the fixed-point encoding of 1.0 (the count word of every checked point)."""
    return np.uint64(params.fixed_point.encode(np.ones((1, 1)))[0, 0])


# ------------------------------------------------------------------------------------------------
# Threads (issue 26). A client's keys are split into consecutive key ranges (:func:`segments`),
# each one :func:`~flwr_fsl.crypto.dpf.evaluate_batch` call into its rows of the server's reused
# buffer. With ``threads >= 2`` the ranges run on a process-wide pool: the numba kernels
# (``nogil``), ``cryptography``'s batched AES and ``hashlib`` release the GIL; with one thread
# they run in the caller, in order. The ranges and every output (share, digest) do not depend
# on the thread count.
# ------------------------------------------------------------------------------------------------

THREADS_ENV = "FLWR_FSL_SSA_THREADS"
"""Environment variable with the SSA servers' default evaluation thread count."""


def default_threads() -> int:
    """Return ``FLWR_FSL_SSA_THREADS`` if set, else the cores this process may run on.

    Raises
    ------
    ConfigurationError
        If the variable is set to anything but an integer ``>= 1``.
    """
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigurationError(
                f"{THREADS_ENV} must be an integer >= 1, got {raw!r}"
            ) from None
        if value < 1:
            raise ConfigurationError(f"{THREADS_ENV} must be an integer >= 1, got {raw!r}")
        return value
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)  # pragma: no cover - platforms without affinity


def resolve_threads(threads: int | None) -> int:
    """Validate a ``threads`` argument (None: :func:`default_threads`).

    Raises
    ------
    ConfigurationError
        If ``threads`` is not an integer ``>= 1`` (naming the argument).
    """
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int | np.integer) or threads < 1:
        raise ConfigurationError(f"threads must be an integer >= 1, got {threads!r}")
    return int(threads)


def segments(lengths: NDArray[np.int64], points: int) -> list[tuple[int, int]]:
    """Split keys into consecutive ranges of at most ``points`` evaluated points.

    A single key larger than that (e.g. a stash key) is a range of its own. The greedy cut
    is :func:`~flwr_fsl.kernels.dpf_kernels.chunk_bounds` (compiled): the Python loop it
    replaces took about 26 ms per call at ``m = 2**20`` (two calls per server and round).
    """
    bounds = chunk_bounds(np.ascontiguousarray(lengths, np.int64), points).tolist()
    return list(itertools.pairwise(bounds))


def run_adding(
    work: Callable[[int], _T],
    count: int,
    threads: int,
    rows: tuple[NDArray[np.uint64] | None, NDArray[np.uint64], list[tuple[int, int]]],
) -> list[_T]:
    """:func:`run_ranges` of work that adds row ranges of ``values`` into a running sum.

    ``rows`` is ``(add_into, values, added)``: each call appends the ``(a, b)`` rows it added
    to ``added``; if any call raises, every range added is subtracted again before the error
    is re-raised, so the sum holds nothing of a failed evaluation.
    """
    add_into, values, added = rows
    try:
        return run_ranges(work, count, threads)
    except BaseException:
        if add_into is not None:
            for a, b in added:
                np.subtract(add_into[a:b], values[a:b], out=add_into[a:b])
        raise


_SEGMENT_POINTS = 1 << 16
"""Points per evaluation segment of digest version 2 (fixed: a version-2 peer splits the same
way): a client's keys are evaluated in consecutive key ranges of about this many points
(:func:`segments`), so each proof buffer stays small (4 MiB) however large the round; the digest
hashes each segment's proofs on its own."""
_KEYED_SEGMENT_POINTS = 1 << 16
"""Points per evaluation segment of digest version 3 (keyed; both servers run the same
version)."""


@dataclass
class _Worker:
    """One thread's reused buffers of a key check: proofs, GMAC context, output rows."""

    proofs: NDArray[np.uint64]
    mac: AESGCM | None
    rows: NDArray[np.uint64] | None = None

    def rows_for(self, count: int, tau: int) -> NDArray[np.uint64]:
        """Return ``count`` output rows of width ``tau`` (made, or grown, on first use)."""
        if self.rows is None or self.rows.shape[1] != tau or self.rows.shape[0] < count:
            self.rows = np.empty((max(count, self.proofs.shape[0]), tau), np.uint64)
        return self.rows[:count]


@dataclass
class StartedCheck(Generic[_T]):
    """One client's key check queued on a server's threads (:meth:`KeyCheck.start`).

    Attributes
    ----------
    values : numpy.ndarray or None
        ``(points, tau)`` uint64: the output shares (written by the segments); None where
        they are not kept (``keep_values`` False).
    sums : numpy.ndarray or None
        Each key's count-word sum (None: the round does not check counts).
    add_into : numpy.ndarray or None
        The running sum the segments add their rows to.
    added : list[int]
        The segments whose rows were added to ``add_into`` so far.
    ranges : StartedRanges
        The queued tasks: ``side()`` first (if any), then one per segment.
    first : int
        1 with a side task, else 0.
    parts : list
        Per segment, its keys' view and lengths (what :meth:`KeyCheck.take_back` evaluates
        again).
    extra : list
        ``side()``'s result, once done.
    """

    values: NDArray[np.uint64] | None
    sums: NDArray[np.uint64] | None
    add_into: NDArray[np.uint64] | None
    added: list[int]
    ranges: StartedRanges[bytes]
    first: int
    parts: list[tuple[DPFKeyBatch, NDArray[np.int64]]]
    extra: list[_T] = field(default_factory=list)

    def side_result(self) -> _T | None:
        """Return ``side()``'s result (None: no side task, or not done)."""
        return self.extra[0] if self.extra else None


class KeyCheck:
    """One server's key check of one client: evaluation with proofs, count sums, digest.

    Parameters
    ----------
    params : SSAParams
        A round with ``verify``.
    party : int
        0 or 1.
    lengths : numpy.ndarray
        :func:`key_lengths_checked` of the round.
    threads : int, optional
        Threads evaluating (and hashing) segments at once
        (default: :func:`default_threads`).
    digest_key : bytes, optional
        The round's 16-byte digest key (digest version 3, GMAC per segment); None: version 2
        (SHA-256 per segment).

    Raises
    ------
    ConfigurationError
        If ``threads`` or ``digest_key`` is invalid.
    """

    def __init__(
        self,
        params: SSAParams,
        party: int,
        lengths: NDArray[np.int64],
        threads: int | None = None,
        digest_key: bytes | None = None,
    ) -> None:
        self.params = params
        self.party = party
        self.lengths = lengths
        self.threads = resolve_threads(threads)
        self.digest_key = check_digest_key(digest_key)
        self.offsets = np.zeros(lengths.shape[0] + 1, np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.counts = checks_counts(params)
        self.one = one_word(params) if self.counts else np.uint64(0)
        keyed = self.digest_key is not None
        self.segments = segments(lengths, _KEYED_SEGMENT_POINTS if keyed else _SEGMENT_POINTS)
        most = max((int(self.offsets[b] - self.offsets[a]) for a, b in self.segments), default=0)
        # One proof buffer (and GMAC context) per thread, reused for every client: a segment
        # takes a free one, evaluates its proofs into it and hashes them (GIL released). Its
        # output rows go to the client's output, or (``keep_values`` False) to the worker's
        # own rows, added to the running sum from cache: no ``(points, tau)`` array per client.
        self._locks = [threading.Lock() for _ in self.segments]
        self._free: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        for _ in range(min(self.threads, max(len(self.segments), 1))):
            mac = AESGCM(self.digest_key) if self.digest_key is not None else None
            self._free.put(_Worker(np.empty((most, PROOF_WORDS), np.uint64), mac))

    def evaluate(
        self, keys: DPFKeyBatch, out: NDArray[np.uint64] | None = None, client: int = 0
    ) -> tuple[NDArray[np.uint64], bytes]:
        """Evaluate a client's keys; return their output shares and this server's digest.

        ``out``, if given, is a reused ``(points, tau)`` uint64 buffer the shares go into;
        ``client`` is the client's id (version 3's nonces; both servers must pass the same).

        The digest is SHA-256 over the tag, each segment's hash of its proofs (in point
        order; GMAC or SHA-256, module docstring) in segment order, and (unit weights) the
        normalized per-key count sums; it does not depend on the thread count.

        Raises
        ------
        SSAInputError
            If the keys are not verifiable (no proof correction words).
        """
        values, digest, _ = self.evaluate_with(keys, out=out, client=client)
        return values, digest

    def evaluate_with(
        self,
        keys: DPFKeyBatch,
        *,
        out: NDArray[np.uint64] | None = None,
        client: int = 0,
        value_sums: NDArray[np.uint64] | None = None,
        side: Callable[[], _T] | None = None,
        add_into: NDArray[np.uint64] | None = None,
    ) -> tuple[NDArray[np.uint64], bytes, _T | None]:
        """:meth:`evaluate`, also summing each key's value words and running one side task.

        Parameters
        ----------
        keys, out, client
            As :meth:`evaluate`.
        value_sums : numpy.ndarray, optional
            ``(keys, w)`` uint64 (``w <= tau``): receives each key's first ``w`` output words
            summed over its evaluated points (the value check's input), computed in the same
            segments, on the same threads, as the count sums.
        side : callable, optional
            Work that does not depend on the evaluation (the value check's hash of the public
            part): run as one more task on the same threads, first.
        add_into : numpy.ndarray, optional
            A running sum shaped like the shares (the server's sum of accepted clients): each
            segment adds its shares to it right after evaluating them, while they are in
            cache. If this raises, the segments already added are taken back out.

        Returns
        -------
        tuple
            The output shares, the digest and ``side()`` (None without ``side``).

        Raises
        ------
        SSAInputError
            If the keys are not verifiable (no proof correction words).
        ConfigurationError
            If ``add_into`` or ``value_sums`` is not a C-contiguous uint64 array of its shape
            (the compiled sums would write past its end).
        """
        started = self.start(
            keys,
            out=out,
            client=client,
            value_sums=value_sums,
            side=side,
            add_into=add_into,
        )
        values, digest = self.finish(started)
        assert values is not None  # (keep_values)
        return values, digest, started.side_result()

    def start(
        self,
        keys: DPFKeyBatch,
        *,
        out: NDArray[np.uint64] | None = None,
        client: int = 0,
        value_sums: NDArray[np.uint64] | None = None,
        side: Callable[[], _T] | None = None,
        add_into: NDArray[np.uint64] | None = None,
        keep_values: bool = True,
    ) -> StartedCheck[_T]:
        """:meth:`evaluate_with`'s work queued on the server's threads; :meth:`finish` waits.

        Arguments as :meth:`evaluate_with`; with ``keep_values`` False (and ``add_into``) the
        output shares are not kept: each segment's rows are summed and added from a worker's
        own buffer, and :attr:`StartedCheck.values` is None (:meth:`take_back` evaluates a
        segment again to subtract it: only a refused client pays that). ``out`` and
        ``value_sums`` belong to this client until :meth:`finish` or :meth:`cancel`. Another
        client's check may be started before this one finishes (its segments queue behind
        this one's): each segment adds its rows to ``add_into`` under that segment's lock, so
        two clients' segments over the same rows never add at once.

        Raises
        ------
        SSAInputError, ConfigurationError
            As :meth:`evaluate_with` (before anything is queued).
        """
        if keys.public.cw_proof is None:
            raise SSAInputError("keys carry no proof words, the round checks every key")
        shape = (int(self.offsets[-1]), keys.public.tau)
        self._check_outputs(shape, value_sums, add_into)
        if not keep_values and add_into is None:
            raise ConfigurationError("keep_values=False needs add_into (the shares go there)")
        values: NDArray[np.uint64] | None = None
        if keep_values:
            values = out if out is not None and out.shape == shape else np.empty(shape, np.uint64)
        sums = np.empty(self.lengths.shape[0], np.uint64) if self.counts else None
        who = int(client) & 0xFFFF_FFFF_FFFF_FFFF
        # Every segment's key views at once, here: taken one per segment right after the last
        # one's evaluation (caches cold), they cost ~4x the CPU.
        parts = [(key_range(keys, lo, hi), self.lengths[lo:hi]) for lo, hi in self.segments]
        added: list[int] = []

        def segment(j: int) -> bytes:
            lo, hi = self.segments[j]
            a, b = int(self.offsets[lo]), int(self.offsets[hi])
            worker = self._free.get()
            try:
                proofs = worker.proofs[: b - a]
                rows = values[a:b] if values is not None else worker.rows_for(b - a, shape[1])
                part, lengths = parts[j]
                evaluate_batch(part, lengths=lengths, out=rows, proofs=proofs)
                if add_into is None:
                    self._key_sums(rows, a, (lo, hi), (sums, value_sums), None)
                else:
                    with self._locks[j]:
                        self._key_sums(rows, a, (lo, hi), (sums, value_sums), add_into)
                    added.append(j)  # list.append is atomic
                data = proofs.data.cast("B")  # little-endian words, in place
                if worker.mac is None:
                    return hashlib.sha256(data).digest()
                if len(data) <= _ONE_SHOT_BYTES:
                    return worker.mac.encrypt(_NONCE.pack(who, j), b"", data)  # the 16-byte tag
                return _gmac_streamed(self.digest_key or b"", _NONCE.pack(who, j), data)
            finally:
                self._free.put(worker)

        first = int(side is not None)
        extra: list[_T] = []

        def task(j: int) -> bytes:
            if j < first:
                assert side is not None
                extra.append(side())
                return b""
            return segment(j - first)

        ranges = start_ranges(task, len(self.segments) + first, self.threads)
        return StartedCheck(values, sums, add_into, added, ranges, first, parts, extra)

    def finish(self, started: StartedCheck[_T]) -> tuple[NDArray[np.uint64] | None, bytes]:
        """Wait for a started check; return the shares and the digest (``side()``: on ``started``).

        Raises
        ------
        BaseException
            The first failed segment's error, once every segment is done; nothing of the
            client is left in ``add_into`` then.
        """
        try:
            hashes = started.ranges.result()[started.first :]
        except BaseException:
            self.take_back(started, started.added)
            raise
        h = hashlib.sha256(_TAG if self.digest_key is None else _TAG_V3)
        for digest in hashes:
            h.update(digest)
        if started.sums is not None:
            sums = started.sums
            norm = sums - self.one if self.party == 0 else np.uint64(0) - sums
            h.update(norm.astype("<u8").tobytes())
        return started.values, h.digest()

    def cancel(self, started: StartedCheck[_T]) -> None:
        """Wait for a started check that will not be finished; take its rows back out."""
        started.ranges.wait()
        self.take_back(started, started.added)

    def take_back(self, started: StartedCheck[_T], segments: Iterable[int] | None = None) -> None:
        """Subtract a client's segments' rows from its running sum (default: every segment).

        Under each segment's lock: another client's check may be adding to the same rows.
        Shares that were not kept are evaluated again (the same words: DPF evaluation is
        deterministic) on this thread.
        """
        add_into = started.add_into
        if add_into is None:
            return
        for j in range(len(self.segments)) if segments is None else segments:
            lo, hi = self.segments[j]
            a, b = int(self.offsets[lo]), int(self.offsets[hi])
            if started.values is not None:
                with self._locks[j]:
                    np.subtract(add_into[a:b], started.values[a:b], out=add_into[a:b])
                continue
            worker = self._free.get()
            try:
                rows = worker.rows_for(b - a, add_into.shape[1])
                part, lengths = started.parts[j]
                evaluate_batch(part, lengths=lengths, out=rows, proofs=worker.proofs[: b - a])
                with self._locks[j]:
                    np.subtract(add_into[a:b], rows, out=add_into[a:b])
            finally:
                self._free.put(worker)

    def _check_outputs(
        self,
        shape: tuple[int, int],
        value_sums: NDArray[np.uint64] | None,
        add_into: NDArray[np.uint64] | None,
    ) -> None:
        """Refuse a running sum or value sums the compiled sums would write past the end of.

        Raises
        ------
        ConfigurationError
            If ``add_into`` is not ``shape``, or ``value_sums`` not ``(keys, w)`` with
            ``1 <= w <= tau``, C-contiguous writeable uint64.
        """
        if add_into is not None:
            check_words_out("add_into", add_into, shape)
        if value_sums is None:
            return
        width = value_sums.shape[1] if getattr(value_sums, "ndim", 0) == 2 else -1
        check_words_out("value_sums", value_sums, (self.lengths.shape[0], width))
        if not 1 <= width <= shape[1]:
            raise ConfigurationError(f"value_sums must have 1 to {shape[1]} columns, got {width}")

    def _key_sums(
        self,
        rows: NDArray[np.uint64],
        first: int,
        keys: tuple[int, int],
        into: tuple[NDArray[np.uint64] | None, NDArray[np.uint64] | None],
        add_into: NDArray[np.uint64] | None,
    ) -> None:
        """Keys ``lo..hi-1`` (output ``rows``, the client's rows from ``first`` on): sums.

        Count words go into ``into[0]``, value words into ``into[1]``; the rows are also added
        to the same rows of ``add_into``, in the same pass
        (:func:`~flwr_fsl.kernels.ring.key_sums_rows`).
        """
        lo, hi = keys
        sums, value_sums = into
        none = np.zeros((0, rows.shape[1]), np.uint64)  # a part switched off
        key_sums_rows(
            rows,
            self.offsets[lo : hi + 1] - first,  # every key has a point (its dummy slot)
            none[:, :1] if value_sums is None else value_sums[lo:hi],
            none[:, 0] if sums is None else sums[lo:hi],
            self.params.tau - 1,  # the count word (padding, if any, comes after it)
            none if add_into is None else add_into[first : first + rows.shape[0]],
        )


def _gmac_streamed(key: bytes, nonce: bytes, data: memoryview) -> bytes:
    """GMAC of more bytes than one ``AESGCM`` call takes: the same tag, the data in pieces."""
    encryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    for start in range(0, len(data), _PIECE_BYTES):
        encryptor.authenticate_additional_data(data[start : start + _PIECE_BYTES])
    encryptor.finalize()
    return encryptor.tag


def client_digest(
    params: SSAParams,
    party: int,
    keys: DPFKeyBatch,
    lengths: NDArray[np.int64],
    digest_key: bytes | None = None,
    client: int = 0,
) -> bytes:
    """Return a server's key-check digest of one client's keys (convenience for tests).

    Raises
    ------
    SSAInputError
        If the keys are not verifiable.
    """
    return KeyCheck(params, party, lengths, digest_key=digest_key).evaluate(keys, client=client)[1]


def same_digest(a: bytes | None, b: bytes | None) -> bool:
    """Decide on both servers' checks of a client (False when either is missing or malformed).

    A check is the 32-byte key-check digest, followed in a checked round by the range check's
    blob (:func:`~flwr_fsl.families.ssa.range_check.same_check`): the digests must be equal
    (constant time) and the range check must accept. Symmetric in ``a`` and ``b``.
    """
    if a is None or b is None or len(a) < DIGEST_BYTES or len(a) != len(b):
        return False
    if not hmac.compare_digest(a[:DIGEST_BYTES], b[:DIGEST_BYTES]):
        return False
    if len(a) == DIGEST_BYTES:
        return True
    return same_check(bytes(a[DIGEST_BYTES:]), bytes(b[DIGEST_BYTES:]))
