"""Two-server private submodel retrieval (PSR) from DPFs and cuckoo hashing (Cui et al. 2023).

A client wants rows ``w[u]`` of a public-to-the-servers table ``w`` (e.g. the embedding rows of
the items in its history) without either server learning which. It cuckoo-hashes its indices
exactly as in :mod:`flwr_fsl.families.ssa.protocol` and, for bin ``b`` holding ``u``, makes a DPF
with
``beta = 1`` at ``pos_b`` (dummy ``Gen(0, 0)`` keys for empty bins; a stash slot gets a key over
all of ``[0, m)``). Server ``S_p`` answers bin ``b`` with ``sum_x Eval(k_p[b], x) * w[T[b][x]]``
in Z_2^64 (``T`` the simple table), one row per key. The client adds the two answers: bin
``b`` gives exactly ``w[u]`` — retrieval is exact, with no fixed-point error, because the
table's words can hold any 64-bit encoding (:func:`encode_table` stores float bit patterns).

**Threat model and leakage.** Two non-colluding semi-honest servers. Each server sees the
public part and its master seed (pseudorandom, sizes fixed by ``m``, ``k`` and the hash key):
nothing about which rows are retrieved (Cui §2.2: leakage ``L = (k)``). The answers reveal
nothing to the servers. A client learns the rows it asked for; a malicious client can learn
other rows (it may ask for any ``k``), which is fine where clients may download the model.
The answers of S1 travel sealed to the client (Flower layer), so S0 cannot add them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.channel import KEY_BYTES, SealedBoxError, SealingKeyPair
from flwr_fsl.crypto.dpf import DPFKeyBatch, DPFKeyError, evaluate_batch, generate_keys_batch
from flwr_fsl.crypto.hashing import EMPTY
from flwr_fsl.crypto.prg import random_seeds
from flwr_fsl.families.ssa.protocol import (
    Placement,
    SSAInputError,
    SSAParams,
    SSAUpload,
    key_domain_bits,
    parse_public_part,
    place_indices,
    simple_table_for,
)
from flwr_fsl.kernels.ring import binned_inner_products

# PSRClientState binary format (see its docstring).
_STATE_MAGIC = register_magic(b"FSPQ", "PSR client state (flwr_fsl.families.ssa.psr)")
_STATE_VERSION = 1


def query_params(params: SSAParams) -> SSAParams:
    """Return the DPF layout of a PSR query for a round: ``tau = 1``, no count word, no DP.

    Queries are not checked (``verify=False``): a malformed query only garbles the querying
    client's own answer, which is a sum of rows of the model it may read anyway.

    Retrieval releases nothing to the servers (the answers are shares), so the round's DP
    settings (:mod:`flwr_fsl.families.ssa.dp`) do not apply to the query's keys.
    """
    from dataclasses import replace

    return replace(
        params,
        value_width=1,
        count_weighted=False,
        epoch=0,
        dp=None,
        run=None,
        verify=False,
        value_check=None,  # unchecked, whatever the round checks
    )


def encode_table(rows: ArrayLike) -> NDArray[np.uint64]:
    """Store a float32/float64 table as 64-bit ring words losslessly (bit patterns).

    Parameters
    ----------
    rows : array_like
        ``(m, width)`` (or ``(m,)``) float32 or float64 values.

    Returns
    -------
    numpy.ndarray
        ``(m, width)`` uint64.

    Raises
    ------
    ConfigurationError
        If the dtype is not float32 or float64.
    """
    a = np.asarray(rows)
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.dtype == np.float64:
        return np.ascontiguousarray(a).view(np.uint64)
    if a.dtype == np.float32:
        return np.ascontiguousarray(a).view(np.uint32).astype(np.uint64)
    raise ConfigurationError(f"encode_table takes float32 or float64 rows, got {a.dtype}")


def decode_table(words: NDArray[np.uint64], dtype: type = np.float32) -> NDArray[np.floating]:
    """Invert :func:`encode_table` for rows of the given float dtype.

    Raises
    ------
    ValueError
        If ``dtype`` is not float32/float64 or a float32 word has high bits set.
    """
    w = np.asarray(words, np.uint64)
    if np.dtype(dtype) == np.float64:
        return w.view(np.float64)
    if np.dtype(dtype) == np.float32:
        if np.any(w >> np.uint64(32)):
            raise SSAInputError("not a float32 table: high bits set")
        return w.astype(np.uint32).view(np.float32)
    raise ConfigurationError(f"unsupported dtype {dtype}")


@dataclass
class PSRQuery:
    """A client's retrieval query and what it keeps to read the answers.

    Attributes
    ----------
    upload : SSAUpload
        Public part (to both servers) and master seeds (one per server).
    indices : numpy.ndarray
        The requested rows, in the client's order.
    placement : Placement
        Which key carries which requested row.
    """

    upload: SSAUpload
    indices: NDArray[np.int64]
    placement: Placement = field(repr=False)


def make_query(
    params: SSAParams,
    indices: ArrayLike,
    *,
    rng: np.random.Generator | None = None,
    master_seeds: tuple[bytes, bytes] | None = None,
) -> PSRQuery:
    """Client side: DPF keys selecting one simple-table entry per bin.

    Parameters
    ----------
    params : SSAParams
        The round (its hashing; ``value_width`` is the table's row width).
    indices : array_like
        Distinct rows to retrieve, at most ``k``.
    rng : numpy.random.Generator, optional
        Cuckoo eviction randomness.
    master_seeds : tuple[bytes, bytes], optional
        Fixed master seeds (tests); fresh OS randomness by default.

    Returns
    -------
    PSRQuery
        The query.

    Raises
    ------
    ValueError
        If the indices do not fit the round.
    """
    qp = query_params(params)
    table = simple_table_for(qp)
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    placement = place_indices(qp, idx, table, rng)
    betas = (placement.slots != EMPTY).astype(np.uint64)
    if master_seeds is None:
        master_seeds = (random_seeds(1).tobytes(), random_seeds(1).tobytes())
    k0, _ = generate_keys_batch(
        placement.alphas, betas, key_domain_bits(qp, table), master_seeds=master_seeds
    )
    return PSRQuery(SSAUpload(k0.public.to_bytes(), master_seeds), idx, placement)


class PSRServer:
    """One server's side of PSR over a table of ``m`` rows.

    Parameters
    ----------
    params : SSAParams
        The round (hashing parameters; ``value_width`` = table row width).
    party : int
        0 for S0, 1 for S1.
    table : numpy.ndarray
        ``(m, value_width)`` uint64 ring words (see :func:`encode_table`).

    Raises
    ------
    ValueError
        If ``party`` or the table's shape/dtype is wrong.
    """

    def __init__(self, params: SSAParams, party: int, table: NDArray[np.uint64]) -> None:
        if party not in (0, 1):
            raise ConfigurationError(f"party must be 0 or 1, got {party!r}")
        shape = (params.domain_size, params.value_width)
        if table.dtype != np.uint64 or table.shape != shape:
            raise ConfigurationError(
                f"table must be uint64 of shape {shape}, got {table.dtype} {table.shape}"
            )
        self.params = query_params(params)
        self.party = party
        self._table = np.ascontiguousarray(table)
        self._simple = simple_table_for(self.params)

    def answer(self, public_part: bytes, master_seed: bytes) -> NDArray[np.uint64]:
        """Answer one query: a row per key (``B + σ`` rows of the table's width).

        Raises
        ------
        SSAInputError
            If the query's keys are malformed or do not fit the round.
        """
        public = parse_public_part(self.params, public_part)
        try:
            keys = DPFKeyBatch.from_master_seed(self.party, public, bytes(master_seed))
        except DPFKeyError as err:
            raise SSAInputError(f"bad master seed: {err}") from None
        lengths = np.concatenate(
            [
                self._simple.bin_sizes,
                np.full(self.params.stash_size, self.params.domain_size, np.int64),
            ]
        )
        selectors, _ = evaluate_batch(keys, lengths=lengths)
        num_bins = self._simple.num_bins
        out = np.zeros((self.params.num_keys, self._table.shape[1]), np.uint64)
        n_bin_points = self._simple.bin_items.shape[0]
        binned_inner_products(
            self._table,
            self._simple.bin_items,
            self._simple.bin_offsets,
            np.ascontiguousarray(selectors[:n_bin_points, 0]),
            out[:num_bins],
        )
        stash_sel = selectors[n_bin_points:, 0].reshape(
            self.params.stash_size, self.params.domain_size
        )
        for s in range(self.params.stash_size):
            out[num_bins + s] = (stash_sel[s][:, None] * self._table).sum(axis=0, dtype=np.uint64)
        return out


def decode_answers(
    query: PSRQuery, answer0: NDArray[np.uint64], answer1: NDArray[np.uint64]
) -> NDArray[np.uint64]:
    """Add the two servers' answers and return the requested rows in the query's order.

    Raises
    ------
    ValueError
        If the answers' shapes differ or do not have one row per key.
    """
    return decode_rows(query.placement.slots, query.indices.size, answer0, answer1)


def decode_rows(
    slots: NDArray[np.int64],
    num_indices: int,
    answer0: NDArray[np.uint64],
    answer1: NDArray[np.uint64],
) -> NDArray[np.uint64]:
    """Add the answers and put each key's row at its slot (a stored query's placement).

    Parameters
    ----------
    slots : numpy.ndarray
        ``Placement.slots`` of the query: per key, the requested row it carries or ``EMPTY``.
    num_indices : int
        Number of requested rows.
    answer0, answer1 : numpy.ndarray
        The servers' answers, one row per key.

    Returns
    -------
    numpy.ndarray
        ``(num_indices, width)`` uint64 rows.

    Raises
    ------
    SSAInputError
        If the answers' shapes differ or do not have one row per key.
    """
    a0, a1 = np.asarray(answer0, np.uint64), np.asarray(answer1, np.uint64)
    if a0.ndim != 2 or a0.shape != a1.shape or a0.shape[0] != slots.shape[0]:
        raise SSAInputError("answers must have one row per key and equal shapes")
    total = a0 + a1
    rows = np.zeros((num_indices, a0.shape[1]), np.uint64)
    used = slots != EMPTY
    rows[slots[used]] = total[used]
    return rows


@dataclass
class PSRClientState:
    """What a client keeps from its query until the answers arrive (never sent).

    The indices, counts and answer key are the client's secrets: keep the state on the
    client (e.g. in Flower's ``Context.state``).

    **Binary format v1** (:meth:`to_bytes`, :meth:`from_bytes`), fields of
    :mod:`flwr_fsl.core.wireformat` in this order:

    ==========  ==================================================================
    magic       4 raw bytes ``b"FSPQ"``
    version     ``u8`` = 1
    round       ``u64``: the round id the query was made for
    answer key  32 raw bytes: the X25519 private key S1's answer is sealed to
    indices     ``array`` int64 ``(n,)``: the requested rows, distinct, non-negative
    slots       ``array`` int64 ``(B + σ,)``: per key ``EMPTY`` or its row's position;
                every position ``0..n-1`` exactly once
    has counts  ``u8``: 0 or 1
    counts      (only if 1) ``array`` float64 ``(n,)``: finite, > 0
    ==========  ==================================================================

    No trailing bytes.

    Attributes
    ----------
    round_id : int
        The round the query was made for.
    indices : numpy.ndarray
        The requested rows, in the client's order.
    slots : numpy.ndarray
        ``Placement.slots`` of the query.
    answer_key : SealingKeyPair
        The per-query key pair from :func:`~flwr_fsl.families.ssa.sealing.seal_psr_query`.
    counts : numpy.ndarray or None
        Optional per-row weights for the upload that follows.
    """

    round_id: int
    indices: NDArray[np.int64]
    slots: NDArray[np.int64]
    answer_key: SealingKeyPair = field(repr=False)
    counts: NDArray[np.float64] | None = None

    def to_bytes(self) -> bytes:
        """Serialize the state (format v1, see the class docstring).

        Returns
        -------
        bytes
            The encoded state.
        """
        w = Writer()
        w.fixed(_STATE_MAGIC, len(_STATE_MAGIC))
        w.u8(_STATE_VERSION)
        w.u64(self.round_id)
        w.fixed(self.answer_key.private_bytes(), KEY_BYTES)
        w.array(np.asarray(self.indices, np.int64))
        w.array(np.asarray(self.slots, np.int64))
        w.u8(int(self.counts is not None))
        if self.counts is not None:
            w.array(np.asarray(self.counts, np.float64))
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> PSRClientState:
        """Parse :meth:`to_bytes` output strictly (lengths checked before allocating).

        Parameters
        ----------
        data : bytes
            The encoded state.

        Returns
        -------
        PSRClientState
            The state.

        Raises
        ------
        SSAInputError
            On any malformed, truncated, extended or inconsistent input (the text names the
            failed check only, never a stored index or size).
        """
        try:
            r = Reader.versioned(data, _STATE_MAGIC, _STATE_VERSION, "a PSR client state")
        except WireFormatError as err:
            raise SSAInputError(str(err)) from None  # the header holds no secret
        try:
            round_id = r.u64("round")
            private = r.fixed(KEY_BYTES, "answer key")
            indices = r.vector("indices", np.int64)
            slots = r.vector("slots", np.int64)
            has_counts = r.u8("has counts")
            if has_counts > 1:
                raise WireFormatError("bad counts flag")
            counts = r.vector("counts", np.float64) if has_counts else None
            r.done()
        except WireFormatError:
            raise SSAInputError("malformed PSR client state") from None
        n = indices.size
        if n and (indices.min() < 0 or np.unique(indices).size != n):
            raise SSAInputError("PSR client state: indices must be distinct and non-negative")
        used = slots[slots != EMPTY]
        if not np.array_equal(np.sort(used), np.arange(n)):
            raise SSAInputError("PSR client state: slots do not place every row exactly once")
        if counts is not None and (
            counts.size != n or not np.all(np.isfinite(counts)) or np.any(counts <= 0)
        ):
            raise SSAInputError("PSR client state: counts must be finite and > 0, one per row")
        try:
            answer_key = SealingKeyPair.from_private_bytes(private)
        except SealedBoxError:
            raise SSAInputError("PSR client state: bad answer key") from None
        return cls(round_id, indices, slots, answer_key, counts)

    def rows(
        self, params: SSAParams, answer0: bytes, answer1: NDArray[np.uint64]
    ) -> NDArray[np.uint64]:
        """Add S0's raw answer and S1's opened answer: the requested rows, in order.

        Parameters
        ----------
        params : SSAParams
            The round the query was made for (``value_width`` = the table's row width).
        answer0 : bytes
            S0's answer as raw little-endian uint64 words, ``B + σ`` rows.
        answer1 : numpy.ndarray
            S1's answer (opened with :attr:`answer_key`), ``(B + σ, value_width)`` uint64.

        Returns
        -------
        numpy.ndarray
            ``(n, value_width)`` uint64 ring words (see :func:`decode_table`).

        Raises
        ------
        SSAInputError
            If the state is for another round or an answer has the wrong size.
        """
        if params.round_id != self.round_id or self.slots.size != params.num_keys:
            raise SSAInputError("the retrieval state is not for this round")
        width = params.value_width
        if not isinstance(answer0, bytes) or len(answer0) != 8 * params.num_keys * width:
            raise SSAInputError("S0's answer has the wrong size")
        words = np.frombuffer(answer0, "<u8").astype(np.uint64).reshape(-1, width)
        try:
            return decode_rows(self.slots, self.indices.size, words, answer1)
        except ValueError:
            raise SSAInputError("S1's answer has the wrong shape") from None
