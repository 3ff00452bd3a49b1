"""PrivHFL's client on the phase contract: typed phases, ``phase_of`` refusals, pass-through.

:class:`PrivHFLClient` is a :class:`~flwr_fsl.core.phases.PhaseMod` over
:data:`PRIVHFL_PHASES`; a PrivHFL message naming an unknown phase, or a phase of another
message type, is refused with the :class:`ClientInputError` texts :class:`PhaseConfig` always
gave, and anything else passes on to the next mod untouched. The strategy builds each request
with the same phases, and the contents are those it built by hand before.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import recorddict_to_proto

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import PhaseMod
from flwr_fsl.families.privhfl.messages import SECURE_KEY
from flwr_fsl.families.privhfl.mod import PrivateData, PrivHFLClient
from flwr_fsl.families.privhfl.records import (
    LOGITS_KEY,
    PHASE_TYPES,
    PRIVHFL_KEY,
    PRIVHFL_PHASES,
    QUERIES_KEY,
    PhaseConfig,
    PhaseReply,
    PhaseRequest,
    logits_record,
    queries_record,
)
from flwr_fsl.testing import InProcessGrid

SHAPE = (1, 4, 4)


def _unused(context: Context) -> Any:
    raise AssertionError("a refused or passed-on message builds no model and reads no data")


def _client() -> PrivHFLClient:
    return PrivHFLClient(_unused, _unused, num_classes=3, image_shape=SHAPE)


def _message(content: RecordDict, message_type: str) -> Message:
    grid = InProcessGrid(ClientApp(), 1)  # also sets Flower's task identity for Message()
    return grid.create_message(content, message_type, 1000, "1")


def _context() -> Context:
    return Context(1, 1000, {"partition-id": 0}, RecordDict(), {})


def _record(name: str, **changes: Any) -> ConfigRecord:
    record = PhaseConfig(name, 1, 7).to_record()
    for key, value in changes.items():
        record[key] = value
    return record


def _bytes(content: RecordDict) -> bytes:
    return recorddict_to_proto(content).SerializeToString(deterministic=True)


def test_the_typed_phases_are_the_phase_types() -> None:
    assert isinstance(_client(), PhaseMod)
    assert set(PRIVHFL_PHASES) == set(PHASE_TYPES)
    for name, phase in PRIVHFL_PHASES.items():
        assert (phase.family, phase.name, phase.message_type) == (
            PRIVHFL_KEY,
            name,
            PHASE_TYPES[name],
        )
        assert not phase.runs_train
    assert PrivHFLClient.phases is PRIVHFL_PHASES


def test_build_is_the_hand_built_content_and_parses_back() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((2, *SHAPE), dtype=np.float32)
    z = rng.random((2, 3), dtype=np.float32)
    blob = b"\x01secure"
    cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("local", {}, {}),
        ("evaluate", {}, {}),
        ("generate", {}, {}),
        ("answer", {"queries": queries_record(x)}, {QUERIES_KEY: queries_record(x)}),
        ("retrain", {"logits": logits_record(z)}, {LOGITS_KEY: logits_record(z)}),
        ("retrain", {}, {}),
    ]
    secure = ConfigRecord({"blob": blob})
    for name in ("keys", "generate", "step", "sign", "retrain"):
        cases.append((name, {"secure": secure}, {SECURE_KEY: secure}))
    for name, fields, records in cases:
        config = PhaseConfig(name, 2, 9, answerers=1 if name == "retrain" else 0)
        phase = PRIVHFL_PHASES[name]
        built = phase.build(PhaseRequest(config, **fields))
        # what the strategy sent before the typed phases, byte for byte
        assert _bytes(built) == _bytes(RecordDict({PRIVHFL_KEY: config.to_record(), **records}))
        assert list(built[PRIVHFL_KEY].keys())[:2] == ["version", "phase"]
        request = phase.parse_request(built)
        assert request.config == config
        assert (request.secure is not None) == (SECURE_KEY in records)
    with pytest.raises(ValueError, match="local request"):
        PRIVHFL_PHASES["local"].build(PhaseRequest(PhaseConfig("answer", 1, 0)))


def test_request_readers_refuse_as_before() -> None:
    request = PhaseRequest(PhaseConfig("answer", 1, 0))
    with pytest.raises(ClientInputError, match=r"no 'fsl\.privhfl\.queries' ArrayRecord"):
        request.read_queries(10, SHAPE, 1.0)
    with pytest.raises(ClientInputError, match=r"no 'fsl\.privhfl\.logits' ArrayRecord"):
        request.read_logits(2, 3, 1.0)
    with pytest.raises(ClientInputError, match="exactly one field 'blob'"):
        request.blob()
    bad = PhaseRequest(PhaseConfig("keys", 1, 0), secure=ConfigRecord({"blob": "text"}))
    with pytest.raises(ClientInputError, match="must be bytes"):
        bad.blob()
    with pytest.raises(ClientInputError, match="reply lacks"):
        PhaseReply(RecordDict()).blob()
    assert PhaseReply.sealed(b"ok").blob() == b"ok"


@pytest.mark.parametrize(
    ("message_type", "record", "match"),
    [
        ("train.privhfl", _record("local", phase="steal"), "unknown PrivHFL phase"),
        ("query.privhfl", _record("local", phase="steal"), "unknown PrivHFL phase"),
        ("query.privhfl", _record("local"), "does not match the message type"),
        ("train.privhfl", _record("answer"), "does not match the message type"),
        ("evaluate.privhfl", _record("retrain"), "does not match the message type"),
        ("train.privhfl", _record("local", phase=3), "wrong type"),
        ("train.privhfl", _record("local", version=2), "version"),
    ],
)
def test_a_bad_or_mismatched_phase_is_refused(
    message_type: str, record: ConfigRecord, match: str
) -> None:
    client = _client()
    msg = _message(RecordDict({PRIVHFL_KEY: record}), message_type)
    handler = getattr(client, message_type.split(".")[0])
    with pytest.raises(ClientInputError, match=match):
        handler(msg, _context())  # the registered function

    def call_next(msg: Message, context: Context) -> Message:
        raise AssertionError("a refused message goes no further")

    with pytest.raises(ClientInputError, match=match):
        client(msg, _context(), call_next)  # the instance as a mod


def test_a_registered_function_refuses_a_message_without_the_record() -> None:
    client = _client()
    for category in ("train", "query", "evaluate"):
        msg = _message(RecordDict(), f"{category}.privhfl")
        with pytest.raises(ClientInputError, match="no PrivHFL record"):
            getattr(client, category)(msg, _context())


@pytest.mark.parametrize(
    ("message_type", "content"),
    [
        ("train", RecordDict({"config": ConfigRecord({"lr": 0.1})})),
        ("train.privhfl", RecordDict({"config": ConfigRecord({"lr": 0.1})})),
        ("query.other", RecordDict({PRIVHFL_KEY: _record("generate")})),
        ("evaluate", RecordDict({PRIVHFL_KEY: _record("evaluate")})),
    ],
)
def test_a_non_privhfl_message_passes_through(message_type: str, content: RecordDict) -> None:
    msg = _message(content, message_type)
    seen: list[Message] = []

    def call_next(inner: Message, context: Context) -> Message:
        seen.append(inner)
        return Message(RecordDict({"metrics": MetricRecord({"next": 1})}), reply_to=inner)

    reply = _client()(msg, _context(), call_next)
    assert seen == [msg] and seen[0].content is content
    assert reply.content.metric_records["metrics"]["next"] == 1


# -- the querier's own query seed --------------------------------------------------------------
def _private(key: bytes | None = None) -> PrivateData:
    return PrivateData(np.zeros((2, *SHAPE), np.float32), np.zeros(2, np.int64), query_key=key)


def test_query_seed_is_fresh_without_a_key_and_keyed_with_one() -> None:
    config = PhaseConfig("generate", 2, 7)
    context, client = _context(), _client()
    seeds = {client.query_seed(context, config, _private()) for _ in range(8)}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)  # os.urandom each time
    keyed = _private(b"k" * 16)
    seed = client.query_seed(context, config, keyed)
    assert seed == client.query_seed(context, config, keyed)  # repeatable with the node's key
    other_node = Context(1, 1001, {"partition-id": 1}, RecordDict(), {})
    changed = [
        client.query_seed(other_node, config, keyed),
        client.query_seed(context, PhaseConfig("generate", 3, 7), keyed),
        client.query_seed(context, PhaseConfig("generate", 2, 8), keyed),
        client.query_seed(context, config, _private(b"j" * 16)),
    ]
    assert len({seed, *changed}) == 5
    assert seed != config.seed  # never the server's seed


@pytest.mark.parametrize("key", [b"short", "a string key of 16+", 12345])
def test_query_key_is_checked(key: Any) -> None:
    with pytest.raises(ConfigurationError, match="query_key"):
        _private(key)
