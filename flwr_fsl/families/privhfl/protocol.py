r"""PrivHFL secure querying (Fan et al., §3.3): three-party prediction on shared queries.

A querier ``Q`` wants the answerers' predictions on its (mixup) queries without showing them
the queries; each answerer ``A_j`` wants to keep its model; the server ``S`` computes with
``A_j`` and routes every message (clients never talk directly). All values live in
``Z_2^64`` with ``f = 20`` fractional bits (:class:`PrivHFLConfig`); a secret ``x`` is
additively shared as ``x = [x]_0 + [x]_1`` with ``[x]_0`` at ``A`` and ``[x]_1`` at ``S``.
``Q`` deals all correlated randomness from PRG seeds it shares pairwise: ``Sk_QA`` (with
``A``), ``Sk_SQ`` (with ``S``); ``A`` and ``S`` share ``Sk_SA`` (:class:`SessionSeeds`). How
the seeds are agreed (X25519 through ``S``, sealed) is the Flower layer's job. Labels
``(session << 32) | op`` make every PRG use unique: never reuse ``(seeds, session)``.

**Π_Share.** ``Q`` sends ``[x]_1 = x - [x]_0`` to ``S``; ``A`` derives ``[x]_0`` from
``Sk_QA`` (:meth:`~flwr_fsl.crypto.sharing.Dealer.share_input`).

**Π_Matmul** (fully connected and convolution layers). Derived here (the paper's Fig. 3 is
garbled). ``A`` holds ``M`` (``K x O``: ``W^T``, or the convolution kernel as im2col weights),
the input is shared; write ``P(.)`` for the public, linear im2col (identity for a fully
connected layer), so the layer is ``Y = P(x) M``. ``A`` computes ``P([x]_0) M`` alone; for
``P([x]_1) M`` (``S``'s share times ``A``'s weights) ``Q`` deals a one-sided triple: ``a``
(``K x O``) and ``[c]_0`` to ``A`` from ``Sk_QA``, ``b`` (shaped like the *input*, not like
``P(x)``, so ``S`` sends ``k^2`` times less) to ``S`` from ``Sk_SQ``, and sends ``S``
``[c]_1 = P(b) a - [c]_0``. Then ``A -> S: E = M + a`` (offline: no query needed), ``S -> A:
F = [x]_1 - b``, and::

    A: [Y]_0 = P([x]_0 + F) M - [c]_0        S: [Y]_1 = P(b) E - [c]_1

Sum: ``P(x - b) M - [c]_0 + P(b) M + P(b) a - [c]_1 = P(x) M`` (``P`` is linear). ``E`` is
``M`` under the one-time pad ``a``, ``F`` is ``[x]_1`` under ``b``; ``Q`` never sees either.
The product has ``2f`` fractional bits; both truncate locally (SecureML,
:func:`~flwr_fsl.crypto.sharing.truncate_local`) and ``A`` adds the encoded bias. Average
pooling has public weights, so it is local: window sums times ``round(2^f / k^2)``, truncated.

**Π_DReLU, the paper's variant** (``relu="drelu"``; Fig. 4). ``A`` and ``S`` draw a positive
``r`` *per value* from ``Sk_SA`` (uniform in ``[1, 2^(62 - bound_bits)]``) and set ``[z]_b =
r [x]_b``; ``A -> S: [z]_0 - delta`` (``delta`` from ``Sk_QA``), ``S -> Q: [z]_0 - delta +
[z]_1``; ``Q`` adds ``delta``, reads ``z = r x`` as a signed integer (``|r x| < 2^62``: the sign
survives) and sends ``S`` ``DReLU(z) - delta'`` (``A``'s share is ``delta'`` from ``Sk_QA``).
``ReLU(x) = x * DReLU(x)`` is then one elementwise Beaver product with a triple ``Q`` deals
(:class:`~flwr_fsl.crypto.sharing.Dealer`, :func:`~flwr_fsl.crypto.sharing.beaver_mul`).

**Leak of the paper's variant (documented and tested).** ``Q`` learns ``z = r x`` for *every*
comparison input ``x`` of the answerer's model on ``Q``'s own query: the sign of every hidden
pre-activation (and of every max-pool difference, i.e. which window element is largest), the
exact zero pattern, and the magnitude up to the factor ``r``: ``|x| <= |z| <=
2^(62 - bound_bits) |x|`` in ring units. The first layer's signs are ``sign(W q + b)`` for
queries ``q`` of ``Q``'s choice: a hyperplane oracle for the answerer's weights. The paper's
claim (footnote 4: "masked intermediate values, rather than plain values") does not hold.
``tests/families/privhfl/test_protocol.py`` recovers the signs exactly.

**Leak-free comparison** (``relu="dcf"``; Boyle et al. EUROCRYPT'21 with a bounded input).
With ``|x| < 2^l`` (``l = bound_bits``) let ``X = x + 2^l`` in ``[0, 2^(l+1))``: ``DReLU(x)`` is
bit ``l`` of ``X``. ``Q`` (the dealer) draws a mask ``r = r_0 + r_1`` with ``r_0`` from
``Sk_QA`` and ``r_1`` from ``Sk_SQ`` (no message), and deals one DCF
(:mod:`flwr_fsl.crypto.dcf`) per value on ``l`` bits with ``alpha = r mod 2^l`` and payload
``beta = (1 - 2q, r (1 - 2q))``, ``q`` = bit ``l`` of ``r``, plus shares of ``q`` and ``r q``.
Online, ``A`` and ``S`` exchange ``[x]_b + r_b`` and open ``x^ = x + r``; with ``p`` = bit
``l`` of ``x^ + 2^l`` (public) and ``c = 1{x^ mod 2^l < r mod 2^l}`` (the borrow, from the
DCF), ``X = (x^ + 2^l) - r mod 2^(l+1)`` gives ``DReLU = p XOR q XOR c = p + (1-2p) q +
(1-2p)(1-2q) c`` and ``ReLU(x) = DReLU * (x^ - r) = x^ DReLU - [p r + (1-2p) r q + (1-2p)
r (1-2q) c]``: every term is linear in dealt shares or DCF outputs, so one round and no
Beaver product. Exact for ``|x| < 2^l``. The dealer must be ``Q``: ``S`` holds ``[x]_1`` and
sees ``x + r``, so if it also knew ``r`` it would learn ``x`` (a server-dealt DCF needs ``Q`` as
the second evaluator, i.e. ``Q`` online in every layer — not implemented).

**Max pooling** is a tree of ``max(a, b) = ReLU(a - b) + b`` (``ceil(log2 k^2)`` rounds of
one batched comparison each, ``k^2 - 1`` comparisons per output). **Π_Agg**: ``A_j -> S:
[y_j]_0 - r_j`` (``r_j`` from ``Sk_QA_j``); ``S -> Q: sum_j ([y_j]_0 - r_j + [y_j]_1)`` and the
list of answerers included; ``Q`` adds ``sum_j r_j`` and gets ``y = sum_j y_j``; soft labels are
``softmax(y)`` computed by ``Q`` in the clear (no secure softmax, as in the paper).

**Message flow** (what a transport must carry; :class:`_Session` runs it in process; ``*``
= can be sent before the query exists). Π_Share: ``Q -> S`` share. Per linear layer: ``Q -> S``
matmul-deal*, ``A -> S`` matmul-E*, ``S -> A`` matmul-F. Per comparison round, paper: ``Q -> S``
triple-deal*, ``A -> S`` drelu-z0, ``S -> Q`` drelu-z, ``Q -> S`` drelu-sign, ``A -> S``
beaver-A, ``S -> A`` beaver-S; DCF: ``Q -> S`` dcf-deal*, ``S -> A`` dcf-relay*, ``A -> S``
dcf-open-A, ``S -> A`` dcf-open-S. Π_Agg: ``A_j -> S`` agg-A, ``S -> Q`` agg-S. Each party's
methods are named after these steps (:class:`Answerer`, :class:`ServerParty`,
:class:`QuerierSession`); every message carries its op label and is checked on receipt.

**Threat model.** Honest-but-curious ``Q``, ``A_j``, ``S``; ``S`` colludes with no client (and
``Q`` with no ``A_j``). **Views** (each checked in the tests):

* ``S`` receives ``[x]_1``, ``[c]_1``, triple corrections, ``E = M + a``, ``[z]_0 - delta`` and
  ``DReLU - delta'`` (paper) or ``[x]_0 + r_0``, DCF keys and share corrections (DCF), Beaver
  openings, ``[y_j]_0 - r_j``: each word is masked by randomness ``S`` does not hold, so its
  view is uniform and independent of the query, the weights and the activations. It learns
  the public architectures, the batch size and which answerers were included.
* ``A`` receives ``F = [x]_1 - b``, Beaver openings, ``[x]_1 + r_1`` and the DCF public part:
  uniform as well. It learns the batch size.
* ``Q`` receives, besides ``sum_j y_j``: ``z = r x`` for every comparison (paper: the leak
  above) or **nothing** (DCF). With one answerer ``Q`` learns that answerer's logits; with
  several, only their sum.

**Correctness limits.** Every comparison input (ReLU input, max-pool difference) must satisfy
``|x| < 2^(bound_bits - frac_bits)`` in real units, and every product before truncation
``|v| < 2^(63 - 2 frac_bits)``. Local truncation is wrong (off by ``2^(64 - 2f)`` in real
units, ``2^24`` at ``f = 20``) with probability ``|v| 2^(2f) / 2^64`` per truncated product of
real magnitude ``|v|`` — about ``2^-20`` for ``|v| = 16`` (:func:`~flwr_fsl.crypto.sharing.
truncate_local`); deep networks on large batches will see a few such values (the benchmark
counts them). Beyond that the result is within :func:`~flwr_fsl.families.privhfl.inference.
error_bound` of plaintext.

**Cost** (``python benchmarks/privhfl_bench.py``; CPU seconds of all three parties summed,
one core of a shared 2-core machine, no network). Per query at batch 256, the paper's DReLU /
DCF: MLP 784-128-128-10 0.1 / 1.7 ms, 0.05 / 0.83 MB; VGG-7-like of widths 8-16-32 on 32x32x3
(39,424 comparisons per query) 7.5 / 305 ms, 2.95 / 107 MB (online 2.40 / 0.82 MB);
ResNet-8-like 9.0 / 301 ms, 3.1 / 100 MB. At widths 64-128-256 (315,392 comparisons; ``--width
64 --batches 1,32``) 85-108 ms / 2.5 s and 24-33 MB / 865 MB per query, against PrivHFL's 1.03 s
and 66.6 MB for VGG-7 (Table 3). The DCF's cost is its keys: ``l * (17 + 8 * 2) + 16`` bytes per
comparison (1336 at ``l = 40``), dealt to ``S`` and relayed to ``A``; Gen 2.4 us and evaluation
0.7 us per key and party at 40 bits (sycret's 32-bit DCF: 8.1 / 4.0 us). The ring matmul is the
numba kernel (:func:`flwr_fsl.kernels.ring.matmul_wrap`): 1.1-13.6 G multiply-adds per second on
these layers, 6-13x CryptGPU's float-split trick (16-bit limbs in float64 BLAS) on this CPU.

**Errors.** A malformed message from a party raises :class:`PrivHFLMessageError` (a
:class:`~flwr_fsl.core.errors.ClientInputError`): the driver drops that answerer's session and
aggregates over the others (:func:`secure_predict`); a malformed message from ``Q``
(:class:`QuerierMessageError`) or to ``Q`` from ``S`` (:class:`ServerMessageError`, a
:class:`~flwr_fsl.core.errors.RoundFailedError`) fails the query. Bad settings raise
:class:`~flwr_fsl.core.errors.ConfigurationError`.

**Wire format** of every message (version 1): ``b"PHFL"``, version ``u8``, kind ``u8``, step
``u64`` (the op label), array count ``u8``, arrays (:mod:`flwr_fsl.core.wireformat` ``array``
fields, ``uint64`` only, shapes checked by the receiver against what the op expects), then a
length-prefixed byte string (a DCF public part, or empty). No trailing bytes.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.core.wireformat import (
    MAX_ARRAY_NDIM,
    MAX_MESSAGE_BYTES,
    Reader,
    WireFormatError,
    register_magic,
)
from flwr_fsl.crypto import dcf
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.prg import SEED_BYTES, PRGStream
from flwr_fsl.crypto.ring import Z2_64
from flwr_fsl.crypto.sharing import (
    Dealer,
    PartyRandomness,
    TripleShape,
    TripleShare,
    beaver_mask,
    beaver_mul,
    truncate_local,
)
from flwr_fsl.families.privhfl.inference import (
    Architecture,
    Conv2d,
    Linear,
    MaxPool2d,
    SecureModel,
    Shape,
    flatten_nhwc,
    matmul_weight,
    nhwc_patches,
    pool_windows,
    to_nhwc,
)

__all__ = [
    "KIND_NAMES",
    "Answerer",
    "Message",
    "NoAnswerError",
    "PredictionResult",
    "PrivHFLConfig",
    "PrivHFLMessageError",
    "Querier",
    "QuerierMessageError",
    "QuerierSession",
    "ServerMessageError",
    "ServerParty",
    "SessionSeeds",
    "Transcript",
    "agg_step",
    "expect",
    "secure_predict",
    "server_aggregate",
    "softmax",
]

_U64 = np.uint64
_RING = Z2_64

TAG_MATMUL = 0x6D6D2D6C66687270  # b"prhfl-mm" little-endian
TAG_DRELU_SCALE = 0x72732D6C66687270  # b"prhfl-sr"
TAG_DRELU_MASK = 0x6D642D6C66687270  # b"prhfl-dm"
TAG_DCF_MASK = 0x6D632D6C66687270  # b"prhfl-cm"
TAG_DCF_KEYS = 0x6B632D6C66687270  # b"prhfl-ck"
TAG_AGG = 0x67612D6C66687270  # b"prhfl-ag"

# Message kinds and whether they can be sent before the query exists (offline).
SHARE, MATMUL_DEAL, MATMUL_A, MATMUL_S = 1, 2, 3, 4
DRELU_A, DRELU_S, DRELU_Q, TRIPLE_DEAL, BEAVER_A, BEAVER_S = 5, 6, 7, 8, 9, 10
DCF_DEAL, DCF_RELAY, DCF_OPEN_A, DCF_OPEN_S = 11, 12, 13, 14
AGG_A, AGG_S = 15, 16
KIND_NAMES = {
    SHARE: "share",
    MATMUL_DEAL: "matmul-deal",
    MATMUL_A: "matmul-E",
    MATMUL_S: "matmul-F",
    DRELU_A: "drelu-z0",
    DRELU_S: "drelu-z",
    DRELU_Q: "drelu-sign",
    TRIPLE_DEAL: "triple-deal",
    BEAVER_A: "beaver-A",
    BEAVER_S: "beaver-S",
    DCF_DEAL: "dcf-deal",
    DCF_RELAY: "dcf-relay",
    DCF_OPEN_A: "dcf-open-A",
    DCF_OPEN_S: "dcf-open-S",
    AGG_A: "agg-A",
    AGG_S: "agg-S",
}
OFFLINE_KINDS = frozenset({MATMUL_DEAL, MATMUL_A, TRIPLE_DEAL, DCF_DEAL, DCF_RELAY})
_MAGIC = register_magic(b"PHFL", "PrivHFL protocol message (flwr_fsl.families.privhfl.protocol)")
_VERSION = 1
_MAX_ARRAYS = 8


class PrivHFLMessageError(ClientInputError):
    """A PrivHFL message is malformed, of the wrong kind or step, or has a wrong shape."""


class QuerierMessageError(PrivHFLMessageError):
    """A message dealt by the querier is malformed: its query fails (no answerer is blamed)."""


class ServerMessageError(RoundFailedError):
    """The querier got a malformed message from the server: the query fails loudly."""


class NoAnswerError(RoundFailedError):
    """Every answerer's session failed: there is nothing to aggregate."""


# --------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class PrivHFLConfig:
    """Settings of secure querying.

    Parameters
    ----------
    relu : {"drelu", "dcf"}
        Comparison: the paper's DReLU (the querier learns ``r x``; see the module docstring)
        or the leak-free DCF comparison.
    frac_bits : int
        Fixed-point fractional bits ``f`` (the paper: 20), in ``[1, 28]``.
    bound_bits : int
        ``l``: every comparison input satisfies ``|x| < 2^l`` in ring units, i.e. ``|x| <
        2^(l - f)`` in real units; in ``[f + 1, 60]``. The DCF domain has ``l`` bits; the paper's
        variant draws ``r <= 2^(62 - l)``. Default 40 (activations below ``2^20``).
    """

    relu: Literal["drelu", "dcf"] = "drelu"
    frac_bits: int = 20
    bound_bits: int = 40

    def __post_init__(self) -> None:
        if self.relu not in ("drelu", "dcf"):
            raise ConfigurationError(f"relu must be 'drelu' or 'dcf', got {self.relu!r}")
        f = self.frac_bits
        if isinstance(f, bool) or not isinstance(f, int) or not 1 <= f <= 28:
            raise ConfigurationError(f"frac_bits must be an integer in [1, 28], got {f!r}")
        b = self.bound_bits
        if isinstance(b, bool) or not isinstance(b, int) or not f + 1 <= b <= 60:
            raise ConfigurationError(f"bound_bits must be an integer in [{f + 1}, 60], got {b!r}")

    @property
    def scale_bits(self) -> int:
        """Bits of the DReLU scale ``r`` (uniform in ``[1, 2^scale_bits]``): ``62 - l``."""
        return 62 - self.bound_bits

    @property
    def max_input(self) -> float:
        """Largest ``|query value|`` accepted: ``2^(l - f)``."""
        return float(2 ** (self.bound_bits - self.frac_bits))

    def codec(self) -> FixedPoint:
        """Return the fixed-point codec of queries, weights and outputs."""
        return FixedPoint(self.frac_bits, self.max_input, 1)


@dataclass(frozen=True)
class SessionSeeds:
    """The three pairwise PRG seeds of one (querier, answerer, server) session.

    Parameters
    ----------
    querier_answerer : bytes
        ``Sk_QA`` (16 bytes).
    server_answerer : bytes
        ``Sk_SA``.
    server_querier : bytes
        ``Sk_SQ``.

    Raises
    ------
    ConfigurationError
        If a seed is not 16 bytes or two coincide.
    """

    querier_answerer: bytes = field(repr=False)
    server_answerer: bytes = field(repr=False)
    server_querier: bytes = field(repr=False)

    def __post_init__(self) -> None:
        seeds = (self.querier_answerer, self.server_answerer, self.server_querier)
        if any(not isinstance(s, bytes) or len(s) != SEED_BYTES for s in seeds):
            raise ConfigurationError(f"every session seed must be {SEED_BYTES} bytes")
        if len(set(seeds)) != 3:
            raise ConfigurationError("the three session seeds must be distinct")

    @classmethod
    def fresh(cls) -> SessionSeeds:
        """Three fresh OS-random seeds."""
        return cls(os.urandom(16), os.urandom(16), os.urandom(16))


def softmax(logits: NDArray[np.float64]) -> NDArray[np.float64]:
    """Row-wise softmax (the querier's soft labels from the aggregated logits)."""
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


# -------------------------------------------------------------------------------- messages


@dataclass(frozen=True, eq=False)
class Message:
    """One protocol message: kind, step (op label), uint64 arrays and an optional blob."""

    kind: int
    step: int
    arrays: tuple[NDArray[np.uint64], ...] = ()
    blob: bytes = b""

    def to_bytes(self) -> bytes:
        """Serialize (format in the module docstring)."""
        if self.kind not in KIND_NAMES:
            raise ConfigurationError(f"unknown message kind {self.kind}")
        if len(self.arrays) > _MAX_ARRAYS:
            raise ConfigurationError(f"at most {_MAX_ARRAYS} arrays per message")
        # Fields as in the module docstring; array data joins as views: one copy in all.
        parts: list[bytes | memoryview] = [
            _MAGIC + struct.pack("<BBQB", _VERSION, self.kind, self.step, len(self.arrays))
        ]
        for a in self.arrays:
            if not isinstance(a, np.ndarray) or a.dtype != _U64:
                raise ConfigurationError("message arrays must be uint64")
            if a.ndim > MAX_ARRAY_NDIM:
                raise ConfigurationError(f"message arrays have at most {MAX_ARRAY_NDIM} dimensions")
            # A wireformat array field: dtype code 1 (uint64), ndim, dims, the data.
            parts.append(struct.pack(f"<BB{a.ndim}Q", 1, a.ndim, *a.shape))
            parts.append(np.ascontiguousarray(a, dtype="<u8").reshape(-1).view(np.uint8).data)
        if not isinstance(self.blob, bytes):
            raise ConfigurationError("the blob must be bytes")
        parts += [struct.pack("<I", len(self.blob)), self.blob]
        data = b"".join(parts)
        if len(data) > MAX_MESSAGE_BYTES:
            raise ConfigurationError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
        return data

    @classmethod
    def from_bytes(cls, data: object) -> Message:
        """Parse a message (any kind; :func:`expect` also checks kind, step and shapes).

        Raises
        ------
        PrivHFLMessageError
            If the bytes are not exactly one well-formed message.
        """
        try:
            if isinstance(data, bytes | bytearray | memoryview) and len(data) > MAX_MESSAGE_BYTES:
                raise PrivHFLMessageError(f"message exceeds {MAX_MESSAGE_BYTES} bytes")
            r = Reader.versioned(data, _MAGIC, _VERSION, "PrivHFL message")
            kind = r.u8("kind")
            if kind not in KIND_NAMES:
                raise PrivHFLMessageError(f"unknown PrivHFL message kind {kind}")
            step = r.u64("step")
            count = r.u8("array count")
            if count > _MAX_ARRAYS:
                raise PrivHFLMessageError(f"{count} arrays, at most {_MAX_ARRAYS}")
            arrays = tuple(r.array_u64(f"array {i}") for i in range(count))
            blob = r.raw("blob")
            r.done()
        except PrivHFLMessageError:
            raise
        except WireFormatError as err:
            raise PrivHFLMessageError(str(err)) from err
        return cls(kind, step, arrays, blob)


def expect(
    data: object,
    kind: int,
    step: int,
    shapes: Sequence[tuple[int, ...]],
    *,
    blob: bool = False,
    sender: str = "peer",
) -> Message:
    """Parse ``data`` and check it is the expected message of this op.

    Parameters
    ----------
    data : bytes
        The received message.
    kind : int
        Expected kind.
    step : int
        Expected op label.
    shapes : sequence of tuple of int
        Expected shape of each array, in order.
    blob : bool, optional
        Whether a non-empty blob is expected (else it must be empty).
    sender : str, optional
        Who sent it, for the error message.

    Returns
    -------
    Message
        The message.

    Raises
    ------
    PrivHFLMessageError
        If anything differs.
    """
    try:
        msg = Message.from_bytes(data)
        _check_expected(msg, kind, step, shapes, blob, sender)
    except PrivHFLMessageError as err:
        if sender == "querier":
            raise QuerierMessageError(str(err)) from err
        raise
    return msg


def _check_expected(
    msg: Message,
    kind: int,
    step: int,
    shapes: Sequence[tuple[int, ...]],
    blob: bool,
    sender: str,
) -> None:
    what = f"{KIND_NAMES[kind]} message from {sender}"
    if msg.kind != kind:
        raise PrivHFLMessageError(f"expected a {what}, got kind {KIND_NAMES[msg.kind]}")
    if msg.step != step:
        raise PrivHFLMessageError(f"{what} is for step {msg.step}, expected {step}")
    got = [a.shape for a in msg.arrays]
    if got != [tuple(s) for s in shapes]:
        raise PrivHFLMessageError(f"{what} must carry arrays of shapes {list(shapes)}, got {got}")
    if bool(msg.blob) != blob:
        raise PrivHFLMessageError(f"{what} must {'' if blob else 'not '}carry a blob")


# ---------------------------------------------------------------------------- helpers


def _stream(seed: bytes, label: int, tag: int) -> PRGStream:
    return PRGStream.from_seed(seed, label, tag)


def _count(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _batched(n: int, shape: Shape) -> tuple[int, ...]:
    return (n, *shape)


def _linear_geometry(layer: Linear | Conv2d, n: int, shape_in: Shape, shape_out: Shape) -> tuple:
    """``(rows P, inner K, outputs O)`` of the layer's product ``P(x) M``."""
    if isinstance(layer, Conv2d):
        rows = n * shape_out[0] * shape_out[1]
        inner = layer.in_channels * layer.kernel_size**2
        return rows, inner, layer.out_channels
    return n, layer.in_features, layer.out_features


def _patches(x: NDArray[np.uint64], layer: Linear | Conv2d) -> NDArray[np.uint64]:
    if isinstance(layer, Conv2d):
        return np.ascontiguousarray(
            nhwc_patches(x, layer.kernel_size, layer.stride, layer.padding), dtype=_U64
        )
    return x


def _signed_ge0(z: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``1{z >= 0}`` of ring elements read as signed 64-bit integers."""
    return (z.view(np.int64) >= 0).astype(_U64)


class Transcript:
    """What crossed between parties: sizes per kind and phase, per-party views, party times.

    Parameters
    ----------
    keep_views : bool, optional
        Keep every received message (decoded) per receiver, for view tests.
    clock : callable, optional
        The clock of :meth:`timed` (default ``time.perf_counter``; ``time.process_time``
        measures CPU time, which other load on the machine does not inflate).
    """

    def __init__(
        self, keep_views: bool = False, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.records: list[tuple[str, str, int, int]] = []
        self.views: dict[str, list[Message]] = defaultdict(list)
        self.keep_views = keep_views
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)

    def record(self, sender: str, receiver: str, data: bytes) -> None:
        """Count a message (and keep it, parsed, in the receiver's view).

        Raises
        ------
        PrivHFLMessageError
            If the bytes do not start like a message (a view also needs the whole message).
        """
        if len(data) < 6 or data[:4] != _MAGIC or data[5] not in KIND_NAMES:
            raise PrivHFLMessageError("not a PrivHFL message")
        self.records.append((sender, receiver, data[5], len(data)))
        if self.keep_views:
            self.views[receiver].append(Message.from_bytes(data))

    @contextmanager
    def timed(self, party: str) -> Iterator[None]:
        """Add the time spent in the block to ``party``'s total."""
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[party] += self.clock() - start

    def bytes_total(self, phase: str | None = None) -> int:
        """Total bytes, optionally only ``"offline"`` or ``"online"`` kinds."""
        return sum(
            n
            for _, _, k, n in self.records
            if phase is None or (k in OFFLINE_KINDS) == (phase == "offline")
        )

    def bytes_by_link(self) -> dict[str, int]:
        """Bytes per ``"sender->receiver"`` link."""
        out: dict[str, int] = defaultdict(int)
        for s, r, _, n in self.records:
            out[f"{s}->{r}"] += n
        return dict(out)

    def bytes_by_kind(self) -> dict[str, int]:
        """Bytes per message kind."""
        out: dict[str, int] = defaultdict(int)
        for _, _, k, n in self.records:
            out[KIND_NAMES[k]] += n
        return dict(out)

    def kinds_received(self, party: str) -> list[str]:
        """Kinds of the messages ``party`` received, in order (needs ``keep_views``)."""
        return [KIND_NAMES[m.kind] for m in self.views[party]]


# ---------------------------------------------------------------------------- parties


def _check_party_args(
    config: object, architecture: object, batch: object, seeds: object, session: object
) -> None:
    """Validate a party's constructor arguments (ConfigurationError naming the bad one)."""
    if not isinstance(config, PrivHFLConfig):
        raise ConfigurationError("config must be a PrivHFLConfig")
    if not isinstance(architecture, Architecture):
        raise ConfigurationError("architecture must be an Architecture")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigurationError(f"batch must be a positive integer, got {batch!r}")
    if not isinstance(seeds, SessionSeeds):
        raise ConfigurationError("seeds must be a SessionSeeds")
    if isinstance(session, bool) or not isinstance(session, int) or not 0 <= session < 2**32:
        raise ConfigurationError(f"session must be an integer in [0, 2^32), got {session!r}")


class _Evaluator:
    """Common part of the two computing parties (the answerer is party 0, the server 1)."""

    party: int

    def __init__(
        self,
        config: PrivHFLConfig,
        architecture: Architecture,
        batch: int,
        dealer_seed: bytes,
        peer_seed: bytes,
        session: int,
    ) -> None:
        self.config = config
        self.architecture = architecture
        self.batch = batch
        self.rand = PartyRandomness(_RING, dealer_seed, self.party, 2)
        self._dealer_seed = dealer_seed
        self._peer_seed = peer_seed
        self._session = session
        self._op = 0
        self.stack: list[NDArray[np.uint64]] = []
        self._pending: dict[str, Any] = {}

    # -- labels

    def _next(self) -> int:
        self._op += 1
        return (self._session << 32) | self._op

    @property
    def label(self) -> int:
        """The current op's label."""
        return (self._session << 32) | self._op

    # -- local ops

    @property
    def top(self) -> NDArray[np.uint64]:
        """Return this party's share of the current value."""
        return self.stack[-1]

    def _truncate(self, v: NDArray[np.uint64]) -> NDArray[np.uint64]:
        return truncate_local(_RING, self.party, v, self.config.frac_bits)

    def avgpool(self, kernel: int, stride: int) -> None:
        """Local average pooling: window sums times ``round(2^f / k^2)``, truncated."""
        win = pool_windows(self.top, kernel, stride)
        total = _RING.sum(win, axis=0)
        weight = round(2**self.config.frac_bits / (kernel * kernel))
        self.stack[-1] = self._truncate(_RING.mul(total, _U64(weight)))

    def flatten(self) -> None:
        """Local flatten in torch's ``(C, H, W)`` order."""
        self.stack[-1] = flatten_nhwc(self.top)

    def residual_begin(self) -> None:
        """Keep the block input for the shortcut."""
        self.stack.append(self.top)

    def residual_swap(self) -> None:
        """Set the body output aside; continue from the block input."""
        self.stack[-1], self.stack[-2] = self.stack[-2], self.stack[-1]

    def residual_end(self) -> None:
        """Add the shortcut output to the body output."""
        short = self.stack.pop()
        self.stack[-1] = _RING.add(self.top, short)

    def pool_begin(self, kernel: int, stride: int) -> None:
        """Stack the pooling windows: ``(k*k, N, OH, OW, C)``."""
        self.stack[-1] = pool_windows(self.top, kernel, stride)

    def pool_level_begin(self) -> None:
        """Pair up the stack's elements; the current value becomes ``left - right``."""
        w = self.top
        half = w.shape[0] // 2
        left, right = w[0 : 2 * half : 2], w[1 : 2 * half : 2]
        self._pending["pool"] = (right, w[2 * half :])
        self.stack[-1] = _RING.sub(left, right)

    def pool_level_end(self) -> None:
        """``max = ReLU(left - right) + right``, plus the odd element left over."""
        right, rest = self._pending.pop("pool")
        merged = _RING.add(self.top, right)
        self.stack[-1] = np.concatenate([merged, rest]) if rest.shape[0] else merged

    def pool_end(self) -> None:
        """Drop the (now single-element) window axis."""
        self.stack[-1] = self.top[0]

    # -- shared pieces of the interactive ops

    def _matmul_triple_stream(self, label: int) -> PRGStream:
        return _stream(self._dealer_seed, label, TAG_MATMUL)

    def _drelu_scale(self, n: int, label: int) -> NDArray[np.uint64]:
        words = _stream(self._peer_seed, label, TAG_DRELU_SCALE).words(n)
        return (words >> _U64(64 - self.config.scale_bits)) + _U64(1)

    def _elementwise_triple(self, n: int, label: int, correction: object = None) -> TripleShare:
        return self.rand.triple(TripleShape.elementwise((n,)), label, correction)

    def _beaver_open(self, peer: Message) -> tuple[NDArray[np.uint64], NDArray[np.uint64]]:
        mine_d, mine_e, triple = self._pending["beaver"]
        d = _RING.add(mine_d, peer.arrays[0])
        e = _RING.add(mine_e, peer.arrays[1])
        return beaver_mul(_RING, self.party, d, e, triple), d

    def _dcf_masks(self, n: int, label: int) -> PRGStream:
        return _stream(self._dealer_seed, label, TAG_DCF_MASK)

    def _dcf_finish(self, peer_open: NDArray[np.uint64]) -> NDArray[np.uint64]:
        st = self._pending.pop("dcf")
        assert isinstance(st, dict)
        l_bits = self.config.bound_bits
        x_hat = _RING.add(st["open"], peer_open)
        shifted = _RING.add(x_hat, _U64(1 << l_bits))
        p = (shifted >> _U64(l_bits)) & _U64(1)
        point = x_hat & _U64((1 << l_bits) - 1)
        out = dcf.evaluate_paired(st["keys"], point)
        sign = _RING.sub(_U64(1), _RING.mul(_U64(2), p))  # 1 - 2p: +1 or -1
        drelu = _RING.mul(sign, _RING.add(st["q"], out[:, 0]))
        bxr = _RING.mul(sign, _RING.add(st["rq"], out[:, 1]))
        bxr = _RING.add(bxr, _RING.mul(p, st["r"]))
        if self.party == 0:
            drelu = _RING.add(drelu, p)
        return _RING.sub(_RING.mul(x_hat, drelu), bxr)


class Answerer(_Evaluator):
    """The answering client ``A`` (party 0): holds the model and the share ``[.]_0``.

    Parameters
    ----------
    config : PrivHFLConfig
        Settings.
    model : SecureModel
        The private model.
    batch : int
        Number of queries.
    seeds : SessionSeeds
        The session's seeds (``A`` uses ``Sk_QA`` and ``Sk_SA``).
    session : int, optional
        Session number in ``[0, 2^32)``; never reuse one with the same seeds.
    """

    party = 0

    def __init__(
        self,
        config: PrivHFLConfig,
        model: SecureModel,
        batch: int,
        seeds: SessionSeeds,
        session: int = 0,
    ) -> None:
        if not isinstance(model, SecureModel):
            raise ConfigurationError("model must be a SecureModel")
        _check_party_args(config, model.architecture, batch, seeds, session)
        super().__init__(
            config,
            model.architecture,
            batch,
            seeds.querier_answerer,
            seeds.server_answerer,
            session,
        )
        codec = config.codec()
        limit = codec.max_abs
        if model.max_abs_weight() > limit:
            raise ConfigurationError(f"a weight exceeds the fixed-point range {limit}")
        self._weights = [
            (
                codec.encode_exact(matmul_weight(w)),
                codec.encode_exact(b) if b is not None else None,
            )
            for w, b in model.params
        ]

    def receive_input(self) -> None:
        """Π_Share: derive ``[x]_0`` from ``Sk_QA``."""
        label = self._next()
        shape = _batched(self.batch, self.architecture.internal_input_shape)
        self.stack = [self.rand.input_share(shape, label)]

    # Π_Matmul

    def linear_mask(self, layer: Linear | Conv2d, index: int, geometry: tuple) -> bytes:
        """Send ``E = M + a`` (offline); remember ``a`` and ``[c]_0``."""
        label = self._next()
        _, inner, outs = geometry
        stream = self._matmul_triple_stream(label)
        a = _RING.random((inner, outs), stream)
        self._pending["matmul"] = (layer, index, geometry, stream)
        return Message(MATMUL_A, label, (_RING.add(self._weights[index][0], a),)).to_bytes()

    def linear_finish(self, data: bytes, shape_out: Shape) -> None:
        """``[Y]_0 = P([x]_0 + F) M - [c]_0``, truncated, plus the bias."""
        layer, index, (rows, _, outs), stream = self._pending.pop("matmul")
        msg = expect(data, MATMUL_S, self.label, [self.top.shape], sender="server")
        c0 = _RING.random((rows, outs), stream)
        x_minus_b = _RING.add(self.top, _RING.validate(msg.arrays[0], "F"))
        y = _RING.sub(_RING.matmul(_patches(x_minus_b, layer), self._weights[index][0]), c0)
        y = self._truncate(y)
        bias = self._weights[index][1]
        if bias is not None:
            y = _RING.add(y, bias)
        self.stack[-1] = y.reshape(_batched(self.batch, shape_out))

    # Π_DReLU (paper)

    def drelu_start(self) -> bytes:
        """Send ``S`` the masked ``r [x]_0 - delta`` (``A -> S``)."""
        label = self._next()
        x = self.top.reshape(-1)
        n = x.shape[0]
        masks = _stream(self._dealer_seed, label, TAG_DRELU_MASK)
        delta = _RING.random((n,), masks)
        delta_prime = _RING.random((n,), masks)
        z0 = _RING.mul(self._drelu_scale(n, label), x)
        self._pending["drelu"] = delta_prime
        return Message(DRELU_A, label, (_RING.sub(z0, delta),)).to_bytes()

    def drelu_mask(self) -> bytes:
        """Beaver openings of ``x * DReLU(x)`` (``A``'s DReLU share is ``delta'``)."""
        x = self.top.reshape(-1)
        s0 = self._pending.pop("drelu")
        triple = self._elementwise_triple(x.shape[0], self.label)
        d, e = beaver_mask(_RING, x, s0, triple)
        self._pending["beaver"] = (d, e, triple)
        return Message(BEAVER_A, self.label, (d, e)).to_bytes()

    def drelu_finish(self, data: bytes) -> None:
        """``ReLU`` share from the server's openings."""
        n = self.top.size
        msg = expect(data, BEAVER_S, self.label, [(n,), (n,)], sender="server")
        out, _ = self._beaver_open(msg)
        self._pending.pop("beaver")
        self.stack[-1] = out.reshape(self.top.shape)

    # DCF comparison

    def dcf_start(self, relay: bytes) -> bytes:
        """Take the dealt DCF keys (relayed by ``S``) and open ``[x]_0 + r_0``."""
        label = self._next()
        x = self.top.reshape(-1)
        n = x.shape[0]
        msg = expect(relay, DCF_RELAY, label, [], blob=True, sender="server")
        keys = _dcf_keys(msg.blob, 0, self._dealer_seed, label, n, self.config)
        stream = self._dcf_masks(n, label)
        r0 = _RING.random((n,), stream)
        q0 = _RING.random((n,), stream)
        rq0 = _RING.random((n,), stream)
        opened = _RING.add(x, r0)
        self._pending["dcf"] = {"keys": keys, "r": r0, "q": q0, "rq": rq0, "open": opened}
        return Message(DCF_OPEN_A, label, (opened,)).to_bytes()

    def dcf_finish(self, data: bytes) -> None:
        """Evaluate the DCF at the opened ``x + r``; this party's share of ``ReLU(x)``."""
        n = self.top.size
        msg = expect(data, DCF_OPEN_S, self.label, [(n,)], sender="server")
        self.stack[-1] = self._dcf_finish(msg.arrays[0]).reshape(self.top.shape)

    # Π_Agg

    def aggregate(self) -> bytes:
        """Send ``S`` the masked output share ``[y]_0 - r`` (``r`` from ``Sk_QA``)."""
        label = self._next()
        y = self.top
        r = _RING.random(y.shape, _stream(self._dealer_seed, label, TAG_AGG))
        return Message(AGG_A, label, (_RING.sub(y, r),)).to_bytes()


def _dcf_keys(
    blob: bytes, party: int, seed: bytes, label: int, n: int, config: PrivHFLConfig
) -> dcf.DCFKeyBatch:
    try:
        return _dcf_keys_checked(blob, party, seed, label, n, config)
    except PrivHFLMessageError as err:
        if party == 1:  # the server got the public part from the querier directly
            raise QuerierMessageError(str(err)) from err
        raise


def _dcf_keys_checked(
    blob: bytes, party: int, seed: bytes, label: int, n: int, config: PrivHFLConfig
) -> dcf.DCFKeyBatch:
    """Rebuild a party's DCF keys: root seeds from its seed with ``Q``, the dealt public part."""
    try:
        public = dcf.DCFPublicBatch.from_bytes(blob)
    except dcf.DCFKeyError as err:
        raise PrivHFLMessageError(f"DCF public part: {err}") from err
    if (public.domain_bits, public.tau, public.num_keys) != (config.bound_bits, 2, n):
        raise PrivHFLMessageError(
            f"DCF public part must hold {n} keys on {config.bound_bits} bits with tau 2, got "
            f"{public.num_keys} on {public.domain_bits} bits with tau {public.tau}"
        )
    msk = _stream(seed, label, TAG_DCF_KEYS).words(2).astype("<u8").tobytes()
    return dcf.DCFKeyBatch.from_master_seed(party, msk, public)


class ServerParty(_Evaluator):
    """The server ``S`` (party 1) in one answerer's session: holds the share ``[.]_1``.

    Parameters
    ----------
    config : PrivHFLConfig
        Settings.
    architecture : Architecture
        The answerer's public architecture.
    batch : int
        Number of queries.
    seeds : SessionSeeds
        The session's seeds (``S`` uses ``Sk_SQ`` and ``Sk_SA``).
    session : int, optional
        Session number.
    """

    party = 1

    def __init__(
        self,
        config: PrivHFLConfig,
        architecture: Architecture,
        batch: int,
        seeds: SessionSeeds,
        session: int = 0,
    ) -> None:
        _check_party_args(config, architecture, batch, seeds, session)
        super().__init__(
            config, architecture, batch, seeds.server_querier, seeds.server_answerer, session
        )

    def receive_input(self, data: bytes) -> None:
        """Π_Share: ``[x]_1`` from ``Q``."""
        label = self._next()
        shape = _batched(self.batch, self.architecture.internal_input_shape)
        msg = expect(data, SHARE, label, [shape], sender="querier")
        self.stack = [self.rand.input_share(shape, label, msg.arrays[0])]

    # Π_Matmul

    def linear_mask(self, layer: Linear | Conv2d, geometry: tuple, deal: bytes) -> bytes:
        """Take ``[c]_1`` from ``Q``; send ``F = [x]_1 - b``."""
        label = self._next()
        rows, _, outs = geometry
        msg = expect(deal, MATMUL_DEAL, label, [(rows, outs)], sender="querier")
        b = _RING.random(self.top.shape, self._matmul_triple_stream(label))
        self._pending["matmul"] = (layer, b, msg.arrays[0])
        return Message(MATMUL_S, label, (_RING.sub(self.top, b),)).to_bytes()

    def linear_finish(self, data: bytes, geometry: tuple, shape_out: Shape) -> None:
        """``[Y]_1 = P(b) E - [c]_1``, truncated."""
        layer, b, c1 = self._pending.pop("matmul")
        _, inner, outs = geometry
        msg = expect(data, MATMUL_A, self.label, [(inner, outs)], sender="answerer")
        y = _RING.sub(_RING.matmul(_patches(b, layer), msg.arrays[0]), c1)
        self.stack[-1] = self._truncate(y).reshape(_batched(self.batch, shape_out))

    # Π_DReLU (paper)

    def drelu_start(self, data: bytes, triple_deal: bytes) -> bytes:
        """``S -> Q: [z]_0 - delta + r [x]_1``; keep the dealt triple correction."""
        label = self._next()
        x = self.top.reshape(-1)
        n = x.shape[0]
        msg = expect(data, DRELU_A, label, [(n,)], sender="answerer")
        deal = expect(triple_deal, TRIPLE_DEAL, label, [(n,)], sender="querier")
        self._pending["triple"] = self._elementwise_triple(n, label, deal.arrays[0])
        z1 = _RING.mul(self._drelu_scale(n, label), x)
        return Message(DRELU_S, label, (_RING.add(msg.arrays[0], z1),)).to_bytes()

    def drelu_mask(self, data: bytes) -> bytes:
        """Take ``DReLU - delta'`` from ``Q``; Beaver openings of ``x * DReLU(x)``."""
        x = self.top.reshape(-1)
        msg = expect(data, DRELU_Q, self.label, [x.shape], sender="querier")
        triple = self._pending.pop("triple")
        assert isinstance(triple, TripleShare)
        d, e = beaver_mask(_RING, x, msg.arrays[0], triple)
        self._pending["beaver"] = (d, e, triple)
        return Message(BEAVER_S, self.label, (d, e)).to_bytes()

    def drelu_finish(self, data: bytes) -> None:
        """``ReLU`` share from the answerer's openings."""
        n = self.top.size
        msg = expect(data, BEAVER_A, self.label, [(n,), (n,)], sender="answerer")
        out, _ = self._beaver_open(msg)
        self._pending.pop("beaver")
        self.stack[-1] = out.reshape(self.top.shape)

    # DCF comparison

    def dcf_start(self, deal: bytes) -> tuple[bytes, bytes]:
        """Take the DCF keys and corrections from ``Q``; return (relay to ``A``, opening)."""
        label = self._next()
        x = self.top.reshape(-1)
        n = x.shape[0]
        msg = expect(deal, DCF_DEAL, label, [(n,), (n,)], blob=True, sender="querier")
        keys = _dcf_keys(msg.blob, 1, self._dealer_seed, label, n, self.config)
        r1 = _RING.random((n,), self._dcf_masks(n, label))
        opened = _RING.add(x, r1)
        self._pending["dcf"] = {
            "keys": keys,
            "r": r1,
            "q": msg.arrays[0],
            "rq": msg.arrays[1],
            "open": opened,
        }
        relay = Message(DCF_RELAY, label, (), msg.blob).to_bytes()
        return relay, Message(DCF_OPEN_S, label, (opened,)).to_bytes()

    def dcf_finish(self, data: bytes) -> None:
        """Evaluate the DCF at the opened ``x + r``; this party's share of ``ReLU(x)``."""
        n = self.top.size
        msg = expect(data, DCF_OPEN_A, self.label, [(n,)], sender="answerer")
        self.stack[-1] = self._dcf_finish(msg.arrays[0]).reshape(self.top.shape)

    # Π_Agg

    def aggregate_part(self, data: bytes) -> NDArray[np.uint64]:
        """``[y]_0 - r + [y]_1`` of this session (the server sums the sessions)."""
        label = self._next()
        msg = expect(data, AGG_A, label, [self.top.shape], sender="answerer")
        return _RING.add(msg.arrays[0], self.top)


def server_aggregate(parts: dict[int, NDArray[np.uint64]], step: int) -> bytes:
    """``S -> Q``: the sum of the sessions' masked outputs and the answerers included.

    Parameters
    ----------
    parts : dict of int to numpy.ndarray
        Answerer index -> :meth:`ServerParty.aggregate_part`.
    step : int
        The aggregation step (the querier's label for it).

    Returns
    -------
    bytes
        An ``agg-S`` message: ``(sum, included answerer indices)``.
    """
    order = sorted(parts)
    total = _RING.sum(np.stack([parts[j] for j in order]), axis=0)
    ids = np.asarray(order, dtype=_U64)
    return Message(AGG_S, step, (total, ids)).to_bytes()


class QuerierSession:
    """The querier's side of one answerer's session: the dealer of its correlated randomness.

    Parameters
    ----------
    config : PrivHFLConfig
        Settings.
    architecture : Architecture
        The answerer's public architecture.
    batch : int
        Number of queries.
    seeds : SessionSeeds
        The session's seeds (``Q`` uses ``Sk_QA`` and ``Sk_SQ``).
    session : int, optional
        Session number.
    record_leak : bool, optional
        Keep every ``z = r x`` learned in the paper's DReLU (:attr:`learned`), to show the leak.
    """

    def __init__(
        self,
        config: PrivHFLConfig,
        architecture: Architecture,
        batch: int,
        seeds: SessionSeeds,
        session: int = 0,
        record_leak: bool = False,
    ) -> None:
        _check_party_args(config, architecture, batch, seeds, session)
        self.config = config
        self.architecture = architecture
        self.batch = batch
        self.dealer = Dealer(_RING, (seeds.querier_answerer, seeds.server_querier))
        self._qa = seeds.querier_answerer
        self._sq = seeds.server_querier
        self._session = session
        self._op = 0
        self.learned: list[NDArray[np.int64]] | None = [] if record_leak else None
        self._pending: dict[str, Any] = {}

    def _next(self) -> int:
        self._op += 1
        return (self._session << 32) | self._op

    @property
    def label(self) -> int:
        """The current op's label."""
        return (self._session << 32) | self._op

    def share_input(self, x_encoded: NDArray[np.uint64]) -> bytes:
        """Π_Share: ``[x]_1 = x - [x]_0`` for ``S``."""
        label = self._next()
        return Message(SHARE, label, (self.dealer.share_input(x_encoded, label),)).to_bytes()

    def deal_linear(self, layer: Linear | Conv2d, geometry: tuple, shape_in: Shape) -> bytes:
        """Π_Matmul triple: ``[c]_1 = P(b) a - [c]_0`` for ``S``."""
        label = self._next()
        rows, inner, outs = geometry
        a_stream = _stream(self._qa, label, TAG_MATMUL)
        a = _RING.random((inner, outs), a_stream)
        c0 = _RING.random((rows, outs), a_stream)
        b = _RING.random(_batched(self.batch, shape_in), _stream(self._sq, label, TAG_MATMUL))
        c1 = _RING.sub(_RING.matmul(_patches(b, layer), a), c0)
        return Message(MATMUL_DEAL, label, (c1,)).to_bytes()

    def deal_drelu(self, n: int) -> bytes:
        """Deal the Beaver triple of ``x * DReLU(x)``: ``S``'s correction ``c_1``."""
        label = self._next()
        return Message(
            TRIPLE_DEAL, label, (self.dealer.triple(TripleShape.elementwise((n,)), label),)
        ).to_bytes()

    def drelu_answer(self, data: bytes, n: int) -> bytes:
        """Open ``z = r x`` (the leak) and send ``S`` its share ``DReLU(z) - delta'``."""
        try:
            msg = expect(data, DRELU_S, self.label, [(n,)], sender="server")
        except PrivHFLMessageError as err:
            raise ServerMessageError(str(err)) from err
        masks = _stream(self._qa, self.label, TAG_DRELU_MASK)
        delta = _RING.random((n,), masks)
        delta_prime = _RING.random((n,), masks)
        z = _RING.add(msg.arrays[0], delta)
        if self.learned is not None:
            self.learned.append(z.view(np.int64).copy())
        return Message(DRELU_Q, self.label, (_RING.sub(_signed_ge0(z), delta_prime),)).to_bytes()

    def deal_dcf(self, n: int) -> bytes:
        """DCF keys for the mask ``r = r_0 + r_1`` and ``S``'s shares of ``q``, ``r q``."""
        label = self._next()
        cfg = self.config
        l_bits = cfg.bound_bits
        a_stream = _stream(self._qa, label, TAG_DCF_MASK)
        r0 = _RING.random((n,), a_stream)
        q0 = _RING.random((n,), a_stream)
        rq0 = _RING.random((n,), a_stream)
        r1 = _RING.random((n,), _stream(self._sq, label, TAG_DCF_MASK))
        r = _RING.add(r0, r1)
        q = (r >> _U64(l_bits)) & _U64(1)
        sign = _RING.sub(_U64(1), _RING.mul(_U64(2), q))
        betas = np.stack([sign, _RING.mul(r, sign)], axis=1)
        msk = tuple(
            _stream(s, label, TAG_DCF_KEYS).words(2).astype("<u8").tobytes()
            for s in (self._qa, self._sq)
        )
        k0, _ = dcf.generate_keys_batch(
            r & _U64((1 << l_bits) - 1), betas, l_bits, master_seeds=(msk[0], msk[1])
        )
        corr = (_RING.sub(q, q0), _RING.sub(_RING.mul(r, q), rq0))
        return Message(DCF_DEAL, label, corr, k0.public.to_bytes()).to_bytes()

    def aggregation_mask(self) -> NDArray[np.uint64]:
        """``r_j`` of Π_Agg for this session (advances the label like the other parties)."""
        label = self._next()
        shape = (self.batch, self.architecture.num_outputs)
        return _RING.random(shape, _stream(self._qa, label, TAG_AGG))


class Querier:
    """The querying client ``Q``: encodes its queries and deals for every answerer's session.

    Parameters
    ----------
    config : PrivHFLConfig
        Settings.
    sessions : dict of int to QuerierSession
        Answerer index -> that session's dealer state.
    """

    def __init__(self, config: PrivHFLConfig, sessions: dict[int, QuerierSession]) -> None:
        if not isinstance(config, PrivHFLConfig):
            raise ConfigurationError("config must be a PrivHFLConfig")
        if not sessions or any(not isinstance(q, QuerierSession) for q in sessions.values()):
            raise ConfigurationError("sessions must map answerer indices to QuerierSessions")
        self.config = config
        self.sessions = sessions
        self.codec = config.codec()

    def encode(self, queries: ArrayLike, architecture: Architecture) -> NDArray[np.uint64]:
        """Fixed-point encode a batch in the protocol's layout (NHWC)."""
        x = np.asarray(queries, dtype=np.float64)
        if x.ndim != len(architecture.input_shape) + 1 or x.shape[1:] != architecture.input_shape:
            raise ConfigurationError(
                f"queries must be (N, *{architecture.input_shape}), got {x.shape}"
            )
        return self.codec.encode(to_nhwc(x))

    def finish(self, data: bytes, step: int, shape: tuple[int, int]) -> tuple[NDArray, tuple]:
        """Π_Agg: add the masks of the answerers included; decode ``sum_j y_j``.

        Returns
        -------
        tuple
            ``(summed logits (N, O) float64, included answerer indices)``.

        Raises
        ------
        ServerMessageError
            If the message is malformed or names an unknown answerer.
        """
        try:
            msg = Message.from_bytes(data)
        except PrivHFLMessageError as err:
            raise ServerMessageError(f"agg-S: {err}") from err
        if msg.kind != AGG_S or msg.step != step or len(msg.arrays) != 2 or msg.blob:
            raise ServerMessageError("expected the server's agg-S message for this step")
        total, ids = msg.arrays
        if total.shape != shape or ids.ndim != 1:
            raise ServerMessageError(f"agg-S must carry {shape} logits and a 1-D id list")
        included = tuple(int(i) for i in ids)
        if len(set(included)) != len(included) or any(i not in self._masks for i in included):
            raise ServerMessageError(f"agg-S names unknown or repeated answerers {included}")
        for j in included:
            total = _RING.add(total, self._masks[j])
        return self.codec.decode(total), included

    def prepare_aggregation(self) -> None:
        """Draw every session's Π_Agg mask (after the networks, before the server's message)."""
        self._masks = {j: s.aggregation_mask() for j, s in self.sessions.items()}


# ------------------------------------------------------------------------------ driver


@dataclass
class PredictionResult:
    """What the querier obtains, plus what the run cost.

    Attributes
    ----------
    logits : numpy.ndarray
        ``(N, O)`` sum over the included answerers of their logits.
    soft_labels : numpy.ndarray
        ``softmax(logits)`` (the paper's soft labels, computed by the querier).
    included : tuple of int
        Answerers whose predictions are in the sum.
    dropped : dict of int to str
        Answerers whose session failed, with the reason.
    transcript : Transcript
        Message sizes, views and party times.
    learned : dict of int to list
        Paper's DReLU only (with ``record_leak``): per answerer, every ``z = r x`` the querier
        learned, in protocol order (int64 ring values).
    """

    logits: NDArray[np.float64]
    soft_labels: NDArray[np.float64]
    included: tuple[int, ...]
    dropped: dict[int, str]
    transcript: Transcript
    learned: dict[int, list[NDArray[np.int64]]] = dataclasses.field(default_factory=dict)


Tamper = Callable[[str, str, int, bytes], bytes]


class _Session:
    """Runs one answerer's secure prediction, routing bytes between the three parties."""

    def __init__(
        self,
        index: int,
        config: PrivHFLConfig,
        q: QuerierSession,
        a: Answerer,
        s: ServerParty,
        transcript: Transcript,
        tamper: Tamper | None,
    ) -> None:
        self.j = index
        self.config = config
        self.q, self.a, self.s = q, a, s
        self.tr = transcript
        self.tamper = tamper
        self.name_a = f"A{index}"
        self.n = a.batch

    def send(self, sender: str, receiver: str, data: bytes) -> bytes:
        return _deliver(self.tr, self.tamper, sender, receiver, data)

    # Visitor interface --------------------------------------------------------------

    def linear(self, layer: Linear | Conv2d, index: int, shape_in: Shape, shape_out: Shape) -> None:
        geom = _linear_geometry(layer, self.n, shape_in, shape_out)
        A, S = self.name_a, "S"
        with self.tr.timed("Q"):
            deal = self.q.deal_linear(layer, geom, shape_in)
        deal = self.send("Q", S, deal)
        with self.tr.timed(A):
            e = self.a.linear_mask(layer, index, geom)
        e = self.send(A, S, e)
        with self.tr.timed(S):
            f = self.s.linear_mask(layer, geom, deal)
        f = self.send(S, A, f)
        with self.tr.timed(A):
            self.a.linear_finish(f, shape_out)
        with self.tr.timed(S):
            self.s.linear_finish(e, geom, shape_out)

    def _compare(self, n: int) -> None:
        """ReLU of the current value (``n`` elements) with the configured comparison."""
        A, S = self.name_a, "S"
        if self.config.relu == "drelu":
            with self.tr.timed("Q"):
                deal = self.q.deal_drelu(n)
            deal = self.send("Q", S, deal)
            with self.tr.timed(A):
                za = self.a.drelu_start()
            za = self.send(A, S, za)
            with self.tr.timed(S):
                zs = self.s.drelu_start(za, deal)
            zs = self.send(S, "Q", zs)
            with self.tr.timed("Q"):
                sign = self.q.drelu_answer(zs, n)
            sign = self.send("Q", S, sign)
            with self.tr.timed(A):
                ba = self.a.drelu_mask()
            ba = self.send(A, S, ba)
            with self.tr.timed(S):
                bs = self.s.drelu_mask(sign)
            bs = self.send(S, A, bs)
            with self.tr.timed(A):
                self.a.drelu_finish(bs)
            with self.tr.timed(S):
                self.s.drelu_finish(ba)
        else:
            with self.tr.timed("Q"):
                deal = self.q.deal_dcf(n)
            deal = self.send("Q", S, deal)
            with self.tr.timed(S):
                relay, os_ = self.s.dcf_start(deal)
            relay = self.send(S, A, relay)
            with self.tr.timed(A):
                oa = self.a.dcf_start(relay)
            oa = self.send(A, S, oa)
            os_ = self.send(S, A, os_)
            with self.tr.timed(A):
                self.a.dcf_finish(os_)
            with self.tr.timed(S):
                self.s.dcf_finish(oa)

    def relu(self, shape: Shape) -> None:
        self._compare(self.n * _count(shape))

    def _both(self, op: str, *args: object) -> None:
        with self.tr.timed(self.name_a):
            getattr(self.a, op)(*args)
        with self.tr.timed("S"):
            getattr(self.s, op)(*args)

    def maxpool(self, layer: MaxPool2d, shape_in: Shape, shape_out: Shape) -> None:
        self._both("pool_begin", layer.kernel_size, layer.step)
        m = layer.kernel_size**2
        while m > 1:
            self._both("pool_level_begin")
            half = m // 2
            self._compare(half * self.n * _count(shape_out))
            self._both("pool_level_end")
            m = half + m % 2
        self._both("pool_end")

    def avgpool(self, kernel: int, stride: int, shape_in: Shape, shape_out: Shape) -> None:
        self._both("avgpool", kernel, stride)

    def flatten(self, shape_in: Shape, shape_out: Shape) -> None:
        self._both("flatten")

    def residual_begin(self, shape: Shape) -> None:
        self._both("residual_begin")

    def residual_swap(self, shape: Shape) -> None:
        self._both("residual_swap")

    def residual_end(self, shape: Shape) -> None:
        self._both("residual_end")

    # --------------------------------------------------------------------------------

    def run(self, encoded: NDArray[np.uint64]) -> None:
        with self.tr.timed("Q"):
            share = self.q.share_input(encoded)
        share = self.send("Q", "S", share)
        with self.tr.timed(self.name_a):
            self.a.receive_input()
        with self.tr.timed("S"):
            self.s.receive_input(share)
        self.a.architecture.walk(self)

    def aggregate_part(self) -> NDArray[np.uint64]:
        with self.tr.timed(self.name_a):
            msg = self.a.aggregate()
        msg = self.send(self.name_a, "S", msg)
        with self.tr.timed("S"):
            return self.s.aggregate_part(msg)


def secure_predict(
    models: Sequence[SecureModel],
    queries: ArrayLike,
    config: PrivHFLConfig | None = None,
    *,
    seeds: Sequence[SessionSeeds] | None = None,
    session: int = 0,
    transcript: Transcript | None = None,
    record_leak: bool = False,
    tamper: Tamper | None = None,
) -> PredictionResult:
    """Run PrivHFL's secure querying in one process: Q's queries on every answerer's model.

    The parties exchange only bytes (every message goes through its codec and is counted in
    the transcript). Answerers may have different architectures with the same input shape and
    number of outputs. An answerer whose session fails with a
    :class:`~flwr_fsl.core.errors.ClientInputError` (a malformed message) is dropped with the
    reason and the others are aggregated.

    Parameters
    ----------
    models : sequence of SecureModel
        One per answerer.
    queries : array_like
        ``(N, *input_shape)`` float queries (NCHW for images), ``|x| <= config.max_input``.
    config : PrivHFLConfig, optional
        Settings (default: the paper's DReLU, 20 fractional bits).
    seeds : sequence of SessionSeeds, optional
        One per answerer; fresh random seeds by default.
    session : int, optional
        Session number (never reuse one with the same seeds).
    transcript : Transcript, optional
        Where to count messages (a new one by default).
    record_leak : bool, optional
        Keep the values the querier learns in the paper's DReLU (``result.learned``).
    tamper : callable, optional
        Test hook ``(sender, receiver, kind, bytes) -> bytes`` applied to every message.

    Returns
    -------
    PredictionResult
        The querier's aggregated logits and soft labels, who was included, the transcript.

    Raises
    ------
    ConfigurationError
        If the models do not fit together or a setting is invalid.
    NoAnswerError
        If every answerer's session failed.
    QuerierMessageError
        If a message the querier dealt is malformed.
    ServerMessageError
        If a message the querier received from the server is malformed.
    """
    cfg = config if config is not None else PrivHFLConfig()
    if not models:
        raise ConfigurationError("secure_predict needs at least one answerer model")
    archs = [m.architecture for m in models]
    if any(not isinstance(m, SecureModel) for m in models):
        raise ConfigurationError("every model must be a SecureModel")
    if len({a.input_shape for a in archs}) != 1 or len({a.num_outputs for a in archs}) != 1:
        raise ConfigurationError("answerers' models need one input shape and one output size")
    x = np.asarray(queries, dtype=np.float64)
    n = int(x.shape[0]) if x.ndim else 0
    if n < 1:
        raise ConfigurationError("queries must hold at least one query")
    seeds = list(seeds) if seeds is not None else [SessionSeeds.fresh() for _ in models]
    if len(seeds) != len(models):
        raise ConfigurationError(f"need one SessionSeeds per answerer, got {len(seeds)}")
    tr = transcript if transcript is not None else Transcript()
    q_sessions = {
        j: QuerierSession(cfg, archs[j], n, seeds[j], session, record_leak)
        for j in range(len(models))
    }
    querier = Querier(cfg, q_sessions)
    with tr.timed("Q"):
        encoded = querier.encode(x, archs[0])
    runs: dict[int, _Session] = {}
    dropped: dict[int, str] = {}
    for j, model in enumerate(models):
        run = _Session(
            j,
            cfg,
            q_sessions[j],
            Answerer(cfg, model, n, seeds[j], session),
            ServerParty(cfg, archs[j], n, seeds[j], session),
            tr,
            tamper,
        )
        try:
            run.run(encoded)
        except QuerierMessageError:
            raise
        except ClientInputError as err:
            dropped[j] = str(err)
            continue
        runs[j] = run
    with tr.timed("Q"):
        querier.prepare_aggregation()
    parts: dict[int, NDArray[np.uint64]] = {}
    for j, run in runs.items():
        try:
            parts[j] = run.aggregate_part()
        except ClientInputError as err:
            dropped[j] = str(err)
    if not parts:
        raise NoAnswerError(f"every answerer's session failed: {dropped}")
    step = agg_step(session)
    with tr.timed("S"):
        agg = server_aggregate(parts, step)
    agg = _deliver(tr, tamper, "S", "Q", agg)
    with tr.timed("Q"):
        logits, included = querier.finish(agg, step, (n, archs[0].num_outputs))
    learned = (
        {j: list(s.learned) for j, s in q_sessions.items() if s.learned is not None}
        if record_leak
        else {}
    )
    return PredictionResult(logits, softmax(logits), included, dropped, tr, learned)


def agg_step(session: int) -> int:
    """Return the step of the server's ``agg-S`` message (op 0: no other op uses it)."""
    return session << 32


def _deliver(
    tr: Transcript, tamper: Tamper | None, sender: str, receiver: str, data: bytes
) -> bytes:
    """Deliver one message: through the test hook, then counted in the transcript."""
    if tamper is not None:
        data = tamper(sender, receiver, data[5], data)
    try:
        tr.record(sender, receiver, data)
    except PrivHFLMessageError:
        pass  # a tampered message is still delivered: the receiver must reject it
    return data
