"""SESA under one faulty node (issue 24): every phase x every reply fault of
:mod:`flwr_fsl.testing.faults`, with the verdicts of the fault campaign — the faulty node
dropped with a reason and the round exact over the rest, or the round failed cleanly with the
model unchanged and the next round normal — never an honest node dropped or a silently
changed model; plus the issue's reproductions (1 / 3 / 9 corrupted sealed evaluations, a
round-1 offline bundle replayed in round 2, a duplicated offline reply) and the complaint
rule's bound on a lying complainer.

10 clients (K_max = 4 shards, T = 2: K_max + T = 6), a tiny MLP, three rounds: the fault hits
round 2 only; rounds 1 and 3 must aggregate exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.families.sesa import messages as sm
from flwr_fsl.families.sesa.layout import SesaLayout
from flwr_fsl.families.sesa.mod import SesaNodeState, sesa_mod
from flwr_fsl.families.sesa.records import SESA_KEY
from flwr_fsl.families.sesa.strategy import SesaFedAvg
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.faults import FAULT_KINDS, ReplyFault, rewrite_config_bytes

HIDDEN, INPUTS, OUTPUTS, N, FAULTY = 8, 4, 3, 10, 1003
MODEL = {
    "fc1.weight": np.linspace(-1, 1, HIDDEN * INPUTS, dtype=np.float32).reshape(HIDDEN, INPUTS),
    "fc1.bias": np.zeros(HIDDEN, np.float32),
    "fc2.weight": np.linspace(1, -1, OUTPUTS * HIDDEN, dtype=np.float32).reshape(OUTPUTS, HIDDEN),
    "fc2.bias": np.full(OUTPUTS, 0.5, np.float32),
}
RATES = [1.0, 0.5, 0.25, 0.5, 0.25, 1.0, 0.25, 0.5, 0.25, 0.5]
PHASES = ("advertise", "offline", "train", "decode")
ALL = list(range(1000, 1000 + N))
HONEST = [n for n in ALL if n != FAULTY]


def _delta(pid: int, rnd: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([pid, rnd, sum(map(ord, name))])
    return (0.1 * rng.normal(size=shape)).astype(np.float32)


class Run:
    """Three SESA rounds on InProcessGrid with one fault; what each round produced."""

    def __init__(self, fault: Callable[..., list[Message]] | None, rounds: int = 3) -> None:
        self.choices: dict[tuple[int, int], dict[str, tuple[int, ...]]] = {}
        self.models: dict[int, dict[str, np.ndarray]] = {}
        grid = InProcessGrid(
            self._app(),
            N,
            node_config_fn=lambda i: {"partition-id": i, "width-rate": RATES[i]},
            tamper_replies=fault,
        )
        self.grid = grid
        self.strategy = SesaFedAvg(
            num_shards=4, privacy=2, min_available_nodes=N, sampling_seed=1,
            frac_bits=20, max_clients=50, clipping_range=8.0,
        )  # fmt: skip
        initial = ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})

        def keep(rnd: int, arrays: ArrayRecord) -> None:
            self.models[rnd] = {k: a.numpy().copy() for k, a in arrays.items()}

        self.strategy.start(grid, initial, num_rounds=rounds, evaluate_fn=keep)

    def _app(self) -> ClientApp:
        app = ClientApp(mods=[sesa_mod])

        @app.train()
        def train(msg: Message, context: Context) -> Message:
            pid = int(context.node_config["partition-id"])
            rnd = int(msg.content["config"]["server-round"])
            raw = context.state.config_records["fsl.sesa.client-state"]["bytes"]
            self.choices[(rnd, context.node_id)] = SesaNodeState.from_bytes(raw).choice
            new = {
                k: a.numpy() + _delta(pid, rnd, k, a.shape)
                for k, a in msg.content["arrays"].items()
            }
            arrays = ArrayRecord({k: Array(v) for k, v in new.items()})
            metrics = MetricRecord({"num-examples": 10})
            return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

        return app

    def reference(self, rnd: int, nodes: list[int]) -> dict[str, np.ndarray]:
        """Plaintext shard-wise mean over ``nodes`` applied to the model before ``rnd``."""
        model = self.models[rnd - 1]
        layout = SesaLayout.of(model, 4)
        total = {k: np.zeros(v.shape) for k, v in model.items()}
        count = {k: np.zeros(v.shape) for k, v in model.items()}
        for node in nodes:
            width = layout.width_layout(model, self.choices[(rnd, node)])
            for name in model:
                out_idx, in_idx = width.slices.get(name, (None, None))
                rows = np.arange(model[name].shape[0]) if out_idx is None else out_idx
                d = _delta(node - 1000, rnd, name, width.sub_shape(name)).astype(np.float64)
                if model[name].ndim == 1:
                    total[name][rows] += d
                    count[name][rows] += 1
                else:
                    cols = np.arange(model[name].shape[1]) if in_idx is None else in_idx
                    total[name][np.ix_(rows, cols)] += d
                    count[name][np.ix_(rows, cols)] += 1
        out = {}
        for name, value in model.items():
            held = count[name] > 0
            new = value.astype(np.float64).copy()
            new[held] += total[name][held] / count[name][held]
            out[name] = new
        return out

    def exact(self, rnd: int, nodes: list[int]) -> bool:
        ref = self.reference(rnd, nodes)
        return all(np.allclose(self.models[rnd][k], ref[k], atol=2e-5) for k in ref)

    def verdict(self, aggregated: list[int] | None = None) -> str:
        """Return the one verdict round 2 shows (asserting its conditions), or raise."""
        s = self.strategy
        assert 1 not in s.failed_rounds and s.dropped[1] == {} and self.exact(1, ALL)
        assert 3 not in s.failed_rounds and s.dropped[3] == {} and self.exact(3, ALL)
        dropped = s.dropped[2]
        assert not set(dropped) & set(HONEST), f"honest node dropped: {dropped}"
        if 2 in s.failed_rounds:
            assert all(np.array_equal(self.models[2][k], self.models[1][k]) for k in MODEL)
            return "failed"
        if FAULTY in dropped:
            assert dropped[FAULTY]
            assert self.exact(2, HONEST if aggregated is None else aggregated)
            return "dropped"
        assert self.exact(2, ALL)
        return "harmless"


def _add_to_word(value: bytes, index: int, amount: int) -> bytes:
    """Add ``amount`` (mod p) to the u32 word at ``index`` of a word block's tail."""
    words = np.frombuffer(value, dtype="<u4").astype(np.uint64)
    words[index] = (words[index] + amount) % 4294967291
    return words.astype("<u4").tobytes()


def _corrupt_pieces(count: int) -> Callable[[bytes], bytes]:
    """Flip one byte in the sealed evaluations for the first ``count`` recipients."""

    def change(bundle: bytes) -> bytes:
        out = bytearray(bundle)
        head = 5 + 4 + 4 * 2  # FSEB header, group count, two slot counts
        n = int.from_bytes(bundle[head : head + 4], "little")
        pos = head + 4
        for i in range(n):
            size = int.from_bytes(bundle[pos + 8 : pos + 12], "little")
            if i < count:
                out[pos + 12 + size // 2] ^= 0x01
            pos += 12 + size
        return bytes(out)

    return change


# The "wrong" reply of each phase: format-valid, wrong content.
WRONG: dict[str, Callable[[RecordDict], RecordDict]] = {
    # another public key: the node then refuses the roster that lacks its own key
    "advertise": rewrite_config_bytes(SESA_KEY, "advertise", lambda v: b"\x07" * len(v)),
    # one sealed evaluation corrupted: its recipient complains, the sender is excluded
    "offline": rewrite_config_bytes(SESA_KEY, "bundle", _corrupt_pieces(1)),
    # x of the output bias (the last group: 3 values and the count word) shifted by 2^28 in
    # its first value: the decoded sum (+256 at 20 fractional bits) leaves clip x count = 80
    "train": rewrite_config_bytes(
        SESA_KEY, "masked", lambda v: v[:-16] + _add_to_word(v[-16:], 0, 1 << 28)
    ),
    # psi shifted in one word: it leaves the polynomial the other 9 evaluations lie on
    "decode": rewrite_config_bytes(
        SESA_KEY, "evaluation", lambda v: v[:5] + _add_to_word(v[5:], 0, 12345)
    ),
}

# phase -> kind -> expected verdict of round 2
EXPECTED = {
    "advertise": dict.fromkeys(FAULT_KINDS, "dropped"),
    "offline": dict.fromkeys(FAULT_KINDS, "dropped"),
    # "duplicate": train streams its replies; the engine fails the round when a node whose
    # reply was already used replies again (core/replies.py; "dropped" if the engine ever
    # drops that node instead: SESA then leaves it out of U3)
    "train": {**dict.fromkeys(FAULT_KINDS, "dropped"), "duplicate": "failed", "wrong": "failed"},
    "decode": dict.fromkeys(FAULT_KINDS, "dropped"),
}


# An identical duplicate reply: this engine drops the node (and fails a streamed phase whose
# first reply was used); an engine that takes an identical duplicate once makes it harmless.
# SESA is correct under both: only the nodes the engine keeps go on.
DUPLICATE = {
    "advertise": ("dropped", "harmless"),
    "offline": ("dropped", "harmless"),
    "train": ("failed", "dropped", "harmless"),
    "decode": ("dropped", "harmless"),
}


@pytest.mark.parametrize("kind", FAULT_KINDS)
@pytest.mark.parametrize("phase", PHASES)
def test_one_faulty_node_costs_only_itself(phase: str, kind: str) -> None:
    fault = ReplyFault(
        FAULTY, kind, family=SESA_KEY, phase=phase, occurrence=1,
        rewrite=WRONG[phase] if kind == "wrong" else None, extra_bytes=4096,
    )  # fmt: skip
    run = Run(fault)
    assert fault.applied == 1
    # A node lost at decode sent its masked update first: it is aggregated (Theorem 3).
    aggregated = ALL if phase == "decode" else HONEST
    verdict = run.verdict(aggregated)
    if kind == "duplicate":  # the engine's choice (core/replies.py): see DUPLICATE
        assert verdict in DUPLICATE[phase], run.strategy.dropped[2]
    else:
        assert verdict == EXPECTED[phase][kind], run.strategy.dropped[2]


@pytest.mark.parametrize("flipped", [1, 3, 9])
def test_corrupted_sealed_evaluations_drop_their_sender_only(flipped: int) -> None:
    # Issue 24: 1 flipped piece dropped 1 honest client, 3 dropped 2, 9 failed the round.
    fault = ReplyFault(
        FAULTY, "wrong", family=SESA_KEY, phase="offline", occurrence=1,
        rewrite=rewrite_config_bytes(SESA_KEY, "bundle", _corrupt_pieces(flipped)),
    )  # fmt: skip
    run = Run(fault)
    assert run.verdict() == "dropped"
    assert set(run.strategy.dropped[2]) == {FAULTY}
    assert "did not open" in run.strategy.dropped[2][FAULTY]


def test_a_round_one_bundle_replayed_in_round_two_drops_its_sender_only() -> None:
    fault = ReplyFault(FAULTY, "replay", family=SESA_KEY, phase="offline", occurrence=1)
    run = Run(fault)
    assert run.verdict() == "dropped"
    assert set(run.strategy.dropped[2]) == {FAULTY}
    assert "did not open for client(s)" in run.strategy.dropped[2][FAULTY]


def test_a_duplicated_offline_reply_is_never_sent_train_nor_aggregated() -> None:
    # Issue 24 item 2: the node was recorded as dropped yet trained and was aggregated. Now a
    # node is recorded as dropped (this engine) and is then never sent train nor aggregated,
    # or its identical duplicate is taken once (an engine that ignores duplicates): exact.
    seen: list[int] = []

    def spy(node: int, request: Message, reply: Message) -> list[Message]:
        record = request.content.config_records.get(SESA_KEY)
        if record is not None and record["phase"] == "train" and request.metadata.group_id == "2":
            seen.append(node)
        return list(fault(node, request, reply))

    fault = ReplyFault(FAULTY, "duplicate", family=SESA_KEY, phase="offline", occurrence=1)
    run = Run(spy)
    verdict = run.verdict()
    assert verdict in ("dropped", "harmless")
    assert (FAULTY in seen) == (verdict == "harmless")
    assert sorted(set(seen) - {FAULTY}) == HONEST


def test_a_node_the_transport_drops_after_accepting_its_reply_is_never_sent_train() -> None:
    # One survivors set per round, the engine's: whatever the exchange does not return (a node
    # the engine dropped after the protocol took its reply) goes no further.
    from flwr_fsl.core.exchange import local_exchange
    from flwr_fsl.families.sesa.server import SesaParty, SesaRoundServer
    from flwr_fsl.families.sesa.settings import SesaSettings

    def train(m: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        return {k: v + np.float32(0.01) for k, v in m.items()}, 1.0

    parties = {n: SesaParty(n, RATES[n - 1000], train, np.random.default_rng(n)) for n in ALL}
    inner = local_exchange(parties, {})
    asked: dict[str, list[int]] = {}

    def exchange(label: str, asks: Any, accept: Any) -> dict[int, Any]:
        asked[label] = sorted(asks)
        replies = inner(label, asks, accept)
        if label == "offline":
            replies.pop(FAULTY)  # taken by the protocol, then dropped by the transport
        return replies

    server = SesaRoundServer(SesaSettings(num_shards=4, frac_bits=20, max_clients=50))
    result = server.run(exchange, MODEL, ALL, 1, 2)
    assert asked["train"] == HONEST and asked["decode"] == HONEST
    assert list(result.clients) == HONEST
    for name, value in MODEL.items():
        step = result.model[name] - value
        assert np.all(np.isclose(step, 0.0, atol=1e-5) | np.isclose(step, 0.01, atol=1e-5))


def test_a_replayed_masked_update_is_refused_as_bound_to_another_round() -> None:
    fault = ReplyFault(FAULTY, "replay", family=SESA_KEY, phase="train", occurrence=1)
    run = Run(fault)
    assert run.verdict() == "dropped"
    assert "another round" in run.strategy.dropped[2][FAULTY]


def test_a_masked_update_out_of_bounds_fails_the_round_with_the_model_unchanged() -> None:
    fault = ReplyFault(
        FAULTY, "wrong", family=SESA_KEY, phase="train", occurrence=1, rewrite=WRONG["train"]
    )
    run = Run(fault)
    assert run.verdict() == "failed"
    assert "outside its bounds" in run.strategy.failed_rounds[2]


def test_a_lying_complainer_excludes_at_most_one_honest_sender_or_itself() -> None:
    # Rule of flwr_fsl.families.sesa.attribution, on the server's resolver directly.
    from flwr_fsl.families.sesa.attribution import resolve_complaints

    members = list(range(10))
    assert set(resolve_complaints({3: (7,)}, members)) == {7}
    several = resolve_complaints({3: (1, 2, 7)}, members)
    assert set(several) == {3}
    both = resolve_complaints({3: (7,), 7: (3,)}, members)
    assert set(both) == {3, 7}
    # A faulty sender named by many honest recipients: only it goes.
    assert set(resolve_complaints({i: (5,) for i in range(10) if i != 5}, members)) == {5}
    # Complaints about or from non-members change nothing.
    assert resolve_complaints({3: (42,), 42: (3,)}, members) == {}


def test_the_masked_update_format_is_versioned_and_bound_to_the_round() -> None:
    from flwr_fsl.families.sesa.protocol import SesaGroup, SesaParams

    p1 = SesaParams(1, b"s" * 16, 1, (SesaGroup(2, 3),))
    p2 = SesaParams(2, b"s" * 16, 1, (SesaGroup(2, 3),))
    data = sm._masked_to_bytes([np.zeros((1, 3), np.uint64)], p1, (5,))
    assert data[4] == sm.MASKED_VERSION == 2
    assert sm._read_masked(data, p1)[1] == (5,)
    with pytest.raises(sm.SesaError, match="another round"):
        sm._read_masked(data, p2)


def _complain_about(*senders: int) -> Callable[[RecordDict], RecordDict]:
    """Rewrite a masked update (FSEX v2) to carry a complaint naming ``senders``."""

    def change(value: bytes) -> bytes:
        ids = sorted(senders)
        head = 5 + 32  # magic, version, the round's parameter digest
        assert value[head : head + 4] == bytes(4)  # the honest complaint was empty
        named = len(ids).to_bytes(4, "little") + b"".join(i.to_bytes(8, "little") for i in ids)
        return value[:head] + named + value[head + 4 :]

    return rewrite_config_bytes(SESA_KEY, "masked", change)


def test_a_lying_complaint_about_one_sender_excludes_that_sender_only() -> None:
    # The bound of the complaint rule, end to end: the server cannot check a complaint, so a
    # lie naming one honest sender costs that sender (and nothing else); the round stays exact
    # over everyone else, the liar included.
    fault = ReplyFault(
        FAULTY, "wrong", family=SESA_KEY, phase="train", occurrence=1,
        rewrite=_complain_about(1005),
    )  # fmt: skip
    run = Run(fault)
    assert set(run.strategy.dropped[2]) == {1005}
    assert f"client(s) [{FAULTY}]" in run.strategy.dropped[2][1005]
    assert 2 not in run.strategy.failed_rounds
    assert run.exact(2, [n for n in ALL if n != 1005]) and run.exact(3, ALL)


def test_a_complaint_naming_several_senders_excludes_only_the_complainer() -> None:
    fault = ReplyFault(
        FAULTY, "wrong", family=SESA_KEY, phase="train", occurrence=1,
        rewrite=_complain_about(1000, 1005),
    )  # fmt: skip
    run = Run(fault)
    assert run.verdict() == "dropped"
    assert set(run.strategy.dropped[2]) == {FAULTY}
    assert "only the complainer" in run.strategy.dropped[2][FAULTY]
