"""Reply faults for :class:`~flwr_fsl.testing.grid.InProcessGrid`: one faulty node, one fault class.

The fault-injection tests of every family use one vocabulary. A :class:`ReplyFault` picks the
replies of one node to requests that match (a message type, a family's phase, the n-th such
request) and does one thing to them:

``"drop"``      the reply is lost (the node went offline after receiving the request);
``"error"``     the reply is a Flower error reply (the ClientApp raised);
``"flip"``      one bit of the reply's largest bytes value is flipped (``offset`` picks the byte);
``"truncate"``  the largest bytes value loses its second half;
``"oversize"``  the largest bytes value grows by ``extra_bytes`` random bytes;
``"duplicate"`` the server receives the reply twice;
``"replay"``    the server receives, instead, this node's reply to the previous matching request
                (e.g. the same phase one round earlier), re-addressed to the current one;
``"stale"``     the server receives that earlier reply first, then the fresh one;
``"wrong"``     ``rewrite(content)`` replaces the content: a format-valid but wrong reply that
                only the family's test knows how to build.

Faults apply to the faulty node's replies only; every other node's replies pass unchanged, so a
test can assert that every honest node stays in the round and the result over them is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.app.error import Error

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.phases import PHASE_FIELD
from flwr_fsl.testing.grid import _copy_content

__all__ = ["FAULT_KINDS", "ReplyFault", "largest_bytes", "rewrite_config_bytes"]

FAULT_KINDS = (
    "drop",
    "error",
    "flip",
    "truncate",
    "oversize",
    "duplicate",
    "replay",
    "stale",
    "wrong",
)

_CLIENT_ERROR_CODE = 1


def _request_key(request: Message, family: str | None) -> tuple[str, str | None]:
    name: str | None = None
    if family is not None:
        record = request.content.config_records.get(family)
        value = record.get(PHASE_FIELD) if record is not None else None
        name = value if isinstance(value, str) else None
    return request.metadata.message_type, name


def largest_bytes(content: RecordDict) -> tuple[str, str, str] | None:
    """Return where the largest bytes value of a content is: ``(kind, record key, field)``.

    ``kind`` is ``"config"`` (a bytes field of a ConfigRecord) or ``"array"`` (the data of an
    Array in an ArrayRecord). None if the content holds no bytes.
    """
    best: tuple[int, tuple[str, str, str]] | None = None
    for key, record in content.config_records.items():
        for name, value in record.items():
            if isinstance(value, bytes) and (best is None or len(value) > best[0]):
                best = (len(value), ("config", key, name))
    for key, arrays in content.array_records.items():
        for name, array in arrays.items():
            if best is None or len(array.data) > best[0]:
                best = (len(array.data), ("array", key, name))
    return None if best is None else best[1]


def _rewrite_bytes(content: RecordDict, change: Callable[[bytes], bytes]) -> RecordDict:
    out = _copy_content(content)
    where = largest_bytes(out)
    if where is None:
        raise ConfigurationError("the reply holds no bytes to corrupt")
    kind, key, name = where
    if kind == "config":
        record = out.config_records[key]
        value = record[name]
        assert isinstance(value, bytes)
        out[key] = ConfigRecord({**dict(record), name: change(value)})
    else:
        arrays = out.array_records[key]
        old = arrays[name]
        new = Array(dtype=old.dtype, shape=old.shape, stype=old.stype, data=change(old.data))
        out[key] = ArrayRecord({**{n: a for n, a in arrays.items()}, name: new})
    return out


def rewrite_config_bytes(
    key: str, name: str, change: Callable[[bytes], bytes]
) -> Callable[[RecordDict], RecordDict]:
    """Return a ``"wrong"`` rewrite: ``change`` applied to bytes field ``name`` of record ``key``.

    The family's tests build their format-valid but wrong replies with it (a shifted word, a
    swapped key, a share of another secret).
    """

    def rewrite(content: RecordDict) -> RecordDict:
        record = content.config_records[key]
        value = record[name]
        if not isinstance(value, bytes):
            raise ConfigurationError(f"{key}.{name} holds no bytes")
        content[key] = ConfigRecord({**dict(record), name: change(value)})
        return content

    return rewrite


@dataclass
class ReplyFault:
    """One fault on one node's replies (module docstring); pass it as ``tamper_replies``.

    Parameters
    ----------
    node_id : int
        The faulty node.
    kind : str
        One of :data:`FAULT_KINDS`.
    message_type : str, optional
        Only requests of this Flower message type match (default: any).
    family : str, optional
        With ``phase``: only requests whose ``family`` record names this phase match.
    phase : str, optional
        The phase name (needs ``family``).
    occurrence : int or None
        Fault only the ``occurrence``-th matching request (0-based; e.g. 1 = the phase of the
        second round); None faults every matching request. ``"replay"`` and ``"stale"`` need an
        earlier matching reply, so they apply from the second match on.
    offset : int
        Byte of the value that ``"flip"`` changes (modulo its length).
    extra_bytes : int
        Bytes that ``"oversize"`` appends.
    rewrite : Callable[[RecordDict], RecordDict], optional
        The content transform of ``"wrong"``.
    seed : int
        Seed of the bytes that ``"oversize"`` appends.
    """

    node_id: int
    kind: str
    message_type: str | None = None
    family: str | None = None
    phase: str | None = None
    occurrence: int | None = None
    offset: int = 0
    extra_bytes: int = 1 << 20
    rewrite: Callable[[RecordDict], RecordDict] | None = None
    seed: int = 0
    applied: int = field(default=0, init=False)
    _seen: int = field(default=0, init=False)
    _previous: RecordDict | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ConfigurationError(f"kind must be one of {FAULT_KINDS}, got {self.kind!r}")
        if (self.phase is None) != (self.family is None):
            raise ConfigurationError("phase and family go together")
        if self.kind == "wrong" and self.rewrite is None:
            raise ConfigurationError('kind "wrong" needs rewrite')

    def matches(self, node_id: int, request: Message) -> bool:
        """Whether a request to ``node_id`` is one this fault watches."""
        if node_id != self.node_id:
            return False
        mtype, name = _request_key(request, self.family)
        if self.message_type is not None and mtype != self.message_type:
            return False
        return self.phase is None or name == self.phase

    def __call__(self, node_id: int, request: Message, reply: Message) -> Sequence[Message]:
        """Return the replies the server receives for ``reply`` (the grid's hook)."""
        if not self.matches(node_id, request):
            return [reply]
        index, self._seen = self._seen, self._seen + 1
        previous, self._previous = (
            self._previous,
            (None if reply.has_error() else _copy_content(reply.content)),
        )
        if self.occurrence is not None and index != self.occurrence:
            return [reply]
        if self.kind in ("replay", "stale") and previous is None:
            return [reply]
        if reply.has_error() and self.kind not in ("drop", "duplicate"):
            return [reply]
        self.applied += 1
        return self._apply(request, reply, previous)

    def _apply(
        self, request: Message, reply: Message, previous: RecordDict | None
    ) -> Sequence[Message]:
        kind = self.kind
        if kind == "drop":
            return []
        if kind == "duplicate":
            return [reply, Message(_copy_content(reply.content), reply_to=request)]
        if kind == "error":
            return [
                Message(Error(code=_CLIENT_ERROR_CODE, reason="injected fault"), reply_to=request)
            ]
        if kind in ("replay", "stale"):
            assert previous is not None
            old = Message(previous, reply_to=request)
            return [old] if kind == "replay" else [old, reply]
        if kind == "wrong":
            assert self.rewrite is not None
            return [Message(self.rewrite(_copy_content(reply.content)), reply_to=request)]
        change = self._byte_change()
        return [Message(_rewrite_bytes(reply.content, change), reply_to=request)]

    def _byte_change(self) -> Callable[[bytes], bytes]:
        if self.kind == "flip":

            def flip(value: bytes) -> bytes:
                if not value:
                    return b"\x00"
                i = self.offset % len(value)
                return value[:i] + bytes([value[i] ^ 0x01]) + value[i + 1 :]

            return flip
        if self.kind == "truncate":
            return lambda value: value[: len(value) // 2]
        rng = np.random.default_rng(self.seed)
        extra = rng.integers(0, 256, self.extra_bytes, dtype=np.uint8).tobytes()
        return lambda value: value + extra
