"""ProtocolMod, the client mods' base: dispatch, pass-through, S1 pin, weight key, state slots."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.privacy import NODE_WEIGHT_KEYS_KEY
from flwr_fsl.core.state import StateSlot
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.identity import NODE_SIGNING_KEY, SigningIdentity, node_identity
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.ssa.mod_base import ProtocolMod, SSARound, find_round, weight_key_of
from flwr_fsl.families.ssa.protocol import (
    SSAClientState,
    SSAParams,
    SSAServer,
    encode_update,
    reconstruct,
)
from flwr_fsl.families.ssa.records import (
    HELPER_KEY_FIELD,
    PARAMS_FIELD,
    SESSION_FIELD,
    SSA_FAMILY,
    SSA_UPLOAD_KEY,
    WEIGHT_KEY_FIELD,
    RoundRequest,
    read_ssa_upload,
)
from flwr_fsl.families.ssa.sealing import open_ssa_upload
from flwr_fsl.mods import PrivateRows, ssa_mod, topk_mod
from flwr_fsl.submodel.layout import FlatLayout
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, model_record, node_delta

KEY = SealingKeyPair.from_private_bytes(hashlib.sha256(b"test-base S1").digest())
SESSION = bytes(range(16))
PIN = {"ssa-helper-fingerprint": KEY.fingerprint}


def _params(domain_size: int = 50, num_items: int = 8) -> SSAParams:
    return SSAParams(
        round_id=3,
        domain_size=domain_size,
        num_items=num_items,
        value_width=1,
        hash_key=hashlib.sha256(b"base").digest()[:16],
    )


def _round_config(params: SSAParams | None = None, **extra: Any) -> ConfigRecord:
    p = params or _params()
    fields = {
        PARAMS_FIELD: p.to_bytes(),
        HELPER_KEY_FIELD: KEY.public_bytes,
        SESSION_FIELD: SESSION,
    }
    return ConfigRecord({"server-round": 1, **fields, **extra})


@dataclasses.dataclass(frozen=True)
class Marked:
    """A toy reply: the records to answer with."""

    content: RecordDict

    def to_record(self) -> RecordDict:
        return self.content

    @classmethod
    def from_record(cls, content: RecordDict) -> Marked:
        return cls(content)


TRAIN: Phase[RoundRequest, Marked] = Phase(
    SSA_FAMILY, "train", RoundRequest, Marked, runs_train=True
)
ECHO: Phase[RoundRequest, Marked] = Phase(
    SSA_FAMILY, "echo", RoundRequest, Marked, message_type="query.echo"
)


class Recorder(ProtocolMod):
    """A toy protocol mod: records what the base hands it and answers with markers."""

    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {"train": TRAIN, "echo": ECHO}

    def __init__(self, handles: bool = True) -> None:
        self.calls: list[tuple[str, SSARound]] = []
        self._handles = handles

    def handles(self, found: SSARound) -> bool:
        return self._handles

    def on_train(
        self, request: RoundRequest, context: Context, train: Callable[[], Message]
    ) -> Marked:
        self.calls.append(("train", request.round))
        reply = train()
        name, record, weight = self.reply_weight(request.content, reply)
        return Marked(RecordDict({name: record, "mod": MetricRecord({"weight": weight})}))

    def on_echo(self, request: RoundRequest, context: Context) -> Marked:
        self.calls.append(("query", request.round))
        return Marked(RecordDict({"mod": MetricRecord({"query": 1})}))


def _app(mod: ProtocolMod, metrics: dict[str, Any] | None = None) -> ClientApp:
    app = ClientApp(mods=[mod])
    reply_metrics = metrics if metrics is not None else {"num-examples": 7}

    def reply(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord(reply_metrics)}), reply_to=msg)

    app.train()(reply)
    app.train("custom")(reply)
    app.evaluate()(reply)
    app.query("echo")(reply)
    app.query("other")(reply)
    return app


def _send(grid: InProcessGrid, message_type: str, config: ConfigRecord) -> Message:
    node = next(iter(grid.get_node_ids()))
    msg = Message(RecordDict({"config": config}), node, message_type)
    (reply,) = grid.send_and_receive([msg])
    return reply


# ---- dispatch and pass-through -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("message_type", "handled"),
    [
        ("train", "train"),
        ("train.custom", "train"),
        ("query.echo", "query"),
        ("query.other", None),
        ("evaluate", None),
    ],
)
def test_dispatch_on_message_type(message_type: str, handled: str | None) -> None:
    mod = Recorder()
    reply = _send(InProcessGrid(_app(mod), 1, PIN), message_type, _round_config())
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    if handled is None:
        assert mod.calls == [] and "mod" not in reply.content  # passed through untouched
        return
    ((kind, found),) = mod.calls
    assert kind == handled and "mod" in reply.content
    assert found.params == _params() and found.helper_key == KEY.public_bytes
    assert found.binding == RoundBinding.of(SESSION, 3, _params().to_bytes())
    assert found.config["server-round"] == 1  # the record the round came in


@pytest.mark.parametrize("message_type", ["train", "train.custom", "evaluate"])
def test_plaintext_rounds_pass_through(message_type: str) -> None:
    mod = Recorder()
    reply = _send(InProcessGrid(_app(mod), 1, PIN), message_type, ConfigRecord({"x": 1}))
    assert not reply.has_error() and mod.calls == []
    assert reply.content["metrics"]["num-examples"] == 7


def test_rounds_the_mod_does_not_handle_pass_through() -> None:
    mod = Recorder(handles=False)
    reply = _send(InProcessGrid(_app(mod), 1, PIN), "train", _round_config())
    assert not reply.has_error() and mod.calls == [] and "mod" not in reply.content


def test_private_rows_passes_ssa_rounds_without_a_table_through() -> None:
    rows = PrivateRows("emb", rows=lambda context: np.arange(3))
    app = ClientApp(mods=[rows.mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    reply = _send(InProcessGrid(app, 1, PIN), "train", _round_config())
    assert not reply.has_error() and reply.content["metrics"]["num-examples"] == 1


def test_query_without_a_round_is_an_error() -> None:
    mod = Recorder()
    reply = _send(InProcessGrid(_app(mod), 1, PIN), "query.echo", ConfigRecord({"x": 1}))
    assert reply.has_error() and "no SSA round parameters" in reply.error.reason
    assert mod.calls == []


def test_unpinned_helper_key_is_refused_before_the_protocol_runs() -> None:
    other = SealingKeyPair.from_private_bytes(hashlib.sha256(b"other").digest())
    for message_type in ("train", "query.echo"):
        mod = Recorder()
        grid = InProcessGrid(_app(mod), 1, {"ssa-helper-fingerprint": other.fingerprint})
        reply = _send(grid, message_type, _round_config())
        assert reply.has_error() and "fingerprint" in reply.error.reason
        assert mod.calls == []


def test_bad_signing_key_is_refused_before_the_protocol_runs(tmp_path: Path) -> None:
    loose = SigningIdentity.generate().save(tmp_path / "loose.pem")
    loose.chmod(0o644)
    for value in ("relative.pem", str(tmp_path / "absent.pem"), str(loose)):
        mod = Recorder()
        config = {NODE_SIGNING_KEY: value}
        grid = InProcessGrid(_app(mod), 1, PIN, node_config_fn=lambda i, c=config: c)
        reply = _send(grid, "train", _round_config())
        assert reply.has_error() and NODE_SIGNING_KEY in reply.error.reason
        assert "\n" not in reply.error.reason.strip()
        assert mod.calls == []
    # A good key is loaded; the round goes on.
    good = SigningIdentity.generate().save(tmp_path / "good.pem")
    mod = Recorder()
    config = {NODE_SIGNING_KEY: str(good)}
    grid = InProcessGrid(_app(mod), 1, PIN, node_config_fn=lambda i: config)
    assert not _send(grid, "train", _round_config()).has_error()
    assert [c[0] for c in mod.calls] == ["train"]


def test_malformed_round_fields_are_an_error() -> None:
    mod = Recorder()
    config = _round_config()
    config[SESSION_FIELD] = 5
    reply = _send(InProcessGrid(_app(mod), 1, PIN), "train", config)
    assert reply.has_error() and SESSION_FIELD in reply.error.reason and mod.calls == []


def test_find_round_and_bytes_field() -> None:
    content = RecordDict({"a": ConfigRecord({"x": 1}), "b": _round_config(blob=b"abc")})
    found = find_round(content)
    assert found is not None and found.bytes_field("blob") == b"abc"
    with pytest.raises(ClientInputError, match="'x'"):
        found.bytes_field("x")
    assert find_round(RecordDict({"a": ConfigRecord({"x": 1})})) is None


# ---- the weight metric ---------------------------------------------------------------------------


def test_weight_key_comes_from_the_train_config() -> None:
    assert weight_key_of(RecordDict({"c": ConfigRecord({"x": 1})})) == "num-examples"
    assert weight_key_of(RecordDict({"c": ConfigRecord({WEIGHT_KEY_FIELD: "n"})})) == "n"
    for bad in ("", 3):
        with pytest.raises(ClientInputError, match=WEIGHT_KEY_FIELD):
            weight_key_of(RecordDict({"c": ConfigRecord({WEIGHT_KEY_FIELD: bad})}))

    mod = Recorder()
    grid = InProcessGrid(_app(mod, {"samples": 4, "num-examples": 9}), 1, PIN)
    reply = _send(grid, "train", _round_config(**{WEIGHT_KEY_FIELD: "samples"}))
    assert reply.content["mod"]["weight"] == 4.0
    reply = _send(grid, "train", _round_config())  # default key
    assert reply.content["mod"]["weight"] == 9.0


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [
        ({"num-examples": 9}, "MetricRecord with 'samples'"),
        ({"samples": 0}, "finite and > 0"),
        ({"samples": float("nan")}, "finite and > 0"),
        ({"samples": [1, 2]}, "must be a number"),
    ],
)
def test_bad_weight_metric_is_an_error(metrics: dict[str, Any], reason: str) -> None:
    grid = InProcessGrid(_app(Recorder(), metrics), 1, PIN)
    reply = _send(grid, "train", _round_config(**{WEIGHT_KEY_FIELD: "samples"}))
    assert reply.has_error() and reason in reply.error.reason


def _allowing(keys: str) -> Callable[[int], dict[str, Any]]:
    """Node configs whose weight-key allow-list (``fsl-weight-keys``) is ``keys``."""
    return lambda i: {"partition-id": i, "num-partitions": 3, NODE_WEIGHT_KEYS_KEY: keys}


@pytest.mark.parametrize(
    ("weighted", "allowed", "expected"),
    [
        (True, "samples", 4.0),  # the server's key, allowed by the node config
        (True, "", None),  # the server's key, not allowed: the client refuses
        (False, "", 1.0),  # unit weights: no key read, every count word is 1
    ],
)
def test_ssa_mod_weights_by_the_configured_key_end_to_end(
    weighted: bool, allowed: str, expected: float | None
) -> None:
    """ssa_mod's upload, opened by both servers, carries the round's weight as counts."""
    layout = FlatLayout.of(MODEL)
    params = dataclasses.replace(_params(layout.size, 6), weighted=weighted)
    app = ClientApp(mods=[ssa_mod, topk_mod])
    trained: list[int] = []

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        new = {
            n: Array(np.asarray(a.numpy() + node_delta(0, 1, n, a.numpy().shape), order="C"))
            if a.numpy().dtype == np.float32
            else a
            for n, a in arrays.items()
        }
        metrics = MetricRecord({"samples": 4, "num-examples": 1000})
        trained.append(1)
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    run_config = {**PIN, "topk-error-feedback": False}
    grid = InProcessGrid(app, 1, run_config, node_config_fn=_allowing(allowed))
    node = next(iter(grid.get_node_ids()))
    config = _round_config(params, **{WEIGHT_KEY_FIELD: "samples", "topk-count": 6})
    msg = Message(RecordDict({"arrays": model_record(), "config": config}), node, "train")
    (reply,) = grid.send_and_receive([msg])
    if expected is None:  # refused before training, in one line naming the key
        assert reply.has_error() and not trained
        assert "weight key 'samples'" in reply.error.reason and NODE_WEIGHT_KEYS_KEY in (
            reply.error.reason
        )
        assert "\n" not in reply.error.reason.strip()
        return
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert set(reply.content.keys()) == {SSA_UPLOAD_KEY}  # the weight is in the payload only
    public, seed0, sealed = read_ssa_upload(reply.content)
    binding = RoundBinding.of(SESSION, params.round_id, params.to_bytes())
    opened = open_ssa_upload(KEY, sealed, binding=binding, client_id=node, public_part=public)
    seed1 = opened.master_seed
    # Signed with the node's own key (no fsl-signing-key: the default one, by partition).
    assert opened.signer == node_identity({"partition-id": 0}, node).public_bytes
    servers = [SSAServer(params, b) for b in (0, 1)]
    servers[0].add_client(node, public, seed0)
    servers[1].add_client(node, public, seed1)
    result = reconstruct(params, servers[0].share(), servers[1].share())
    assert result.counts is not None
    touched = np.flatnonzero(result.counts)
    assert touched.size == 6 and np.allclose(result.counts[touched], expected)
    delta = np.concatenate(
        [node_delta(0, 1, n, v.shape).ravel() for n, v in MODEL.items() if v.dtype == np.float32]
    )
    np.testing.assert_allclose(result.average()[touched, 0], delta[touched], atol=1e-5)


def _weighted_app(mods: list[Any]) -> ClientApp:
    """Train adds the usual per-node delta; the weight is 'samples', 'num-examples' is a decoy."""
    app = ClientApp(mods=mods)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        new = {}
        for n, a in msg.content["arrays"].items():
            v = a.numpy()
            delta = node_delta(pid, rnd, n, v.shape) if v.dtype == np.float32 else 0
            new[n] = Array(np.asarray(v + delta, order="C"))
        metrics = MetricRecord({"samples": 3 * (pid + 1), "num-examples": 1})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


def test_secure_round_weights_by_the_strategy_key() -> None:
    """weighted_by_key='samples' on the server (weighted=True, and the clients' node config
    allows 'samples'): ssa_mod weights by 'samples' too."""
    from flwr_fsl.helper import InProcessHelper
    from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg

    run_config = {**PIN, "topk-error-feedback": False}
    secure = SecureFedSubAvg(
        InProcessHelper(keypair=KEY),
        topk_ratio=0.2,
        helper_fingerprint=KEY.fingerprint,
        min_available_nodes=3,
        frac_bits=32,
        max_abs=1e3,
        weighted_by_key="samples",
        weighted=True,
    )
    grid = InProcessGrid(
        _weighted_app([ssa_mod, topk_mod]), 3, run_config, node_config_fn=_allowing("samples")
    )
    got = secure.start(
        grid=grid,
        initial_arrays=model_record(),
        num_rounds=1,
    )
    assert secure.failed_rounds == {} and secure.dropped == {1: {}}
    k = int(np.ceil(0.2 * FlatLayout.of(MODEL).size))
    plain = FedSubAvg(min_available_nodes=3, weighted_by_key="samples").start(
        grid=InProcessGrid(_weighted_app([topk_mod]), 3, {**run_config, "topk-count": k}),
        initial_arrays=model_record(),
        num_rounds=1,
    )
    for name, value in MODEL.items():
        if value.dtype == np.float32:
            np.testing.assert_allclose(
                got.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
            )


# ---- state slots ---------------------------------------------------------------------------------


def _context() -> Context:
    return Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})


SLOT = StateSlot("fsl.test.keys", SSAClientState.to_bytes, SSAClientState.from_bytes)


def _client_state() -> SSAClientState:
    params = _params()
    _, state = encode_update(params, np.array([1, 7, 30]), np.ones(3), 2.0)
    return state


def test_state_slot_round_trip_and_clear() -> None:
    context, state = _context(), _client_state()
    assert SLOT.load(context) is None
    SLOT.store(context, state)
    back = SLOT.load(context)
    assert back is not None and back.to_bytes() == state.to_bytes()
    SLOT.clear(context)
    assert SLOT.load(context) is None and SLOT.name not in context.state
    SLOT.clear(context)  # absent: no-op


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda b: b[:-1],
        lambda b: b + b"\x00",
        lambda b: b[:4] + b"\x09" + b[5:],
        lambda b: b"",
    ],
)
def test_corrupted_state_slot_reads_as_empty(corrupt: Any) -> None:
    context = _context()
    SLOT.store(context, _client_state())
    record = context.state.config_records[SLOT.name]
    record["bytes"] = corrupt(record["bytes"])
    assert SLOT.load(context) is None


def test_state_slot_with_a_foreign_record_reads_as_empty() -> None:
    context = _context()
    context.state[SLOT.name] = ConfigRecord({"bytes": 3})
    assert SLOT.load(context) is None
    context.state[SLOT.name] = ConfigRecord({"other": b"x"})
    assert SLOT.load(context) is None


def test_state_slot_does_not_hide_decoder_bugs() -> None:
    def broken(data: bytes) -> int:
        raise KeyError("a bug, not bad input")

    slot = StateSlot("fsl.test.bug", lambda v: b"x", broken)
    context = _context()
    slot.store(context, 1)
    with pytest.raises(KeyError):
        slot.load(context)
