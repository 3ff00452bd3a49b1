"""Communication accounting: the bytes a Flower message's content takes on the wire.

Sizes are those of the protobuf encoding Flower itself uses for a ``RecordDict`` (arrays,
metrics, configs and their keys), so dense and sparse replies are compared on what is actually
sent, not on a count of floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import RecordDict
from flwr.common.serde import recorddict_to_proto


def content_bytes(content: RecordDict) -> int:
    """Return the serialized size in bytes of a message's ``RecordDict`` content.

    Parameters
    ----------
    content : RecordDict
        The message content.

    Returns
    -------
    int
        Size of the protobuf encoding of ``content``.
    """
    return int(recorddict_to_proto(content).ByteSize())


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
