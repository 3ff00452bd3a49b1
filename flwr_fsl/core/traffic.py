"""Communication accounting: the bytes a Flower message's content takes on the wire.

Sizes are those of the protobuf encoding Flower itself uses for a ``RecordDict`` (arrays,
metrics, configs and their keys), so dense and sparse replies are compared on what is actually
sent, not on a count of floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.common.serde import config_record_to_proto, metric_record_to_proto

__all__ = ["RoundTraffic", "content_bytes"]


def _varint(value: int) -> int:
    """Return the bytes of a protobuf varint (a negative int32/int64 takes 10)."""
    if value < 0:
        return 10
    return max(1, (value.bit_length() + 6) // 7)


def _tag(number: int) -> int:
    return _varint(number << 3)


def _delimited(number: int, size: int) -> int:
    """Return the bytes of a length-delimited field (string, bytes, message) of ``size``."""
    return _tag(number) + _varint(size) + size


def _text(number: int, text: str) -> int:
    """Return the bytes of a proto3 string field (none when empty)."""
    size = len(text.encode("utf-8"))
    return _delimited(number, size) if size else 0


def _array_size(array: Array) -> int:
    # Array: dtype = 1, shape = 2 (packed int32), stype = 3, data = 4.
    shape = sum(_varint(int(d)) for d in array.shape)
    data = len(array.data)
    return (
        _text(1, array.dtype)
        + (_delimited(2, shape) if array.shape else 0)
        + _text(3, array.stype)
        + (_delimited(4, data) if data else 0)
    )


def _config_size(record: ConfigRecord) -> int:
    # ConfigRecordValue: string = 5, bytes = 6, bytes_list = 26 (each value a oneof member,
    # always written); the other kinds are small and serialized by Flower's own code.
    bulky = 0
    rest = ConfigRecord()
    for key, value in record.items():
        if isinstance(value, bytes):
            inner = _delimited(6, len(value))
        elif isinstance(value, str):
            inner = _delimited(5, len(value.encode("utf-8")))
        elif isinstance(value, list) and value and all(isinstance(v, bytes) for v in value):
            sizes = [len(v) for v in value if isinstance(v, bytes)]
            inner = _delimited(26, sum(_delimited(1, n) for n in sizes))
        else:
            rest[key] = value
            continue
        bulky += _delimited(1, _text(1, key) + _delimited(2, inner))
    return bulky + (config_record_to_proto(rest).ByteSize() if rest else 0)


def content_bytes(content: RecordDict) -> int:
    """Return the serialized size in bytes of a message's ``RecordDict`` content.

    The size is computed from the records' lengths, field by field as Flower's protobuf
    encoding lays them out, without copying arrays or bytes into a protobuf message (which
    cost most of a secure-aggregation server's time at a million parameters, issue 26).
    Small config and metric values are sized by Flower's own serializer.

    Parameters
    ----------
    content : RecordDict
        The message content.

    Returns
    -------
    int
        Size of the protobuf encoding of ``content`` (equal to
        ``recorddict_to_proto(content).ByteSize()``).
    """
    total = 0
    for key, record in content.items():
        if isinstance(record, ArrayRecord):
            number = 2
            inner = sum(
                _delimited(1, _text(1, name) + _delimited(2, _array_size(array)))
                for name, array in record.items()
            )
        elif isinstance(record, ConfigRecord):
            number, inner = 4, _config_size(record)
        else:  # a MetricRecord holds numbers only: small
            assert isinstance(record, MetricRecord)
            number, inner = 3, metric_record_to_proto(record).ByteSize()
        total += _delimited(1, _text(1, key) + _delimited(number, inner))
    return total


@dataclass
class RoundTraffic:
    """Bytes moved in one phase of one server round, per node.

    Attributes
    ----------
    server_round : int
        The round number (1-based).
    phase : str
        ``"train"`` or ``"evaluate"`` (protocols with more phases add their own names).
    down_bytes : dict[int, int]
        Node id -> bytes of the message content sent to the node.
    up_bytes : dict[int, int]
        Node id -> bytes of the reply content received from the node (every reply that
        arrived, valid or not: the bandwidth was spent either way).
    """

    server_round: int
    phase: str
    down_bytes: dict[int, int] = field(default_factory=dict)
    up_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def mean_down_bytes(self) -> float:
        """Mean bytes sent per node that was sent a message (0.0 if none)."""
        return sum(self.down_bytes.values()) / len(self.down_bytes) if self.down_bytes else 0.0

    @property
    def mean_up_bytes(self) -> float:
        """Mean bytes received per replying node (0.0 if none)."""
        return sum(self.up_bytes.values()) / len(self.up_bytes) if self.up_bytes else 0.0


def traffic_table(traffic: list[RoundTraffic]) -> str:
    """Return the per-round communication summary of ``traffic`` as a text table (MB/client)."""
    header = f"{'round':>5} {'phase':<9} {'clients':>7} {'down MB/cl':>11} {'up MB/cl':>10}"
    lines = ["Communication per round (mean per client):", header]
    for t in traffic:
        lines.append(
            f"{t.server_round:>5} {t.phase:<9} {len(t.down_bytes):>7} "
            f"{t.mean_down_bytes / 1e6:>11.4f} {t.mean_up_bytes / 1e6:>10.4f}"
        )
    return "\n".join(lines)
