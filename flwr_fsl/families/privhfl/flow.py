"""PrivHFL secure answering over a message transport: wire formats, schedule and party state.

:mod:`flwr_fsl.families.privhfl.protocol` runs the three parties in one process (:func:`~flwr_fsl.
protocols.privhfl.secure_predict`). Over Flower a client may not survive between messages and
the server talks to one client per message, so this module adds what a transport needs
(Flower-free; the server and the clients of the secure arm in
:mod:`flwr_fsl.families.privhfl.server` / :mod:`flwr_fsl.families.privhfl.client` use it):

* **Architecture codec** (:func:`architecture_to_bytes`, :func:`architecture_from_bytes`):
  an answerer advertises its public layer structure; the querier and the server need it.
  ``b"PHAR"``, version ``u8`` 1, input ndim ``u8`` and dims ``u32``, then the layer list: a
  count ``u32`` and per layer a tag ``u8`` with its fields (``u32`` sizes, ``u8`` flags; a
  residual block holds two nested lists, at most :data:`MAX_DEPTH` deep). Strict: unknown
  tags, trailing bytes, shapes that do not chain raise
  :class:`~flwr_fsl.core.wireformat.WireFormatError`.
* **Schedule** (:func:`schedule`): the architecture's walk cut into *steps*; each step is one
  interactive op (a linear layer or one batched comparison) followed by the local ops up to
  the next one. Step ``k`` is one server -> answerer message (the server's half of the op) and
  its reply (the answerer's half); the server finishes the op with the reply
  (:class:`ServerSession`). The answerer never holds a half-done op between messages.
  DCF comparison: the querier is offline from the deals to Π_Agg. The paper's DReLU
  (``comparison="drelu"``) needs ``Q`` inside every comparison: the answerer's reply to step ``k-1``
  carries its first messages of comparison ``k`` (``drelu-z0``, ``beaver-A``: they need
  nothing from ``S``; the answerer re-derives them from its seeds at step ``k``), the server
  sends ``Q`` ``drelu-z`` and gets ``Q``'s sign share (:func:`querier_sign`: here ``Q`` learns
  ``r x``, the documented leak), then sends ``A`` its Beaver openings as step ``k``. An
  architecture whose first interactive op is a comparison is refused for DReLU.
* **Querier's deals** (:func:`querier_messages`): every message ``Q`` sends ``S`` for one
  session — the input share and one deal per step — can be made at once, before any answerer
  acts; :class:`QuerierDeals` makes them one at a time, their sizes known in advance.
* **Answerer state** (:class:`AnswererState`): what an answerer keeps between messages, as
  strict bytes (``b"PHAS"`` v1): session, op counter, next step, batch, the two seeds it
  holds, its share stack and a max-pool level's pending halves. Its weights are not in it
  (the mod rebuilds them from the stored model).

**Threat model** as in :mod:`flwr_fsl.families.privhfl.protocol`; nothing here changes a view.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto import dcf
from flwr_fsl.crypto.prg import SEED_BYTES
from flwr_fsl.families.privhfl.config import PrivHFLConfig, SessionSeeds
from flwr_fsl.families.privhfl.inference import (
    Architecture,
    AvgPool2d,
    Conv2d,
    Flatten,
    GlobalAvgPool,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    Residual,
    SecureModel,
    Shape,
)
from flwr_fsl.families.privhfl.ops import Answerer, QuerierSession, ServerParty, _linear_geometry
from flwr_fsl.families.privhfl.wire import (
    PrivHFLMessageError,
    QuerierMessageError,
    as_bytes,
    message_size,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_LAYERS",
    "AnswererState",
    "QuerierDeals",
    "ServerSession",
    "Step",
    "answerer_open",
    "answerer_step",
    "architecture_from_bytes",
    "architecture_to_bytes",
    "querier_messages",
    "querier_session",
    "querier_sign",
    "schedule",
    "unheld_seed",
]

_ARCH_MAGIC = register_magic(b"PHAR", "PrivHFL architecture (flwr_fsl.families.privhfl.flow)")
_STATE_MAGIC = register_magic(b"PHAS", "PrivHFL answerer state (flwr_fsl.families.privhfl.flow)")
_VERSION = 1
MAX_DEPTH = 8
"""Most nested residual levels in an architecture on the wire."""
MAX_LAYERS = 4096
"""Most layers in one layer list on the wire."""
_MAX_DIM = 1 << 20
_U64 = np.uint64

_TAGS = {
    Linear: 1,
    Conv2d: 2,
    ReLU: 3,
    MaxPool2d: 4,
    AvgPool2d: 5,
    GlobalAvgPool: 6,
    Flatten: 7,
    Residual: 8,
}


# ----------------------------------------------------------------------- architecture codec


def _write_layers(w: Writer, layers: tuple[Layer, ...], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise WireFormatError(f"residual blocks nested deeper than {MAX_DEPTH}")
    w.u32(len(layers))
    for layer in layers:
        tag = _TAGS.get(type(layer))
        if tag is None:
            raise WireFormatError(f"layer {type(layer).__name__} has no wire form")
        w.u8(tag)
        if isinstance(layer, Linear):
            w.u32(layer.in_features)
            w.u32(layer.out_features)
            w.u8(int(layer.bias))
        elif isinstance(layer, Conv2d):
            for v in (layer.in_channels, layer.out_channels, layer.kernel_size):
                w.u32(v)
            w.u32(layer.stride)
            w.u32(layer.padding)
            w.u8(int(layer.bias))
        elif isinstance(layer, MaxPool2d | AvgPool2d):
            w.u32(layer.kernel_size)
            w.u32(0 if layer.stride is None else layer.stride)
        elif isinstance(layer, Residual):
            _write_layers(w, layer.body, depth + 1)
            _write_layers(w, layer.shortcut, depth + 1)


def architecture_to_bytes(architecture: Architecture) -> bytes:
    """Encode a public architecture (module docstring).

    Raises
    ------
    ConfigurationError
        If ``architecture`` is not an :class:`Architecture`.
    WireFormatError
        If it holds a layer without a wire form or nests too deep.
    """
    if not isinstance(architecture, Architecture):
        raise ConfigurationError("architecture must be an Architecture")
    w = Writer()
    w.parts = [_ARCH_MAGIC, bytes([_VERSION])]
    w.u8(len(architecture.input_shape))
    for d in architecture.input_shape:
        w.u32(d)
    _write_layers(w, architecture.layers, 0)
    return w.payload()


def _dim(r: Reader, what: str, low: int = 1) -> int:
    v = r.u32(what)
    if not low <= v <= _MAX_DIM:
        raise WireFormatError(f"{what} must be in [{low}, {_MAX_DIM}], got {v}")
    return v


def _flag(r: Reader, what: str) -> bool:
    v = r.u8(what)
    if v > 1:
        raise WireFormatError(f"{what} must be 0 or 1, got {v}")
    return bool(v)


def _read_layers(r: Reader, depth: int) -> tuple[Layer, ...]:  # noqa: C901
    if depth > MAX_DEPTH:
        raise WireFormatError(f"residual blocks nested deeper than {MAX_DEPTH}")
    n = r.u32("layer count")
    if n > MAX_LAYERS:
        raise WireFormatError(f"{n} layers exceed the limit of {MAX_LAYERS}")
    out: list[Layer] = []
    for _ in range(n):
        tag = r.u8("layer tag")
        layer: Layer
        if tag == 1:
            layer = Linear(_dim(r, "in_features"), _dim(r, "out_features"), _flag(r, "bias"))
        elif tag == 2:
            c_in, c_out, k = (_dim(r, name) for name in ("in", "out", "kernel"))
            layer = Conv2d(
                c_in, c_out, k, _dim(r, "stride"), _dim(r, "padding", 0), _flag(r, "bias")
            )
        elif tag == 3:
            layer = ReLU()
        elif tag in (4, 5):
            k = _dim(r, "kernel")
            s = _dim(r, "stride", 0)
            cls = MaxPool2d if tag == 4 else AvgPool2d
            layer = cls(k, None if s == 0 else s)
        elif tag == 6:
            layer = GlobalAvgPool()
        elif tag == 7:
            layer = Flatten()
        elif tag == 8:
            body = _read_layers(r, depth + 1)
            layer = Residual(body, _read_layers(r, depth + 1))
        else:
            raise WireFormatError(f"unknown layer tag {tag}")
        out.append(layer)
    return tuple(out)


def architecture_from_bytes(data: object) -> Architecture:
    """Decode :func:`architecture_to_bytes` strictly.

    Raises
    ------
    WireFormatError
        If the bytes are malformed (magic, version, tags, ranges, trailing bytes) or the
        layers do not form a valid architecture.
    """
    r = Reader.versioned(data, _ARCH_MAGIC, _VERSION, "a PrivHFL architecture")
    ndim = r.u8("input ndim")
    if ndim not in (1, 3):
        raise WireFormatError(f"input must have 1 or 3 dimensions, got {ndim}")
    shape = tuple(_dim(r, "input dim") for _ in range(ndim))
    try:
        layers = _read_layers(r, 0)
        r.done()
        return Architecture(shape, layers)
    except ConfigurationError as err:
        raise WireFormatError(f"invalid architecture: {err}") from err


# ----------------------------------------------------------------------------- schedule


@dataclass(frozen=True)
class Step:
    """One interactive op and the local ops that follow it.

    Attributes
    ----------
    kind : str
        ``"linear"`` or ``"compare"`` (``"start"`` for step 0: Π_Share, no interactive op).
    args : tuple
        ``(layer, index, shape_in, shape_out)`` for a linear layer, ``(n,)`` for a comparison.
    local : tuple
        ``(method name, args)`` of the local ops after it, in order.
    """

    kind: Literal["start", "linear", "compare"]
    args: tuple = ()
    local: tuple[tuple[str, tuple], ...] = ()


class _Recorder:
    def __init__(self, batch: int) -> None:
        self.n = batch
        self.steps: list[tuple[str, tuple, list[tuple[str, tuple]]]] = [("start", (), [])]

    def _local(self, name: str, *args: object) -> None:
        self.steps[-1][2].append((name, args))

    def linear(self, layer: Linear | Conv2d, index: int, shape_in: Shape, shape_out: Shape) -> None:
        self.steps.append(("linear", (layer, index, shape_in, shape_out), []))

    def relu(self, shape: Shape) -> None:
        self.steps.append(("compare", (self.n * math.prod(shape),), []))

    def maxpool(self, layer: MaxPool2d, shape_in: Shape, shape_out: Shape) -> None:
        self._local("pool_begin", layer.kernel_size, layer.step)
        m = layer.kernel_size**2
        while m > 1:
            self._local("pool_level_begin")
            half = m // 2
            self.steps.append(("compare", (half * self.n * math.prod(shape_out),), []))
            self._local("pool_level_end")
            m = half + m % 2
        self._local("pool_end")

    def avgpool(self, kernel: int, stride: int, shape_in: Shape, shape_out: Shape) -> None:
        self._local("avgpool", kernel, stride)

    def flatten(self, shape_in: Shape, shape_out: Shape) -> None:
        self._local("flatten")

    def residual_begin(self, shape: Shape) -> None:
        self._local("residual_begin")

    def residual_swap(self, shape: Shape) -> None:
        self._local("residual_swap")

    def residual_end(self, shape: Shape) -> None:
        self._local("residual_end")


def schedule(architecture: Architecture, batch: int) -> tuple[Step, ...]:
    """Cut the secure evaluation of ``architecture`` on ``batch`` queries into steps.

    Step 0 is Π_Share and the local ops before the first interactive op; every later step is
    one interactive op (in the order of :class:`~flwr_fsl.families.privhfl.protocol` ``_Session``)
    and the local ops after it; the last step's reply carries Π_Agg.

    Raises
    ------
    ConfigurationError
        If ``batch`` is not positive or the architecture has no interactive op (nothing to
        carry the answerer's Π_Agg message).
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigurationError(f"batch must be a positive integer, got {batch!r}")
    rec = _Recorder(batch)
    architecture.walk(rec)
    if len(rec.steps) == 1:
        raise ConfigurationError("the flow needs an architecture with a linear layer or a ReLU")
    return tuple(Step(k, a, tuple(loc)) for k, a, loc in rec.steps)  # type: ignore[arg-type]


def _geometry(step: Step, batch: int) -> tuple:
    layer, _, shape_in, shape_out = step.args
    return _linear_geometry(layer, batch, shape_in, shape_out)


def _check_flow(config: PrivHFLConfig, steps: tuple[Step, ...]) -> None:
    if not isinstance(config, PrivHFLConfig):
        raise ConfigurationError("config must be a PrivHFLConfig")
    if config.comparison == "drelu" and steps[1].kind == "compare":
        raise ConfigurationError(
            "the paper's DReLU over messages needs a linear layer before the first comparison"
        )


def _drelu_compare(config: PrivHFLConfig, step: Step) -> bool:
    return config.comparison == "drelu" and step.kind == "compare"


class QuerierDeals:
    """Everything ``Q`` sends ``S`` for one session, made one message at a time.

    Iterating yields the input share, then the deal of each step (:func:`querier_messages`'
    list, in order; one pass: the dealer's op counter advances). :attr:`sizes` are the
    messages' lengths, known before any is made, so a reply can be sized in advance and each
    message written into it and dropped as it comes
    (:func:`~flwr_fsl.families.privhfl.messages.encode_generate_reply`): the session's deals,
    ~1.3 kB per comparison, are never all in memory next to the reply.

    Parameters
    ----------
    config, architecture, encoded, seeds, session
        As for :func:`querier_messages`.

    Attributes
    ----------
    sizes : tuple of int
        The length of each message, in order.
    ops : int or None
        The querier's op count before Π_Agg (for :func:`querier_session`), once every
        message is made.

    Raises
    ------
    ConfigurationError
        If the settings do not fit the flow.
    """

    def __init__(
        self,
        config: PrivHFLConfig,
        architecture: Architecture,
        encoded: NDArray[np.uint64],
        seeds: SessionSeeds,
        session: int,
    ) -> None:
        batch = int(encoded.shape[0])
        self.steps = schedule(architecture, batch)
        _check_flow(config, self.steps)
        self._q = QuerierSession(config, architecture, batch, seeds, session)
        self._encoded = encoded
        self._started = False
        self.ops: int | None = None
        shape = (batch, *architecture.internal_input_shape)
        sizes = [message_size([shape])]
        for step in self.steps[1:]:
            if step.kind == "linear":
                rows, _, outs = _geometry(step, batch)
                sizes.append(message_size([(rows, outs)]))
            elif config.comparison == "dcf":
                n = step.args[0]
                sizes.append(message_size([(n,), (n,)], dcf.public_size(config.bound_bits, 2, n)))
            else:
                sizes.append(message_size([(step.args[0],)]))
        self.sizes: tuple[int, ...] = tuple(sizes)

    def __iter__(self) -> Iterator[bytes]:
        """Yield the share, then one deal per step (once)."""
        if self._started:
            raise ConfigurationError("a session's deals are made once")
        self._started = True
        q, batch = self._q, int(self._encoded.shape[0])
        yield as_bytes(q.share_input(self._encoded))
        for step in self.steps[1:]:
            if step.kind == "linear":
                yield as_bytes(q.deal_linear(step.args[0], _geometry(step, batch), step.args[2]))
            elif q.config.comparison == "dcf":
                yield as_bytes(q.deal_dcf(step.args[0]))
            else:
                yield as_bytes(q.deal_drelu(step.args[0]))
        self.ops = q._op


def querier_messages(
    config: PrivHFLConfig,
    architecture: Architecture,
    encoded: NDArray[np.uint64],
    seeds: SessionSeeds,
    session: int,
) -> tuple[list[bytes], int]:
    """Everything ``Q`` sends ``S`` for one session: the share, then one deal per step.

    All at once (:class:`QuerierDeals` makes them one at a time).

    Parameters
    ----------
    config : PrivHFLConfig
        Settings (``comparison="dcf"``).
    architecture : Architecture
        The answerer's architecture.
    encoded : numpy.ndarray
        The encoded queries (:meth:`~flwr_fsl.families.privhfl.protocol.Querier.encode`).
    seeds, session
        The session's seeds and number.

    Returns
    -------
    tuple
        ``(messages, ops)``: message ``0`` is the input share, message ``k`` the deal of step
        ``k``; ``ops`` is the querier's op count before Π_Agg (for :func:`querier_session`).
    """
    deals = QuerierDeals(config, architecture, encoded, seeds, session)
    out = list(deals)
    assert deals.ops is not None
    return out, deals.ops


def querier_sign(
    config: PrivHFLConfig,
    architecture: Architecture,
    batch: int,
    seeds: SessionSeeds,
    session: int,
    k: int,
    data: bytes,
) -> bytes:
    """Paper's DReLU: ``Q`` opens ``z = r x`` of step ``k`` (the leak) and returns its sign share.

    Raises
    ------
    ConfigurationError
        If step ``k`` is not a comparison of the paper's DReLU.
    ServerMessageError
        If ``data`` is not the server's ``drelu-z`` message of step ``k``.
    """
    steps = schedule(architecture, batch)
    if not (isinstance(k, int) and 1 <= k < len(steps) and _drelu_compare(config, steps[k])):
        raise ConfigurationError(f"step {k} is not a DReLU comparison")
    q = querier_session(config, architecture, batch, seeds, session, k + 1)
    return as_bytes(q.drelu_answer(data, steps[k].args[0]))


def querier_session(
    config: PrivHFLConfig,
    architecture: Architecture,
    batch: int,
    seeds: SessionSeeds,
    session: int,
    ops: int,
) -> QuerierSession:
    """Rebuild ``Q``'s session after ``ops`` ops (to draw its Π_Agg mask)."""
    q = QuerierSession(config, architecture, batch, seeds, session)
    if isinstance(ops, bool) or not isinstance(ops, int) or not 0 <= ops < 2**32:
        raise ConfigurationError("ops must be an integer in [0, 2^32)")
    q._op = ops
    return q


# --------------------------------------------------------------------------- server side


def _run_local(party: Answerer | ServerParty, step: Step) -> None:
    for name, args in step.local:
        getattr(party, name)(*args)


class ServerSession:
    """``S``'s side of one answerer's session, driven step by step by the transport.

    Parameters
    ----------
    config : PrivHFLConfig
        Settings.
    architecture : Architecture
        The answerer's architecture.
    batch : int
        Number of queries.
    seeds : SessionSeeds
        ``S`` uses ``Sk_SQ`` and ``Sk_SA`` (:func:`unheld_seed` for ``Sk_QA``).
    session : int
        Session number.
    messages : sequence of bytes
        ``Q``'s messages (:func:`querier_messages`): the share, one deal per step.

    Raises
    ------
    ConfigurationError
        If the settings do not fit the flow.
    QuerierMessageError
        If the number of messages is wrong or the share is malformed.
    """

    def __init__(
        self,
        config: PrivHFLConfig,
        architecture: Architecture,
        batch: int,
        seeds: SessionSeeds,
        session: int,
        messages: tuple[bytes, ...] | list[bytes],
    ) -> None:
        self.config = config
        self.steps = schedule(architecture, batch)
        _check_flow(config, self.steps)
        if len(messages) != len(self.steps):
            raise QuerierMessageError(f"expected {len(self.steps)} querier messages")
        self.party = ServerParty(config, architecture, batch, seeds, session)
        self.messages = tuple(messages)
        self.party.receive_input(self.messages[0])
        _run_local(self.party, self.steps[0])
        self._start: tuple[bytes, bytes] | None = None
        self.part: NDArray[np.uint64] | None = None

    @property
    def batch(self) -> int:
        """Number of queries."""
        return self.party.batch

    def needs_querier(self, k: int) -> bool:
        """Whether step ``k`` goes through ``Q`` (a comparison of the paper's DReLU)."""
        return _drelu_compare(self.config, self.steps[k])

    def to_querier(self, k: int) -> bytes:
        """Paper's DReLU: ``S -> Q: [z]_0 - delta + r [x]_1`` (``A`` sent its part at ``k-1``)."""
        if not self.needs_querier(k) or self._start is None:
            raise ConfigurationError(f"step {k} has no message for the querier")
        return as_bytes(self.party.drelu_start(self._start[0], self.messages[k]))

    def to_answerer(self, k: int, sign: bytes | None = None) -> bytes:
        """``S``'s half of step ``k`` for ``A`` (paper's DReLU: with ``Q``'s sign share)."""
        step = self.steps[k]
        if step.kind == "linear":
            return as_bytes(
                self.party.linear_mask(step.args[0], _geometry(step, self.batch), self.messages[k])
            )
        if self.config.comparison == "drelu":
            if sign is None:
                raise ConfigurationError(f"step {k} needs the querier's sign share")
            return as_bytes(self.party.drelu_mask(sign))
        relay, opening = self.party.dcf_start(self.messages[k])
        w = Writer()
        w.raw(as_bytes(relay))
        w.raw(as_bytes(opening))
        return w.payload()

    def from_answerer(self, k: int, reply: bytes) -> None:
        """Finish step ``k`` with ``A``'s reply (after the last: :attr:`part`, ``S``'s Π_Agg)."""
        step = self.steps[k]
        if not isinstance(reply, bytes | bytearray) or step.kind == "start":
            raise PrivHFLMessageError("an answerer reply must be bytes for steps >= 1")
        r = Reader(bytes(reply), 0)
        try:
            msg = r.raw("answerer message")
            last = k == len(self.steps) - 1
            agg = r.raw("aggregation message") if last else None
            nxt = None
            if not last and _drelu_compare(self.config, self.steps[k + 1]):
                nxt = (r.raw("drelu-z0"), r.raw("beaver-A"))
            r.done()
        except WireFormatError as err:
            raise PrivHFLMessageError(f"answerer reply: {err}") from err
        if step.kind == "linear":
            self.party.linear_finish(msg, _geometry(step, self.batch), step.args[3])
        elif self.config.comparison == "dcf":
            self.party.dcf_finish(msg)
        else:
            if self._start is None:
                raise PrivHFLMessageError("no DReLU openings of the answerer for this step")
            self.party.drelu_finish(self._start[1])
        _run_local(self.party, step)
        self._start = nxt
        if agg is not None:
            self.part = self.party.aggregate_part(agg)


# ------------------------------------------------------------------------- answerer side


@dataclass
class AnswererState:
    """An answerer's session between messages (module docstring for the wire format).

    Attributes
    ----------
    session : int
        Session number.
    batch : int
        Number of queries.
    next_step : int
        The step the next server message is for.
    op : int
        The answerer's op counter.
    querier_answerer, server_answerer : bytes
        The seeds it holds (``Sk_QA``, ``Sk_SA``).
    stack : list of numpy.ndarray
        Its share stack.
    pool : tuple of numpy.ndarray, optional
        A max-pool level's pending ``(right, rest)``.
    """

    session: int
    batch: int
    next_step: int
    op: int
    querier_answerer: bytes = field(repr=False)
    server_answerer: bytes = field(repr=False)
    stack: list[NDArray[np.uint64]] = field(default_factory=list, repr=False)
    pool: tuple[NDArray[np.uint64], NDArray[np.uint64]] | None = field(default=None, repr=False)

    def to_bytes(self) -> bytes:
        """Encode (``b"PHAS"`` v1)."""
        w = Writer()
        w.parts = [_STATE_MAGIC, bytes([_VERSION])]
        w.u32(self.session)
        w.u32(self.batch)
        w.u32(self.next_step)
        w.u64(self.op)
        w.fixed(self.querier_answerer, SEED_BYTES)
        w.fixed(self.server_answerer, SEED_BYTES)
        arrays = list(self.stack) + (list(self.pool) if self.pool is not None else [])
        w.u8(len(self.stack))
        w.u8(0 if self.pool is None else 1)
        for a in arrays:
            w.ids(list(a.shape))
            w.array(np.ascontiguousarray(a, dtype=_U64).reshape(-1))
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> AnswererState:
        """Decode :meth:`to_bytes` strictly (:class:`~flwr_fsl.core.wireformat.WireFormatError`)."""
        r = Reader.versioned(data, _STATE_MAGIC, _VERSION, "a PrivHFL answerer state")
        session, batch, next_step = r.u32("session"), r.u32("batch"), r.u32("next step")
        op = r.u64("op")
        qa = r.fixed(SEED_BYTES, "Sk_QA")
        sa = r.fixed(SEED_BYTES, "Sk_SA")
        depth = r.u8("stack depth")
        has_pool = _flag(r, "pool flag")
        if depth > 16 or batch < 1:
            raise WireFormatError("answerer state: bad stack depth or batch")
        arrays = []
        for _ in range(depth + 2 * has_pool):
            shape = r.ids("shape")
            if len(shape) > 5 or any(d > _MAX_DIM for d in shape):
                raise WireFormatError("answerer state: more than 5 dimensions or one too large")
            flat = r.array_u64("share")
            if flat.ndim != 1 or flat.size != math.prod(shape):
                raise WireFormatError("answerer state: array size does not match its shape")
            try:  # numpy refuses shapes whose non-zero dimensions multiply too far
                arrays.append(flat.reshape(shape))
            except ValueError as err:
                raise WireFormatError(f"answerer state: impossible array shape: {err}") from err
        r.done()
        pool = (arrays[depth], arrays[depth + 1]) if has_pool else None
        return cls(session, batch, next_step, op, qa, sa, arrays[:depth], pool)


def unheld_seed(first: bytes, second: bytes) -> bytes:
    """Return a stand-in for the session seed a party does not hold (never read by it).

    :class:`~flwr_fsl.families.privhfl.protocol.SessionSeeds` wants all three seeds, distinct; the
    stand-in is a hash of the two held ones, so it differs from both.
    """
    return hashlib.sha256(b"privhfl-unheld-seed" + first + second).digest()[:SEED_BYTES]


def answerer_open(
    config: PrivHFLConfig,
    model: SecureModel,
    batch: int,
    querier_answerer: bytes,
    server_answerer: bytes,
    session: int,
) -> AnswererState:
    """Start ``A``'s session (step 0: Π_Share and the local ops before the first op)."""
    steps = schedule(model.architecture, batch)
    _check_flow(config, steps)
    seeds = SessionSeeds(
        querier_answerer, server_answerer, unheld_seed(querier_answerer, server_answerer)
    )
    a = Answerer(config, model, batch, seeds, session)
    a.receive_input()
    _run_local(a, steps[0])
    return AnswererState(
        session, batch, 1, a._op, querier_answerer, server_answerer, a.stack,
        a._pending.get("pool"),
    )  # fmt: skip


def answerer_step(
    config: PrivHFLConfig, model: SecureModel, state: AnswererState, k: int, data: bytes
) -> tuple[AnswererState, bytes]:
    """``A``'s half of step ``k`` from ``S``'s bytes; returns the new state and the reply.

    Raises
    ------
    PrivHFLMessageError
        If ``data`` is malformed or for another step (a :class:`ClientInputError`).
    """
    steps = schedule(model.architecture, state.batch)
    _check_flow(config, steps)
    if k != state.next_step or not 1 <= k < len(steps):
        raise PrivHFLMessageError(f"step {k} is not the expected step {state.next_step}")
    seeds = SessionSeeds(
        state.querier_answerer,
        state.server_answerer,
        unheld_seed(state.querier_answerer, state.server_answerer),
    )
    a = Answerer(config, model, state.batch, seeds, state.session)
    a._op = state.op
    a.stack = list(state.stack)
    if state.pool is not None:
        a._pending["pool"] = state.pool
    step = steps[k]
    if step.kind == "linear":
        reply = a.linear_mask(step.args[0], step.args[1], _geometry(step, state.batch))
        a.linear_finish(data, step.args[3])
    elif config.comparison == "drelu":
        a.drelu_start()  # what step k-1's reply carried, re-derived from the seeds
        a.drelu_mask()
        a.drelu_finish(data)
        reply = b""
    else:
        try:
            r = Reader(bytes(data), 0)
            relay, opening = r.raw("relay"), r.raw("opening")
            r.done()
        except (WireFormatError, TypeError) as err:
            raise PrivHFLMessageError(f"comparison message: {err}") from err
        reply = a.dcf_start(relay)
        a.dcf_finish(opening)
    _run_local(a, step)
    w = Writer()
    w.raw(as_bytes(reply))
    pool = a._pending.get("pool")
    new = AnswererState(
        state.session, state.batch, k + 1, a._op, state.querier_answerer,
        state.server_answerer, list(a.stack), pool,
    )  # fmt: skip
    if k == len(steps) - 1:
        w.raw(as_bytes(a.aggregate()))
    elif _drelu_compare(config, steps[k + 1]):
        # Paper's DReLU: A's first messages of the next comparison need no input from S.
        w.raw(as_bytes(a.drelu_start()))
        w.raw(as_bytes(a.drelu_mask()))
    return new, w.payload()
