r"""The interactive ops of PrivHFL secure querying, step by step for each party.

The computing parties, :class:`Answerer` (party 0, holds the model) and :class:`ServerParty`
(party 1), and the querier's dealer side of one session, :class:`QuerierSession`, each have one
method per step of every op; :mod:`flwr_fsl.families.privhfl.protocol` describes the protocol
(threat model, views, limits, cost) and runs the steps in process; the messages are
:mod:`flwr_fsl.families.privhfl.wire`'s.

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

**Π_DReLU, the paper's variant** (``comparison="drelu"``; Fig. 4). ``A`` and ``S`` draw a positive
``r`` *per value* from ``Sk_SA`` (uniform in ``[1, 2^(62 - bound_bits)]``) and set ``[z]_b =
r [x]_b``; ``A -> S: [z]_0 - delta`` (``delta`` from ``Sk_QA``), ``S -> Q: [z]_0 - delta +
[z]_1``; ``Q`` adds ``delta``, reads ``z = r x`` as a signed integer (``|r x| < 2^62``: the sign
survives, and so does the exact product, whose divisors give ``|x|`` away: the leak stated in
:class:`~flwr_fsl.families.privhfl.config.PrivHFLConfig`) and sends ``S`` ``DReLU(z) -
delta'`` (``A``'s share is ``delta'`` from ``Sk_QA``). ``ReLU(x) = x * DReLU(x)`` is then one
elementwise Beaver product with a triple ``Q`` deals (:class:`~flwr_fsl.crypto.sharing.Dealer`,
:func:`~flwr_fsl.crypto.sharing.beaver_mul`).

**Leak-free comparison** (``comparison="dcf"``; Boyle et al. EUROCRYPT'21 with a bounded input).
With ``|x| < 2^l`` (``l = bound_bits``) let ``X = x + 2^l`` in ``[0, 2^(l+1))``: ``DReLU(x)`` is
bit ``l`` of ``X``. ``Q`` (the dealer) draws a mask ``r = r_0 + r_1`` with ``r_0`` from
``Sk_QA`` and ``r_1`` from ``Sk_SQ`` (no message), and deals one DCF
(:mod:`flwr_fsl.crypto.dcf`) per value on ``l`` bits with ``alpha = r mod 2^l`` and payload
``beta = (1 - 2q, r (1 - 2q))``, ``q`` = bit ``l`` of ``r``, plus shares of ``q`` and ``r q``:
``A``'s from ``Sk_QA``, ``S``'s from ``Sk_SQ`` plus a correction ``q - [q]_0 - [q]_1`` (and
the same for ``r q``) in the deal. The correction is uniform to ``A`` (it lacks ``Sk_SQ``) and
to ``S`` (it lacks ``Sk_QA``), so the one ``dcf-keys`` message serves both: ``S`` forwards
``Q``'s bytes to ``A`` unchanged (no re-encoding of the keys, ~1.3 kB per comparison).
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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto import dcf
from flwr_fsl.crypto.prg import PRGStream
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
from flwr_fsl.families.privhfl.config import PrivHFLConfig, SessionSeeds
from flwr_fsl.families.privhfl.gpu import ring_matmul
from flwr_fsl.families.privhfl.inference import (
    Architecture,
    Conv2d,
    Linear,
    SecureModel,
    Shape,
    flatten_nhwc,
    matmul_weight,
    pool_windows,
)
from flwr_fsl.families.privhfl.wire import (
    AGG_A,
    AGG_S,
    BEAVER_A,
    BEAVER_S,
    DCF_KEYS,
    DCF_OPEN_A,
    DCF_OPEN_S,
    DRELU_A,
    DRELU_Q,
    DRELU_S,
    MATMUL_A,
    MATMUL_DEAL,
    MATMUL_S,
    SHARE,
    TRIPLE_DEAL,
    Message,
    MessageBuffers,
    PrivHFLMessageError,
    QuerierMessageError,
    ServerMessageError,
    Wire,
    expect,
)
from flwr_fsl.kernels import dcf_kernels as _k
from flwr_fsl.kernels.ring import im2col_nhwc

__all__ = ["Answerer", "QuerierSession", "ServerParty", "server_aggregate"]

_U64 = np.uint64
_RING = Z2_64

TAG_MATMUL = 0x6D6D2D6C66687270  # b"prhfl-mm" little-endian
TAG_DRELU_SCALE = 0x72732D6C66687270  # b"prhfl-sr"
TAG_DRELU_MASK = 0x6D642D6C66687270  # b"prhfl-dm"
TAG_DCF_MASK = 0x6D632D6C66687270  # b"prhfl-cm"
TAG_DCF_KEYS = 0x6B632D6C66687270  # b"prhfl-ck"
TAG_AGG = 0x67612D6C66687270  # b"prhfl-ag"


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
    """``P(x)``: :func:`nhwc_patches`' words, written by one kernel pass (no padded copy)."""
    if isinstance(layer, Conv2d):
        n, h, w, _ = x.shape
        k, s, p = layer.kernel_size, layer.stride, layer.padding
        rows = n * ((h + 2 * p - k) // s + 1) * ((w + 2 * p - k) // s + 1)
        out = np.empty((rows, x.shape[3] * k * k), dtype=_U64)
        im2col_nhwc(x, k, s, p, out)
        return out
    return x


def _signed_ge0(z: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """``1{z >= 0}`` of ring elements read as signed 64-bit integers."""
    return (z.view(np.int64) >= 0).astype(_U64)


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
    buffers: MessageBuffers | None = None
    """Where large messages are built: an in-process driver's (``None``: fresh ``bytes``)."""

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
        """Return the module docstring's ReLU share (two one-pass kernels around the DCF)."""
        st = self._pending["dcf"]  # popped on success only: a refused key leaves it
        l_bits, n = self.config.bound_bits, peer_open.shape[0]
        x_hat, point, relu = (np.empty(n, _U64) for _ in range(3))
        _k.open_points(st["open"], np.ascontiguousarray(peer_open), l_bits, x_hat, point)
        try:  # A's public part was decoded unchecked: the evaluation checks it
            out = dcf.evaluate_paired(st["keys"], point)
        except dcf.DCFKeyError as err:
            raise _dcf_key_error(self.party, err) from err
        _k.relu_shares(x_hat, out, (st["r"], st["q"], st["rq"]), l_bits, self.party, relu)
        self._pending.pop("dcf")
        return relu


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

    def linear_mask(self, layer: Linear | Conv2d, index: int, geometry: tuple) -> Wire:
        """Send ``E = M + a`` (offline); remember ``a`` and ``[c]_0``."""
        label = self._next()
        _, inner, outs = geometry
        stream = self._matmul_triple_stream(label)
        a = _RING.random((inner, outs), stream)
        self._pending["matmul"] = (layer, index, geometry, stream)
        return Message(MATMUL_A, label, (_RING.add(self._weights[index][0], a),)).to_bytes(
            self.buffers
        )

    def linear_finish(self, data: Wire, shape_out: Shape) -> None:
        """``[Y]_0 = P([x]_0 + F) M - [c]_0``, truncated, plus the bias."""
        layer, index, (rows, _, outs), stream = self._pending.pop("matmul")
        msg = expect(data, MATMUL_S, self.label, [self.top.shape], sender="server")
        c0 = _RING.random((rows, outs), stream)
        x_minus_b = _RING.add(self.top, _RING.validate(msg.arrays[0], "F"))
        y = _RING.sub(ring_matmul(_patches(x_minus_b, layer), self._weights[index][0]), c0)
        y = self._truncate(y)
        bias = self._weights[index][1]
        if bias is not None:
            y = _RING.add(y, bias)
        self.stack[-1] = y.reshape(_batched(self.batch, shape_out))

    # Π_DReLU (paper)

    def drelu_start(self) -> Wire:
        """Send ``S`` the masked ``r [x]_0 - delta`` (``A -> S``)."""
        label = self._next()
        x = self.top.reshape(-1)
        n = x.shape[0]
        masks = _stream(self._dealer_seed, label, TAG_DRELU_MASK)
        delta = _RING.random((n,), masks)
        delta_prime = _RING.random((n,), masks)
        z0 = _RING.mul(self._drelu_scale(n, label), x)
        self._pending["drelu"] = delta_prime
        return Message(DRELU_A, label, (_RING.sub(z0, delta),)).to_bytes(self.buffers)

    def drelu_mask(self) -> Wire:
        """Beaver openings of ``x * DReLU(x)`` (``A``'s DReLU share is ``delta'``)."""
        x = self.top.reshape(-1)
        s0 = self._pending.pop("drelu")
        triple = self._elementwise_triple(x.shape[0], self.label)
        d, e = beaver_mask(_RING, x, s0, triple)
        self._pending["beaver"] = (d, e, triple)
        return Message(BEAVER_A, self.label, (d, e)).to_bytes(self.buffers)

    def drelu_finish(self, data: Wire) -> None:
        """``ReLU`` share from the server's openings."""
        n = self.top.size
        msg = expect(data, BEAVER_S, self.label, [(n,), (n,)], sender="server")
        out, _ = self._beaver_open(msg)
        self._pending.pop("beaver")
        self.stack[-1] = out.reshape(self.top.shape)

    # DCF comparison

    def dcf_start(self, relay: Wire) -> Wire:
        """Take the dealt DCF keys (``Q``'s ``dcf-keys``, forwarded by ``S``); open ``[x]_0 + r_0``.

        The message's two correction arrays are ``S``'s (uniform to ``A``); ``A``'s shares of
        ``r``, ``q`` and ``r q`` come from ``Sk_QA``.
        """
        label = self._next()
        x = self.top.reshape(-1)
        n = x.shape[0]
        msg = expect(relay, DCF_KEYS, label, [(n,), (n,)], blob=True, sender="server")
        keys = _dcf_keys(msg.blob_buffer(), 0, self._dealer_seed, label, n, self.config)
        stream = self._dcf_masks(n, label)
        r0 = _RING.random((n,), stream)
        q0 = _RING.random((n,), stream)
        rq0 = _RING.random((n,), stream)
        opened = _RING.add(x, r0)
        self._pending["dcf"] = {"keys": keys, "r": r0, "q": q0, "rq": rq0, "open": opened}
        return Message(DCF_OPEN_A, label, (opened,)).to_bytes(self.buffers)

    def dcf_finish(self, data: Wire) -> None:
        """Evaluate the DCF at the opened ``x + r``; this party's share of ``ReLU(x)``."""
        n = self.top.size
        msg = expect(data, DCF_OPEN_S, self.label, [(n,)], sender="server")
        self.stack[-1] = self._dcf_finish(msg.arrays[0]).reshape(self.top.shape)

    # Π_Agg

    def aggregate(self) -> Wire:
        """Send ``S`` the masked output share ``[y]_0 - r`` (``r`` from ``Sk_QA``)."""
        label = self._next()
        y = self.top
        r = _RING.random(y.shape, _stream(self._dealer_seed, label, TAG_AGG))
        return Message(AGG_A, label, (_RING.sub(y, r),)).to_bytes(self.buffers)


def _dcf_keys(
    blob: bytes | memoryview, party: int, seed: bytes, label: int, n: int, config: PrivHFLConfig
) -> dcf.DCFKeyBatch:
    try:
        return _dcf_keys_checked(blob, party, seed, label, n, config)
    except dcf.DCFKeyError as err:
        raise _dcf_key_error(party, err) from err


def _dcf_key_error(party: int, err: dcf.DCFKeyError) -> PrivHFLMessageError:
    """Return the error for a bad DCF public part (the querier's fault where ``S`` saw it)."""
    # the server got the public part from the querier directly; A got it relayed by S
    cls = QuerierMessageError if party == 1 else PrivHFLMessageError
    return cls(f"DCF public part: {err}")


def _dcf_keys_checked(
    blob: bytes | memoryview, party: int, seed: bytes, label: int, n: int, config: PrivHFLConfig
) -> dcf.DCFKeyBatch:
    """Rebuild a party's DCF keys: root seeds from its seed with ``Q``, the dealt public part.

    ``S`` checks the public part here, before it forwards the bytes to ``A`` (a bad one is
    the querier's); ``A`` defers the canonical-bit check to its evaluation of every key
    (:func:`~flwr_fsl.crypto.dcf.evaluate_paired`), which reads those words anyway.
    """
    public = dcf.DCFPublicBatch.from_bytes(blob, defer_check=party == 0)
    if (public.domain_bits, public.tau, public.num_keys) != (config.bound_bits, 2, n):
        raise dcf.DCFKeyError(
            f"must hold {n} keys on {config.bound_bits} bits with tau 2, got "
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

    def receive_input(self, data: Wire) -> None:
        """Π_Share: ``[x]_1`` from ``Q``."""
        label = self._next()
        shape = _batched(self.batch, self.architecture.internal_input_shape)
        msg = expect(data, SHARE, label, [shape], sender="querier")
        # a copy: the share outlives this step, the message (maybe a lent buffer) does not
        self.stack = [self.rand.input_share(shape, label, msg.arrays[0]).copy()]

    # Π_Matmul

    def linear_mask(self, layer: Linear | Conv2d, geometry: tuple, deal: Wire) -> Wire:
        """Take ``[c]_1`` from ``Q``; send ``F = [x]_1 - b``."""
        label = self._next()
        rows, _, outs = geometry
        msg = expect(deal, MATMUL_DEAL, label, [(rows, outs)], sender="querier")
        b = _RING.random(self.top.shape, self._matmul_triple_stream(label))
        self._pending["matmul"] = (layer, b, msg.arrays[0])
        return Message(MATMUL_S, label, (_RING.sub(self.top, b),)).to_bytes(self.buffers)

    def linear_finish(self, data: Wire, geometry: tuple, shape_out: Shape) -> None:
        """``[Y]_1 = P(b) E - [c]_1``, truncated."""
        layer, b, c1 = self._pending.pop("matmul")
        _, inner, outs = geometry
        msg = expect(data, MATMUL_A, self.label, [(inner, outs)], sender="answerer")
        y = _RING.sub(ring_matmul(_patches(b, layer), msg.arrays[0]), c1)
        self.stack[-1] = self._truncate(y).reshape(_batched(self.batch, shape_out))

    # Π_DReLU (paper)

    def drelu_start(self, data: Wire, triple_deal: Wire) -> Wire:
        """``S -> Q: [z]_0 - delta + r [x]_1``; keep the dealt triple correction."""
        label = self._next()
        x = self.top.reshape(-1)
        n = x.shape[0]
        msg = expect(data, DRELU_A, label, [(n,)], sender="answerer")
        deal = expect(triple_deal, TRIPLE_DEAL, label, [(n,)], sender="querier")
        self._pending["triple"] = self._elementwise_triple(n, label, deal.arrays[0])
        z1 = _RING.mul(self._drelu_scale(n, label), x)
        return Message(DRELU_S, label, (_RING.add(msg.arrays[0], z1),)).to_bytes(self.buffers)

    def drelu_mask(self, data: Wire) -> Wire:
        """Take ``DReLU - delta'`` from ``Q``; Beaver openings of ``x * DReLU(x)``."""
        x = self.top.reshape(-1)
        msg = expect(data, DRELU_Q, self.label, [x.shape], sender="querier")
        triple = self._pending.pop("triple")
        assert isinstance(triple, TripleShare)
        d, e = beaver_mask(_RING, x, msg.arrays[0], triple)
        self._pending["beaver"] = (d, e, triple)
        return Message(BEAVER_S, self.label, (d, e)).to_bytes(self.buffers)

    def drelu_finish(self, data: Wire) -> None:
        """``ReLU`` share from the answerer's openings."""
        n = self.top.size
        msg = expect(data, BEAVER_A, self.label, [(n,), (n,)], sender="answerer")
        out, _ = self._beaver_open(msg)
        self._pending.pop("beaver")
        self.stack[-1] = out.reshape(self.top.shape)

    # DCF comparison

    def dcf_start(self, deal: Wire) -> tuple[Wire, Wire]:
        """Take ``Q``'s ``dcf-keys``; return (the same bytes, forwarded to ``A``; the opening).

        ``S``'s shares: ``r_1``, ``[q]_1``, ``[r q]_1`` from ``Sk_SQ``, the last two plus the
        deal's corrections.
        """
        label = self._next()
        x = self.top.reshape(-1)
        n = x.shape[0]
        msg = expect(deal, DCF_KEYS, label, [(n,), (n,)], blob=True, sender="querier")
        keys = _dcf_keys(msg.blob_buffer(), 1, self._dealer_seed, label, n, self.config)
        stream = self._dcf_masks(n, label)
        r1 = _RING.random((n,), stream)
        q1 = _RING.add(_RING.random((n,), stream), _RING.validate(msg.arrays[0], "q correction"))
        rq1 = _RING.add(_RING.random((n,), stream), _RING.validate(msg.arrays[1], "rq correction"))
        opened = _RING.add(x, r1)
        self._pending["dcf"] = {"keys": keys, "r": r1, "q": q1, "rq": rq1, "open": opened}
        return deal, Message(DCF_OPEN_S, label, (opened,)).to_bytes(self.buffers)

    def dcf_finish(self, data: Wire) -> None:
        """Evaluate the DCF at the opened ``x + r``; this party's share of ``ReLU(x)``."""
        n = self.top.size
        msg = expect(data, DCF_OPEN_A, self.label, [(n,)], sender="answerer")
        self.stack[-1] = self._dcf_finish(msg.arrays[0]).reshape(self.top.shape)

    # Π_Agg

    def aggregate_part(self, data: Wire) -> NDArray[np.uint64]:
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

    Raises
    ------
    ConfigurationError
        If an argument is malformed (named).
    """

    buffers: MessageBuffers | None = None
    """Where large messages are built: an in-process driver's (``None``: fresh ``bytes``)."""

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

    def share_input(self, x_encoded: NDArray[np.uint64]) -> Wire:
        """Π_Share: ``[x]_1 = x - [x]_0`` for ``S``."""
        label = self._next()
        return Message(SHARE, label, (self.dealer.share_input(x_encoded, label),)).to_bytes(
            self.buffers
        )

    def deal_linear(self, layer: Linear | Conv2d, geometry: tuple, shape_in: Shape) -> Wire:
        """Π_Matmul triple: ``[c]_1 = P(b) a - [c]_0`` for ``S``."""
        label = self._next()
        rows, inner, outs = geometry
        a_stream = _stream(self._qa, label, TAG_MATMUL)
        a = _RING.random((inner, outs), a_stream)
        c0 = _RING.random((rows, outs), a_stream)
        b = _RING.random(_batched(self.batch, shape_in), _stream(self._sq, label, TAG_MATMUL))
        c1 = _RING.sub(ring_matmul(_patches(b, layer), a), c0)
        return Message(MATMUL_DEAL, label, (c1,)).to_bytes(self.buffers)

    def deal_drelu(self, n: int) -> Wire:
        """Deal the Beaver triple of ``x * DReLU(x)``: ``S``'s correction ``c_1``."""
        label = self._next()
        return Message(
            TRIPLE_DEAL, label, (self.dealer.triple(TripleShape.elementwise((n,)), label),)
        ).to_bytes(self.buffers)

    def drelu_answer(self, data: Wire, n: int) -> Wire:
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
        return Message(DRELU_Q, self.label, (_RING.sub(_signed_ge0(z), delta_prime),)).to_bytes(
            self.buffers
        )

    def deal_dcf(self, n: int) -> Wire:
        """``dcf-keys``: DCF keys for the mask ``r = r_0 + r_1``, corrections of ``q``, ``r q``.

        The corrections ``q - [q]_0 - [q]_1`` and ``r q - [r q]_0 - [r q]_1`` (each share from
        a seed the other evaluator lacks) are uniform to both, so ``S`` forwards this message
        to ``A`` as it is.
        """
        label = self._next()
        cfg = self.config
        l_bits = cfg.bound_bits
        a_stream = _stream(self._qa, label, TAG_DCF_MASK)
        r0 = _RING.random((n,), a_stream)
        q0 = _RING.random((n,), a_stream)
        rq0 = _RING.random((n,), a_stream)
        s_stream = _stream(self._sq, label, TAG_DCF_MASK)
        r1 = _RING.random((n,), s_stream)
        q1 = _RING.random((n,), s_stream)
        rq1 = _RING.random((n,), s_stream)
        r = _RING.add(r0, r1)
        q = (r >> _U64(l_bits)) & _U64(1)
        sign = _RING.sub(_U64(1), _RING.mul(_U64(2), q))
        betas = np.stack([sign, _RING.mul(r, sign)], axis=1)
        msk = tuple(
            _stream(s, label, TAG_DCF_KEYS).words(2).astype("<u8").tobytes()
            for s in (self._qa, self._sq)
        )
        corr = (
            _RING.sub(_RING.sub(q, q0), q1),
            _RING.sub(_RING.sub(_RING.mul(r, q), rq0), rq1),
        )

        def fill(blob: NDArray[np.uint8]) -> None:  # Gen writes the public part in place
            dcf.generate_keys_batch(
                r & _U64((1 << l_bits) - 1), betas, l_bits, master_seeds=(msk[0], msk[1]), out=blob
            )

        size = dcf.public_size(l_bits, 2, n)
        return Message(DCF_KEYS, label, corr).to_bytes_filled(size, fill, self.buffers)

    def aggregation_mask(self) -> NDArray[np.uint64]:
        """``r_j`` of Π_Agg for this session (advances the label like the other parties)."""
        label = self._next()
        shape = (self.batch, self.architecture.num_outputs)
        return _RING.random(shape, _stream(self._qa, label, TAG_AGG))
