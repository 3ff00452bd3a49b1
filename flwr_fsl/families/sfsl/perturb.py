r"""Index-set perturbation by randomized response (Niu et al., Alg. 2) and its privacy report.

A client in submodel learning reveals which rows it touches; Niu et al. let it answer the
question "do you have index j?" for every ``j`` of the round's union ``U`` (the chosen clients'
real index sets, from private set union) with two layers of randomized response:

* **permanent** (memoized, RAPPOR-style): the first time ``j`` is asked, the client answers
  "yes" with probability ``p1`` if ``j`` is in its real set ``S`` and ``p2`` otherwise, and
  remembers the answer (``Y`` = yes, ``N`` = no) for the memo's lifetime (the client's, by
  default: :class:`~flwr_fsl.families.sfsl.mod.PerturbedRows` keeps it in a
  :class:`MemoStore` under the node's state folder), so repeated rounds cannot average the
  noise away;
* **instantaneous**, every round: ``j`` enters the perturbed set ``S''`` with probability
  ``p3`` if ``j in Y`` and ``p4`` otherwise.

So ``Pr[j in S'' | j in S] = p5 = p1 (p3 - p4) + p4`` and ``Pr[j in S'' | j not in S] = p6 =
p2 (p3 - p4) + p4``. The client downloads and uploads the rows of ``S''``: real rows it did
not keep get no update, rows of ``S'' \ S`` get a zero update (Alg. 1). The perturbed set
``S''`` is ε-LDP:

* one round: ``ε1 = ln max(p5/p6, p6/p5, (1-p5)/(1-p6), (1-p6)/(1-p5))`` (Lemma 2);
* any number of rounds *of one memo* is at most the permanent layer's ``ε∞`` — the same
  formula with ``p1, p2`` (Lemma 1), because every round is a function of the memoized answer.
  A new memo (a new run of a client whose memo is not persisted, another session scope) draws
  new answers: ``k`` memos give up to ``k·ε∞``.

These bound what ``S''`` reveals, **not** what the round's aggregates reveal: Niu's per-row
sums over changing participants (and the union of the real sets) decode every client's real
rows whatever ``p1..p4`` (``tests/attacks/test_sfsl_*``); the aggregates are protected by the
distributed DP of :mod:`flwr_fsl.families.sfsl.dp`, which the strategy runs by default.

A ratio whose numerator and denominator are both 0 concerns an output that never happens and
is left out; one with a zero denominator only is ``inf`` (no deniability). Theorem 2's
``p7 = p5 (1-p5)^(n1-1) (1-p6)^n0`` (the server sees exactly one nonzero update for ``j`` and
it is a real owner's) and ``p8 = (1-p5)^n1 (1 - (1-p6)^n0)`` (no owner uploads ``j`` but some
non-owner does, so the zero aggregate marks them) depend on how many chosen clients have
(``n1``) and lack (``n0``) the index: :func:`theorem2_events`.

Randomness comes from AES-128-CTR (:class:`~flwr_fsl.crypto.prg.PRGStream`) under a fresh OS
key: the server sees the coin outcomes, so a predictable generator (numpy's PCG64) would not do.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, Writer, register_magic
from flwr_fsl.crypto.prg import PRGStream

__all__ = [
    "MemoStore",
    "PermanentMemo",
    "RRParams",
    "perturb_index_set",
    "theorem2_events",
]

_I64 = np.int64
_MEMO_MAGIC = register_magic(b"FSRR", "randomized-response memo (flwr_fsl.families.sfsl.perturb)")
_MEMO_VERSION = 2
_LEGACY_MEMO_VERSION = 1
MAX_MEMO_INDICES = 1 << 28
"""Most indices a decoded memo may hold (bounds what a corrupted state can allocate)."""


def _ln_ratio_max(a: float, b: float) -> float:
    """``ln max(a/b, b/a, (1-a)/(1-b), (1-b)/(1-a))``, skipping outputs that never happen."""
    worst = 0.0
    for num, den in ((a, b), (b, a), (1 - a, 1 - b), (1 - b, 1 - a)):
        if num == 0 and den == 0:
            continue  # that output is impossible for both inputs
        if den == 0:
            return math.inf
        if num > 0:
            worst = max(worst, math.log(num / den))
    return worst


@dataclass(frozen=True)
class RRParams:
    """One client's probabilities ``p1..p4`` (each client may choose its own).

    Raises
    ------
    ConfigurationError
        If a probability is not a number in ``[0, 1]``.
    """

    p1: float
    p2: float
    p3: float
    p4: float

    def __post_init__(self) -> None:
        for name in ("p1", "p2", "p3", "p4"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"randomized response {name} must be a number")
            if not 0.0 <= float(value) <= 1.0:
                raise ConfigurationError(f"randomized response {name} must be in [0, 1]")

    @classmethod
    def symmetric(cls, keep: float, flip: float) -> RRParams:
        """Niu's Table V choices: ``p1 = p3 = keep``, ``p2 = p4 = flip``."""
        return cls(keep, flip, keep, flip)

    @property
    def p5(self) -> float:
        """``Pr[j in S'' | j in S] = p1 (p3 - p4) + p4``."""
        return self.p1 * (self.p3 - self.p4) + self.p4

    @property
    def p6(self) -> float:
        """``Pr[j in S'' | j not in S] = p2 (p3 - p4) + p4``."""
        return self.p2 * (self.p3 - self.p4) + self.p4

    @property
    def epsilon_one_round(self) -> float:
        """``ε1`` of one instantaneous response (Lemma 2)."""
        return _ln_ratio_max(self.p5, self.p6)

    @property
    def epsilon_permanent(self) -> float:
        """``ε∞``: the bound over any number of rounds (Lemma 1)."""
        return _ln_ratio_max(self.p1, self.p2)


def theorem2_events(params: RRParams, n1: ArrayLike, n0: ArrayLike) -> tuple[NDArray, NDArray]:
    """Theorem 2's ``p7`` and ``p8`` for indices owned by ``n1`` and not by ``n0`` clients.

    Returns
    -------
    tuple of numpy.ndarray
        ``p7 = p5 (1-p5)^(n1-1) (1-p6)^n0`` (zero where ``n1 = 0``) and
        ``p8 = (1-p5)^n1 (1 - (1-p6)^n0)``, elementwise.
    """
    a = np.asarray(n1, dtype=np.float64)
    b = np.asarray(n0, dtype=np.float64)
    p5, p6 = params.p5, params.p6
    with np.errstate(divide="ignore", invalid="ignore"):
        p7 = np.where(
            a >= 1, p5 * np.power(1 - p5, np.maximum(a - 1, 0)) * np.power(1 - p6, b), 0.0
        )
    p8 = np.power(1 - p5, a) * (1 - np.power(1 - p6, b))
    return p7, p8


def _indices(values: ArrayLike, what: str) -> NDArray[np.int64]:
    arr = np.asarray(values)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise ConfigurationError(f"{what} must be a 1-D integer array")
    out = np.unique(arr.astype(_I64))
    if out.size and out[0] < 0:
        raise ConfigurationError(f"{what} must be non-negative")
    return out


@dataclass
class PermanentMemo:
    """A client's memoized permanent answers: the indices answered "yes" and "no" so far.

    ``drawn`` is the ``(p1, p2)`` the answers were drawn with (None: not recorded, a version-1
    memo or an empty one): ``ε∞`` holds only while every answer of one memo comes from the same
    ``p1, p2``, so a client refuses to extend a memo with others.
    """

    yes: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, _I64))
    no: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, _I64))
    drawn: tuple[float, float] | None = None

    def to_bytes(self) -> bytes:
        """``b"FSRR"``, version, two u64 counts, the sorted ``yes`` and ``no`` (i64 each).

        Version 2 (when :attr:`drawn` is set) appends ``p1, p2`` (``f64`` each); a memo
        without them is written as version 1, byte for byte as before.
        """
        w = Writer(ClientInputError)
        w.fixed(_MEMO_MAGIC, len(_MEMO_MAGIC))
        w.u8(_LEGACY_MEMO_VERSION if self.drawn is None else _MEMO_VERSION)
        w.u64(self.yes.size)
        w.u64(self.no.size)
        w.words(self.yes, "<i8")
        w.words(self.no, "<i8")
        if self.drawn is not None:
            w.f64(self.drawn[0])
            w.f64(self.drawn[1])
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> PermanentMemo:
        """Strict decoder of :meth:`to_bytes`.

        Raises
        ------
        ClientInputError
            If the bytes are malformed, the counts exceed :data:`MAX_MEMO_INDICES` or do not
            match the length, an index is negative, a list is not strictly increasing, or an
            index is both "yes" and "no".
        """
        what = "randomized-response memo"
        raw = bytes(data) if isinstance(data, bytes | bytearray | memoryview) else b""
        version = _MEMO_VERSION if raw[len(_MEMO_MAGIC) : len(_MEMO_MAGIC) + 1] != b"\x01" else 1
        r = Reader.versioned(data, _MEMO_MAGIC, version, what, ClientInputError)
        n_yes, n_no = r.u64("memo yes count"), r.u64("memo no count")
        tail = 0 if version == _LEGACY_MEMO_VERSION else 16
        if n_yes + n_no > MAX_MEMO_INDICES or len(r.data) - r.pos != 8 * (n_yes + n_no) + tail:
            raise ClientInputError("randomized-response memo has a bad length")
        yes = r.words(n_yes, "<i8", "memo yes").astype(_I64)
        no = r.words(n_no, "<i8", "memo no").astype(_I64)
        drawn = None
        if tail:
            drawn = (r.f64("memo p1"), r.f64("memo p2"))
            if not all(0.0 <= p <= 1.0 for p in drawn):
                raise ClientInputError("randomized-response memo has probabilities outside [0, 1]")
        r.done()
        for arr in (yes, no):
            if arr.size and (arr[0] < 0 or np.any(arr[1:] <= arr[:-1])):
                raise ClientInputError("randomized-response memo lists are not sorted indices")
        if np.intersect1d(yes, no).size:
            raise ClientInputError("randomized-response memo answers an index both ways")
        return cls(yes, no, drawn)


class MemoStore:
    """A memo kept in a file, so a restarted client keeps its permanent answers.

    Writes are atomic (a temporary file in the same directory, then ``os.replace``) and the
    file is created with mode 0600. A file that does not decode is an error, not a fresh
    memo: starting afresh would draw new permanent answers and break the ``ε∞`` bound.

    Parameters
    ----------
    path : str or os.PathLike
        The memo file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> PermanentMemo:
        """Return the stored memo (an empty one when the file does not exist).

        Raises
        ------
        ClientInputError
            If the file exists but does not decode.
        """
        if not self.path.exists():
            return PermanentMemo()
        return PermanentMemo.from_bytes(self.path.read_bytes())

    def save(self, memo: PermanentMemo) -> None:
        """Replace the stored memo atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(memo.to_bytes())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)


def _coins(prg: PRGStream, count: int, probability: float) -> NDArray[np.bool_]:
    """``count`` independent Bernoulli(probability) draws from AES-CTR words."""
    if probability >= 1.0:
        return np.ones(count, dtype=bool)
    if probability <= 0.0:
        return np.zeros(count, dtype=bool)
    # Compare 53-bit uniforms with p: exact to float64's resolution of p.
    uniform = (prg.words(count) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return uniform < probability


def perturb_index_set(
    real: ArrayLike,
    union: ArrayLike,
    memo: PermanentMemo,
    params: RRParams,
    prg: PRGStream | None = None,
) -> tuple[NDArray[np.int64], PermanentMemo]:
    """Run Alg. 2 once: return the doubly perturbed set ``S''`` and the updated memo.

    Parameters
    ----------
    real : array_like
        The client's real index set ``S`` (non-negative integers).
    union : array_like
        The round's union ``U`` of the chosen clients' real sets.
    memo : PermanentMemo
        The client's memo so far (not modified; the new one is returned).
    params : RRParams
        The client's ``p1..p4``.
    prg : PRGStream, optional
        The coins' source (a fresh OS-keyed AES-CTR stream by default).

    Returns
    -------
    tuple
        ``S''`` (sorted, a subset of ``U``) and the memo with permanent answers for every
        index of ``U`` that had none.

    Raises
    ------
    ConfigurationError
        If an index set is not a 1-D array of non-negative integers.
    ClientInputError
        If the memo's answers were drawn with other permanent probabilities ``p1, p2``.
    """
    if memo.drawn is not None and memo.drawn != (params.p1, params.p2):
        raise ClientInputError(
            "the permanent probabilities p1, p2 changed within one memo scope "
            "(its answers were drawn with others; use a new session or memo)"
        )
    s = _indices(real, "the real index set")
    u = _indices(union, "the union")
    prg = prg or PRGStream.fresh()
    answered = np.union1d(memo.yes, memo.no)
    new = np.setdiff1d(u, answered, assume_unique=True)
    owned = np.isin(new, s, assume_unique=True)
    says_yes = np.where(owned, _coins(prg, new.size, params.p1), _coins(prg, new.size, params.p2))
    yes = np.union1d(memo.yes, new[says_yes])
    no = np.union1d(memo.no, new[~says_yes])
    in_yes = np.isin(u, yes, assume_unique=True)
    keep = np.where(in_yes, _coins(prg, u.size, params.p3), _coins(prg, u.size, params.p4))
    return u[keep], PermanentMemo(yes, no, (float(params.p1), float(params.p2)))
