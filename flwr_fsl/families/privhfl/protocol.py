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

The parts: the settings and seeds (:mod:`~flwr_fsl.families.privhfl.config`), the op steps of
each party with their derivations (:mod:`~flwr_fsl.families.privhfl.ops`: Π_Share, Π_Matmul,
the paper's Π_DReLU, the leak-free DCF comparison, max pooling, Π_Agg), the PHFL message
format (:mod:`~flwr_fsl.families.privhfl.wire`); this module has the querier
(:class:`Querier`) and the in-process driver :func:`secure_predict` (:class:`LocalDriver`:
its messages built in buffers it reuses), and re-exports the rest.

**Comparison: DCF by default; the paper's DReLU leaks (documented and tested).** The default
(``PrivHFLConfig().comparison == "dcf"``) compares with one distributed comparison function per
value: ``Q`` receives only ``agg-S``. With ``comparison="drelu"`` (the paper's Π_DReLU, an
explicit choice) ``Q`` learns ``z = r x`` for *every* comparison input ``x`` of the answerer's
model on ``Q``'s own query, with ``r`` uniform in ``[1, 2^(62 - bound_bits)]`` (``2^22`` by
default) and ``z`` the exact integer product (``|r x| < 2^62``, no wrap). So ``Q`` learns the
sign of every hidden pre-activation (and of every max-pool difference, i.e. which window
element is largest) and the exact zero pattern, and ``|x|`` is a divisor of ``|z|`` in
``[|z| / 2^22, |z|]``: factoring ``z`` (trial division by the primes below ``2^22``) leaves a
few dozen candidates, and the smallest is ``|x|`` to the last fixed-point unit for about a
quarter of the hidden values; a query sent three times (``r`` fresh each time) pins ``|x|`` to
within two units for about 90%. The first layer's signs are ``sign(W q + b)`` for queries
``q`` of ``Q``'s choice: a hyperplane oracle for the answerer's weights. The paper's claim
(footnote 4: "masked intermediate values, rather than plain values") does not hold.
``tests/families/privhfl/test_protocol.py`` recovers the signs exactly;
``tests/attacks/test_privhfl_drelu_factoring.py`` the magnitudes.

**Message flow** (what a transport must carry; :class:`_Session` runs it in process; ``*``
= can be sent before the query exists). Π_Share: ``Q -> S`` share. Per linear layer: ``Q -> S``
matmul-deal*, ``A -> S`` matmul-E*, ``S -> A`` matmul-F. Per comparison round, paper: ``Q -> S``
triple-deal*, ``A -> S`` drelu-z0, ``S -> Q`` drelu-z, ``Q -> S`` drelu-sign, ``A -> S``
beaver-A, ``S -> A`` beaver-S; DCF: ``Q -> S`` dcf-keys*, ``S -> A`` the same dcf-keys bytes*
(forwarded unchanged), ``A -> S`` dcf-open-A, ``S -> A`` dcf-open-S (``dcf-deal`` and
``dcf-relay``, kinds 11 and 12, are the format before issue 26: still parsed, no longer
sent). Π_Agg: ``A_j -> S`` agg-A, ``S -> Q`` agg-S. Each party's
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
ResNet-8-like 9.0 / 301 ms, 3.1 / 100 MB (figures from before ReLU moved after max pooling). At
widths 64-128-256 (229,376 comparisons with each ReLU after its max pool, 315,392 before;
``--width 64 --batches 12``, under load) the DCF takes 1.05 s and 629 MB per query (1.74 s
with session 27's code and 3.40 s before issue 26, each in one run with the new), against
PrivHFL's 1.03 s and 66.6 MB for VGG-7 (Table 3). A session holds at most :func:`max_batch`
queries (every message under 512 MiB: 6 at width 64). The DCF's cost is its keys: ``l * (17 +
8 * 2) + 16`` bytes per comparison (1336 at ``l = 40``), dealt to ``S`` and forwarded to ``A``
unchanged; Gen 1.6-2 us and evaluation 0.45-0.6 us per key and party at 40 bits (sycret's
32-bit DCF: 7.1 / 3.5 us), of which the AES calls are ~0.5 and ~0.13 us. The ring matmul is the
numba kernel (:func:`flwr_fsl.kernels.ring.matmul_wrap`): 1.1-13.6 G multiply-adds per second
on these layers, 6-13x CryptGPU's float-split trick (16-bit limbs in float64 BLAS) on this
CPU; on a GPU, :mod:`~flwr_fsl.families.privhfl.gpu` runs that trick exactly with torch.

**Errors.** A malformed message from a party raises :class:`PrivHFLMessageError` (a
:class:`~flwr_fsl.core.errors.ClientInputError`): the driver drops that answerer's session and
aggregates over the others (:func:`secure_predict`); a malformed message from ``Q``
(:class:`QuerierMessageError`) or to ``Q`` from ``S`` (:class:`ServerMessageError`, a
:class:`~flwr_fsl.core.errors.RoundFailedError`) fails the query. Bad settings raise
:class:`~flwr_fsl.core.errors.ConfigurationError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.core.wireformat import MAX_MESSAGE_BYTES
from flwr_fsl.crypto import dcf
from flwr_fsl.crypto.ring import Z2_64
from flwr_fsl.families.privhfl.config import COMPARISONS, PrivHFLConfig, SessionSeeds
from flwr_fsl.families.privhfl.inference import (
    Architecture,
    Conv2d,
    Linear,
    MaxPool2d,
    SecureModel,
    Shape,
    to_nhwc,
)

# ops and wire hold these; protocol re-exports every name it had (kinds, tags, helpers).
from flwr_fsl.families.privhfl.ops import (  # noqa: F401
    TAG_AGG,
    TAG_DCF_KEYS,
    TAG_DCF_MASK,
    TAG_DRELU_MASK,
    TAG_DRELU_SCALE,
    TAG_MATMUL,
    Answerer,
    QuerierSession,
    ServerParty,
    _batched,
    _count,
    _linear_geometry,
    _patches,
    _signed_ge0,
    _stream,
    server_aggregate,
)
from flwr_fsl.families.privhfl.wire import (  # noqa: F401
    AGG_A,
    AGG_S,
    BEAVER_A,
    BEAVER_S,
    DCF_DEAL,
    DCF_KEYS,
    DCF_OPEN_A,
    DCF_OPEN_S,
    DCF_RELAY,
    DRELU_A,
    DRELU_Q,
    DRELU_S,
    KIND_NAMES,
    MATMUL_A,
    MATMUL_DEAL,
    MATMUL_S,
    OFFLINE_KINDS,
    SHARE,
    TRIPLE_DEAL,
    Message,
    MessageBuffers,
    PrivHFLMessageError,
    QuerierMessageError,
    ServerMessageError,
    Transcript,
    Wire,
    as_bytes,
    expect,
)

__all__ = [
    "COMPARISONS",
    "KIND_NAMES",
    "Answerer",
    "LocalDriver",
    "Message",
    "MessageBuffers",
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
    "max_batch",
    "secure_predict",
    "server_aggregate",
    "softmax",
]

_U64 = np.uint64
_RING = Z2_64


class NoAnswerError(RoundFailedError):
    """Every answerer's session failed: there is nothing to aggregate."""


def softmax(logits: NDArray[np.float64]) -> NDArray[np.float64]:
    """Row-wise softmax (the querier's soft labels from the aggregated logits)."""
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


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

    def finish(self, data: Wire, step: int, shape: tuple[int, int]) -> tuple[NDArray, tuple]:
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
    """Runs one answerer's secure prediction, routing bytes between the three parties.

    Every party builds its large messages in ``buffers`` (the driver's); each op's messages
    are dead once the op has ended (the receivers keep nothing of them), so each op hands
    its buffers back at its end (:meth:`MessageBuffers.recycle`) for the next op's messages.
    """

    def __init__(
        self,
        index: int,
        config: PrivHFLConfig,
        q: QuerierSession,
        a: Answerer,
        s: ServerParty,
        transcript: Transcript,
        tamper: Tamper | None,
        buffers: MessageBuffers,
    ) -> None:
        self.j = index
        self.config = config
        self.q, self.a, self.s = q, a, s
        q.buffers = a.buffers = s.buffers = self.buffers = buffers
        self.tr = transcript
        self.tamper = tamper
        self.name_a = f"A{index}"
        self.n = a.batch

    def send(self, sender: str, receiver: str, data: Wire) -> Wire:
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
        self.buffers.recycle()  # the deal, E and F are consumed

    def _compare(self, n: int) -> None:
        """ReLU of the current value (``n`` elements) with the configured comparison."""
        A, S = self.name_a, "S"
        if self.config.comparison == "drelu":
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
        self.buffers.recycle()  # the deal (keys) and the openings are consumed

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
        self.buffers.recycle()
        self.a.architecture.walk(self)

    def aggregate_part(self) -> NDArray[np.uint64]:
        with self.tr.timed(self.name_a):
            msg = self.a.aggregate()
        msg = self.send(self.name_a, "S", msg)
        with self.tr.timed("S"):
            part = self.s.aggregate_part(msg)
        self.buffers.recycle()
        return part


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
    reason and the others are aggregated. Large messages are built in buffers the call's
    :class:`LocalDriver` lends for one op (the same bytes; one driver for many sessions keeps
    them from call to call).

    Parameters
    ----------
    models : sequence of SecureModel
        One per answerer.
    queries : array_like
        ``(N, *input_shape)`` float queries (NCHW for images), ``|x| <= config.max_input``.
    config : PrivHFLConfig, optional
        Settings (default ``PrivHFLConfig()``: the leak-free DCF comparison, 20 fractional
        bits). ``PrivHFLConfig(comparison="drelu")`` is the paper's faster comparison, which
        tells the querier ``z = r x`` of every hidden value of every answerer's model on its
        queries (sign exactly, magnitude up to a divisor of ``z``: the module docstring).
    seeds : sequence of SessionSeeds, optional
        One per answerer; fresh random seeds by default.
    session : int, optional
        Session number (never reuse one with the same seeds).
    transcript : Transcript, optional
        Where to count messages (a new one by default).
    record_leak : bool, optional
        Keep the values the querier learns with ``comparison="drelu"`` (``result.learned``;
        nothing with the DCF comparison).
    tamper : callable, optional
        Test hook ``(sender, receiver, kind, bytes) -> bytes`` applied to every message.

    Returns
    -------
    PredictionResult
        The querier's aggregated logits and soft labels, who was included, the transcript.

    Raises
    ------
    ConfigurationError
        If the models do not fit together, a setting is invalid, or there are more queries
        than :func:`max_batch` allows in one session.
    NoAnswerError
        If every answerer's session failed.
    QuerierMessageError
        If a message the querier dealt is malformed.
    ServerMessageError
        If a message the querier received from the server is malformed.
    """
    return LocalDriver().predict(
        models, queries, config, seeds=seeds, session=session, transcript=transcript,
        record_leak=record_leak, tamper=tamper,
    )  # fmt: skip


class LocalDriver:
    """The in-process driver of :func:`secure_predict`, with its message buffers.

    Its parties build their large messages in buffers the driver lends for one op and
    takes back when the op ends (:class:`~flwr_fsl.families.privhfl.wire.MessageBuffers`): no
    fresh memory, so no page faults, per message. One driver used for many sessions (a
    batch cut into sessions, as ``benchmarks/privhfl_bench.py`` does) keeps its buffers
    mapped between them; :func:`secure_predict` uses a new driver per call.

    Parameters
    ----------
    buffers : MessageBuffers, optional
        The buffers (a new :class:`~flwr_fsl.families.privhfl.wire.MessageBuffers` by default).
    """

    def __init__(self, buffers: MessageBuffers | None = None) -> None:
        self.buffers = buffers if buffers is not None else MessageBuffers()

    def predict(  # noqa: C901
        self,
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
        """Run :func:`secure_predict` (the same parameters, returns and errors) in these buffers.

        A session that fails leaves its last op's buffers lent: the next op hands them back.
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
        _check_batch(archs, cfg, n)
        seeds = list(seeds) if seeds is not None else [SessionSeeds.fresh() for _ in models]
        if len(seeds) != len(models):
            raise ConfigurationError(f"need one SessionSeeds per answerer, got {len(seeds)}")
        tr = transcript if transcript is not None else Transcript()
        q_sessions = _querier_sessions(cfg, archs, n, seeds, session, record_leak)
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
                self.buffers,
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
            agg: Wire = server_aggregate(parts, step)
        agg = _deliver(tr, tamper, "S", "Q", agg)
        with tr.timed("Q"):
            logits, included = querier.finish(agg, step, (n, archs[0].num_outputs))
        learned = (
            {j: list(s.learned) for j, s in q_sessions.items() if s.learned is not None}
            if record_leak
            else {}
        )
        return PredictionResult(logits, softmax(logits), included, dropped, tr, learned)


def _querier_sessions(
    cfg: PrivHFLConfig,
    archs: Sequence[Architecture],
    n: int,
    seeds: Sequence[SessionSeeds],
    session: int,
    record_leak: bool,
) -> dict[int, QuerierSession]:
    """Return the querier's sessions, one per answerer.

    Each DCF deal's keys are generated straight into the message that carries them
    (``QuerierSession.deal_dcf``): no buffer is kept between deals.
    """
    return {
        j: QuerierSession(cfg, arch, n, seeds[j], session, record_leak)
        for j, arch in enumerate(archs)
    }


def _check_batch(archs: Sequence[Architecture], cfg: PrivHFLConfig, n: int) -> None:
    """Refuse more queries than one session's messages can carry (before any work)."""
    largest = min(max_batch(a, cfg) for a in archs)
    if n > largest:
        raise ConfigurationError(
            f"{n} queries exceed this session's largest batch {largest} (a message would pass "
            f"the {MAX_MESSAGE_BYTES}-byte limit): split them into sessions (max_batch)"
        )


def agg_step(session: int) -> int:
    """Return the step of the server's ``agg-S`` message (op 0: no other op uses it)."""
    return session << 32


def _deliver(tr: Transcript, tamper: Tamper | None, sender: str, receiver: str, data: Wire) -> Wire:
    """Deliver one message: through the test hook (given ``bytes``), then counted."""
    if tamper is not None:
        data = tamper(sender, receiver, data[5], as_bytes(data))
    try:
        tr.record(sender, receiver, data)
    except PrivHFLMessageError:
        pass  # a tampered message is still delivered: the receiver must reject it
    return data


# ------------------------------------------------------------------------- message sizes

_MESSAGE_OVERHEAD = 4096  # headers of a message and of its arrays and DCF part, generously


class _Sizer:
    """Largest per-query and fixed byte counts of any one message of a session."""

    def __init__(self, config: PrivHFLConfig) -> None:
        self.config = config
        self.per_query = 0  # bytes per query of the largest batch-dependent message
        self.fixed = 0  # largest message that does not grow with the batch (E = M + a)

    def _msg(self, per_query: int) -> None:
        self.per_query = max(self.per_query, per_query)

    def linear(self, layer: Linear | Conv2d, index: int, shape_in: Shape, shape_out: Shape) -> None:
        rows, inner, outs = _linear_geometry(layer, 1, shape_in, shape_out)
        self._msg(8 * rows * outs)  # matmul-deal: [c]_1
        self._msg(8 * int(np.prod(shape_in)))  # matmul-F
        self.fixed = max(self.fixed, 8 * inner * outs)  # matmul-E

    def _compare(self, count: int) -> None:
        if self.config.comparison == "dcf":
            per_key = dcf.public_size(self.config.bound_bits, 2, 2) - dcf.public_size(
                self.config.bound_bits, 2, 1
            )
            self._msg(count * (16 + per_key))  # dcf-keys: two correction words and the key
        else:
            self._msg(count * 16)  # beaver openings: two words

    def relu(self, shape: Shape) -> None:
        self._compare(int(np.prod(shape)))

    def maxpool(self, layer: MaxPool2d, shape_in: Shape, shape_out: Shape) -> None:
        self._compare((layer.kernel_size**2 // 2) * int(np.prod(shape_out)))

    def avgpool(self, kernel: int, stride: int, shape_in: Shape, shape_out: Shape) -> None:
        pass

    def flatten(self, shape_in: Shape, shape_out: Shape) -> None:
        pass

    def residual_begin(self, shape: Shape) -> None:
        pass

    def residual_swap(self, shape: Shape) -> None:
        pass

    def residual_end(self, shape: Shape) -> None:
        pass


def max_batch(
    architecture: Architecture,
    config: PrivHFLConfig | None = None,
    limit: int = MAX_MESSAGE_BYTES,
) -> int:
    """Largest number of queries per session whose every message stays under ``limit`` bytes.

    The batch-dependent messages are the input share, each linear layer's ``[c]_1`` and
    ``F``, and each comparison round's deal (DCF: ``l (17 + 16) + 32`` bytes per comparison,
    1352 at ``l = 40``; the paper's DReLU: the two Beaver openings, 16 bytes). Drivers cut
    a larger batch into sessions of at most this size (``benchmarks/privhfl_bench.py`` does
    by default).

    Parameters
    ----------
    architecture : Architecture
        The answerer's public architecture.
    config : PrivHFLConfig, optional
        Settings (the comparison and ``bound_bits`` size the deals).
    limit : int, optional
        The message size limit (default the wire format's 512 MiB).

    Returns
    -------
    int
        The batch size, at least 1.

    Raises
    ------
    ConfigurationError
        If even one query, or the masked weights of a layer, exceed ``limit``.
    """
    cfg = config if config is not None else PrivHFLConfig()
    if not isinstance(architecture, Architecture):
        raise ConfigurationError("architecture must be an Architecture")
    sizer = _Sizer(cfg)
    sizer._msg(8 * int(np.prod(architecture.input_shape)))  # the input share
    architecture.walk(sizer)
    room = int(limit) - _MESSAGE_OVERHEAD
    if sizer.fixed > room or sizer.per_query > room:
        raise ConfigurationError(
            f"one query of this architecture needs a message of "
            f"{max(sizer.fixed, sizer.per_query)} bytes, over the {limit}-byte limit"
        )
    return max(1, room // max(sizer.per_query, 1))
