"""ReplyFault: each fault class does what its name says to the faulty node's replies only."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, RecordDict

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.faults import FAULT_KINDS, ReplyFault, largest_bytes
from tests.testing.test_grid import _app

BAD = 1000
GOOD = 1001


def _round(grid: InProcessGrid) -> dict[int, list[Message]]:
    record = ArrayRecord({"w": Array(np.zeros(4, np.float32))})
    out: dict[int, list[Message]] = {BAD: [], GOOD: []}
    requests = [Message(RecordDict({"arrays": record}), n, "train") for n in (BAD, GOOD)]
    by_id = {}
    ids = list(grid.push_messages(requests))
    for msg_id, req in zip(ids, requests, strict=True):
        by_id[msg_id] = req.metadata.dst_node_id
    for reply in grid.pull_messages(ids):
        out[by_id[reply.metadata.reply_to_message_id]].append(reply)
    return out


def _w(reply: Message) -> np.ndarray:
    return reply.content["arrays"]["w"].numpy()


def _calls(reply: Message) -> int:
    return int(reply.content["m"]["calls"])


@pytest.mark.parametrize("kind", [k for k in FAULT_KINDS if k != "wrong"])
def test_each_kind_touches_only_the_faulty_node(kind: str) -> None:
    fault = ReplyFault(BAD, kind, message_type="train", occurrence=1)
    grid = InProcessGrid(_app(), 2, tamper_replies=fault)
    first = _round(grid)
    assert [_calls(r) for r in first[BAD]] == [1]  # occurrence 1: the first round is clean
    second = _round(grid)
    assert [_calls(r) for r in second[GOOD]] == [2] and fault.applied == 1
    bad = second[BAD]
    if kind == "drop":
        assert bad == []
    elif kind == "error":
        assert len(bad) == 1 and bad[0].has_error()
    elif kind == "duplicate":
        assert [_calls(r) for r in bad] == [2, 2]
    elif kind == "replay":
        assert [_calls(r) for r in bad] == [1]
    elif kind == "stale":
        assert [_calls(r) for r in bad] == [1, 2]
    else:
        (reply,) = bad
        data = reply.content["arrays"]["w"].data
        clean = Array(np.full(4, 2, np.float32)).data
        if kind == "flip":
            assert len(data) == len(clean) and data != clean
        elif kind == "truncate":
            assert len(data) < len(clean)
        else:
            assert len(data) == len(clean) + fault.extra_bytes


def test_wrong_rewrites_the_content() -> None:
    def rewrite(content: RecordDict) -> RecordDict:
        content["arrays"] = ArrayRecord({"w": Array(np.full(4, 7, np.float32))})
        return content

    grid = InProcessGrid(_app(), 2, tamper_replies=ReplyFault(BAD, "wrong", rewrite=rewrite))
    out = _round(grid)
    np.testing.assert_array_equal(_w(out[BAD][0]), np.full(4, 7))
    np.testing.assert_array_equal(_w(out[GOOD][0]), np.ones(4))


def test_bad_arguments_and_no_bytes() -> None:
    with pytest.raises(ConfigurationError, match="kind"):
        ReplyFault(BAD, "melt")
    with pytest.raises(ConfigurationError, match="family"):
        ReplyFault(BAD, "flip", phase="x")
    with pytest.raises(ConfigurationError, match="rewrite"):
        ReplyFault(BAD, "wrong")
    assert largest_bytes(RecordDict()) is None


def test_rewrite_config_bytes_changes_one_field_and_refuses_a_non_bytes_one() -> None:
    from flwr.app import ConfigRecord

    from flwr_fsl.testing.faults import rewrite_config_bytes

    content = RecordDict({"fsl.x": ConfigRecord({"phase": "train", "body": b"\x01\x02"})})
    out = rewrite_config_bytes("fsl.x", "body", lambda b: b[::-1])(content)
    assert out.config_records["fsl.x"]["body"] == b"\x02\x01"
    assert out.config_records["fsl.x"]["phase"] == "train"
    with pytest.raises(ConfigurationError, match=r"fsl\.x\.phase"):
        rewrite_config_bytes("fsl.x", "phase", lambda b: b)(content)
