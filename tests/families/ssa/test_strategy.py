"""SecureFedSubAvg + ssa_mod + the in-process S1: equals plaintext top-k FedSubAvg; failures."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.records import SSA_UPLOAD_KEY
from flwr_fsl.helper import HelperUnavailableError, InProcessHelper
from flwr_fsl.helper.limits import HelperLimits
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, corrupt_mod, make_app, model_record, unit_weight_mod
from tests.helper.test_helper import open_rounds


@pytest.fixture(scope="module")
def helper_key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def _secure_run(key, rounds=2, mods=(), num_nodes=4, helper=None, ratio=0.2, weighted=False, **kw):  # type: ignore[no-untyped-def]
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([*mods, ssa_mod, topk_mod]), num_nodes, run_config)
    helper = helper or InProcessHelper(keypair=key)
    strategy = SecureFedSubAvg(
        helper,
        topk_ratio=ratio,
        helper_fingerprint=key.fingerprint,
        min_available_nodes=num_nodes,
        frac_bits=32,
        max_abs=1e3,
        weighted=weighted,
        **kw,
    )
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=rounds)
    return strategy, result, grid


def _plaintext_run(k: int, rounds: int = 2, num_nodes: int = 4, drop=None, weighted=False):  # type: ignore[no-untyped-def]
    """Plaintext top-k FedSubAvg: weighted by num-examples, or every client 1 (the default)."""
    grid = InProcessGrid(
        make_app([topk_mod] if weighted else [unit_weight_mod, topk_mod]),
        num_nodes,
        {"topk-count": k, "topk-error-feedback": False},
        drop_nodes=drop,
    )
    strategy = FedSubAvg(min_available_nodes=num_nodes)
    return strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=rounds)


def _k(ratio: float) -> int:
    m = sum(v.size for v in MODEL.values() if v.dtype == np.float32)
    return int(np.ceil(ratio * m))


@pytest.mark.parametrize("weighted", [False, True], ids=["unit-weights", "num-examples"])
def test_secure_round_equals_plaintext_topk_fedsubavg(
    helper_key: SealingKeyPair, weighted: bool
) -> None:
    strategy, secure, _ = _secure_run(helper_key, weighted=weighted)
    plain = _plaintext_run(_k(0.2), weighted=weighted)
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}, 2: {}}
    for name, value in MODEL.items():
        if value.dtype == np.float32:
            np.testing.assert_allclose(
                secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
            )
        else:  # integer buffers are not securely aggregated: unchanged
            np.testing.assert_array_equal(secure.arrays[name].numpy(), value)
    # What went up is DPF keys, not arrays.
    up = next(t for t in strategy.traffic if t.phase == "train")
    assert all(v > 0 for v in up.up_bytes.values())


def test_value_checked_rounds_equal_plaintext_and_cost_more_upload(
    helper_key: SealingKeyPair,
) -> None:
    """``value_check="exact"`` through Flower: the same model as plaintext top-k, a larger upload.

    The default (``"projected"``) is exact too
    (``test_secure_round_equals_plaintext_topk_fedsubavg``) and costs a fixed trailer per
    client, less than the exact check here.
    """
    checked, secure, _ = _secure_run(helper_key, value_check="exact")
    plain = _plaintext_run(_k(0.2))
    assert checked.failed_rounds == {} and checked.dropped == {1: {}, 2: {}}
    for name, value in MODEL.items():
        if value.dtype == np.float32:
            np.testing.assert_allclose(
                secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
            )
    default, _, _ = _secure_run(helper_key)
    off_helper = InProcessHelper(keypair=helper_key, limits=HelperLimits(min_value_check="off"))
    off, _, _ = _secure_run(helper_key, helper=off_helper, value_check="off")

    def upload(strategy: SecureFedSubAvg) -> int:
        return sum(next(t for t in strategy.traffic if t.phase == "train").up_bytes.values())

    assert upload(checked) > 1.5 * upload(off)
    assert upload(off) < upload(default) < upload(checked)


def test_reply_content_has_no_arrays(helper_key: SealingKeyPair) -> None:
    seen: list[RecordDict] = []

    def spy(msg, context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        if msg.metadata.message_type == "train":
            seen.append(reply.content)
        return reply

    _secure_run(helper_key, rounds=1, mods=(spy,))
    # Issue 8 item 1: nothing but the sealed/keyed upload; no weight, no metric in the clear.
    assert seen and all(set(c.keys()) == {SSA_UPLOAD_KEY} for c in seen)
    assert all(not c.array_records and not c.metric_records for c in seen)


def _garble(c: RecordDict) -> RecordDict:
    rec = c[SSA_UPLOAD_KEY]
    rec["public"] = bytes(rec["public"])[:-7]  # type: ignore[arg-type]
    return c


def _tamper_sealed(c: RecordDict) -> RecordDict:
    rec = c[SSA_UPLOAD_KEY]
    sealed = bytearray(rec["sealed"])  # type: ignore[arg-type]
    sealed[-1] ^= 1
    rec["sealed"] = bytes(sealed)
    return c


@pytest.mark.parametrize("corrupt, reason", [(_garble, "public"), (_tamper_sealed, "S1")])
def test_bad_client_is_dropped_and_the_rest_stays_exact(
    helper_key: SealingKeyPair,
    corrupt,
    reason: str,  # type: ignore[no-untyped-def]
) -> None:
    strategy, secure, grid = _secure_run(helper_key, rounds=1, mods=(corrupt_mod(1, corrupt),))
    bad = list(grid.get_node_ids())[1]
    assert set(strategy.dropped[1]) == {bad}
    plain = _plaintext_run(_k(0.2), rounds=1, drop=lambda node, _: node == bad)
    for name in ("conv.weight", "emb.weight", "fc.bias"):
        np.testing.assert_allclose(
            secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
        )


def test_replayed_upload_is_rejected(helper_key: SealingKeyPair) -> None:
    """A reply replayed into the next round is bound to its round: S1 rejects it."""
    grid = InProcessGrid(
        make_app([ssa_mod, topk_mod]), 2, {"ssa-helper-fingerprint": helper_key.fingerprint}
    )
    strategy = SecureFedSubAvg(InProcessHelper(keypair=helper_key), topk_ratio=0.2)
    arrays = model_record()
    msgs = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    old = list(grid.send_and_receive(msgs))
    strategy.aggregate_train(1, old)
    msgs = list(strategy.configure_train(2, arrays, ConfigRecord(), grid))
    fresh = list(grid.send_and_receive(msgs))
    by_node = {r.metadata.src_node_id: r for r in old}
    replay = Message(by_node[fresh[0].metadata.src_node_id].content, reply_to=msgs[0])
    replay.metadata.group_id = "2"
    strategy.aggregate_train(2, [replay, fresh[1]])
    assert fresh[0].metadata.src_node_id in strategy.dropped[2]


def test_helper_unreachable_fails_round_and_keeps_model(helper_key: SealingKeyPair) -> None:
    helper = InProcessHelper(keypair=helper_key)
    grid = InProcessGrid(
        make_app([ssa_mod, topk_mod]), 2, {"ssa-helper-fingerprint": helper_key.fingerprint}
    )
    strategy = SecureFedSubAvg(helper, topk_ratio=0.2)
    msgs = list(strategy.configure_train(1, model_record(), ConfigRecord(), grid))
    replies = list(grid.send_and_receive(msgs))
    helper.close()
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is None and metrics is None
    assert "HelperUnavailableError" in strategy.failed_rounds[1]
    with pytest.raises(HelperUnavailableError):
        helper.public_key()


def test_client_refuses_an_unpinned_helper_key(helper_key: SealingKeyPair) -> None:
    impostor = InProcessHelper(keypair=SealingKeyPair.generate())
    grid = InProcessGrid(
        make_app([ssa_mod, topk_mod]), 2, {"ssa-helper-fingerprint": helper_key.fingerprint}
    )
    strategy = SecureFedSubAvg(impostor, topk_ratio=0.2)
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    result = failed.value.result
    assert all("fingerprint" in r for r in strategy.dropped[1].values())
    for name, value in MODEL.items():
        np.testing.assert_array_equal(result.arrays[name].numpy(), value)


def test_client_that_drops_after_training_contributes_nothing(helper_key: SealingKeyPair) -> None:
    run_config = {"ssa-helper-fingerprint": helper_key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([ssa_mod, topk_mod]), 3, run_config)
    gone = list(grid.get_node_ids())[2]
    grid._drop_nodes = lambda node, _: node == gone
    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=helper_key),
        topk_ratio=0.2,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=3,
    )
    secure = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    plain = _plaintext_run(_k(0.2), rounds=1, num_nodes=3, drop=lambda node, _: node == gone)
    np.testing.assert_allclose(
        secure.arrays["conv.weight"].numpy(), plain.arrays["conv.weight"].numpy(), atol=1e-6
    )


def test_constructor_validation() -> None:
    with pytest.raises(ConfigurationError, match="topk_ratio"):
        SecureFedSubAvg(InProcessHelper(), topk_ratio=0.0)
    # Issue 20: no federated evaluation unless asked for explicitly; unit weights by default.
    helper = InProcessHelper()
    assert SecureFedSubAvg(helper, topk_ratio=0.1).fraction_evaluate == 0.0
    with pytest.raises(ConfigurationError, match="evaluate_fn"):
        SecureFedSubAvg(helper, topk_ratio=0.1, fraction_evaluate=1.0)
    opted = SecureFedSubAvg(
        helper, topk_ratio=0.1, fraction_evaluate=1.0, plaintext_evaluation=True
    )
    assert opted.fraction_evaluate == 1.0 and not opted.aggregation.settings.weighted
    with pytest.raises(ConfigurationError, match="weighted"):
        SecureFedSubAvg(helper, topk_ratio=0.1, weighted=1)  # type: ignore[arg-type]


def test_helper_view_has_no_index_or_value_in_the_clear(helper_key: SealingKeyPair) -> None:
    """Everything S1 receives, for two clients with different known index sets of equal size."""
    from flwr.app import Array, ArrayRecord, Context, MetricRecord
    from flwr.clientapp import ClientApp

    from flwr_fsl.helper import HelperService

    m, k = 4096, 40
    chosen = {0: np.arange(100, 100 + k), 1: np.arange(3000, 3000 + 3 * k, 3)}
    app = ClientApp(mods=[ssa_mod, topk_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        w = msg.content["arrays"]["w"].numpy().copy()
        w[chosen[pid]] += np.float32(0.123456)
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({"w": Array(w)}),
                    "metrics": MetricRecord({"num-examples": 7}),
                }
            ),
            reply_to=msg,
        )

    service = HelperService(helper_key)
    received: list[bytes] = []
    handle = service.handle

    def spy(method: str, request: bytes, secret: bytes | None = None) -> bytes:
        received.append(bytes(request))
        return handle(method, request, secret)

    service.handle = spy  # type: ignore[method-assign]
    grid = InProcessGrid(app, 2, {"ssa-helper-fingerprint": helper_key.fingerprint})
    strategy = SecureFedSubAvg(InProcessHelper(service), topk_ratio=k / m, fraction_evaluate=0.0)
    initial = ArrayRecord({"w": Array(np.zeros(m, np.float32))})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
    w = result.arrays["w"].numpy()
    assert np.count_nonzero(w) == 2 * k  # the aggregate itself is public to both servers
    blob = b"".join(received)
    for idx in chosen.values():
        for dtype in (np.int64, np.int32, np.uint64):
            assert idx[:4].astype(dtype).tobytes() not in blob
    for value in (np.float32(0.123456), np.float64(np.float32(0.123456))):
        assert value.tobytes() not in blob


class _DownAtFirst:
    """S1 that cannot be reached during round 1 (every call fails), then comes back."""

    def __init__(self, inner: InProcessHelper) -> None:
        self.inner, self.down = inner, True

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        target = getattr(self.inner, name)
        if not callable(target) or not self.down:
            return target

        def unreachable(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise HelperUnavailableError(f"S1 unreachable ({name})")

        return unreachable


def test_helper_unreachable_at_the_first_round_fails_it_before_anyone_trains(
    helper_key: SealingKeyPair,
) -> None:
    # Issue 8 item 9: S1 down at round 1 is a failed round (model unchanged, no client asked to
    # train for nothing), not an exception out of start(); round 2 trains once S1 is back.
    helper = _DownAtFirst(InProcessHelper(keypair=helper_key))
    grid = InProcessGrid(
        make_app([ssa_mod, topk_mod]), 3, {"ssa-helper-fingerprint": helper_key.fingerprint}
    )
    strategy = SecureFedSubAvg(helper, topk_ratio=0.2, min_available_nodes=3)  # type: ignore[arg-type]
    seen: dict[int, dict[str, np.ndarray]] = {}

    def evaluate_fn(rnd, arrays):  # type: ignore[no-untyped-def]
        seen[rnd] = {k: v.numpy().copy() for k, v in arrays.items()}
        helper.down = rnd < 1  # S1 comes back after round 1
        return None

    strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=2, evaluate_fn=evaluate_fn)
    assert "HelperUnavailableError" in strategy.failed_rounds[1] and 2 not in strategy.failed_rounds
    assert not [t for t in strategy.rounds[1].traffic if t.phase == "train"]
    for name, value in MODEL.items():
        np.testing.assert_array_equal(seen[1][name], value)
    assert any(
        not np.array_equal(seen[2][n], MODEL[n]) for n in MODEL if MODEL[n].dtype == np.float32
    )


def test_a_round_below_minimum_participation_fails_unreconstructed(
    helper_key: SealingKeyPair,
) -> None:
    # Issue 8 item 2: three sampled, one drops out; with min_clients=3 the two-client aggregate
    # is never reconstructed and the model stays as it was.
    def boom(c: RecordDict) -> RecordDict:
        raise RuntimeError("client crashed")

    run_config = {"ssa-helper-fingerprint": helper_key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([corrupt_mod(0, boom), ssa_mod, topk_mod]), 3, run_config)
    helper = InProcessHelper(keypair=helper_key)
    strategy = SecureFedSubAvg(helper, topk_ratio=0.2, min_available_nodes=3, min_clients=3)
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    result = failed.value.result
    assert "minimum participation is 3" in strategy.failed_rounds[1]
    for name, value in MODEL.items():
        np.testing.assert_array_equal(result.arrays[name].numpy(), value)
    assert open_rounds(helper) == ()  # the failed round was released on S1
    with pytest.raises(ConfigurationError, match="min_clients"):
        SecureFedSubAvg(helper, topk_ratio=0.2, min_clients=0)


def test_s1_refuses_a_one_client_round_even_if_s0_would_run_it(
    helper_key: SealingKeyPair,
) -> None:
    # S0 configured (or compromised) to reconstruct single-client rounds: S1's own minimum
    # (default 2, flwr-fsl-helper --min-clients) refuses to return its share.
    run_config = {"ssa-helper-fingerprint": helper_key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([ssa_mod, topk_mod]), 1, run_config)
    helper = InProcessHelper(keypair=helper_key)
    strategy = SecureFedSubAvg(
        helper,
        topk_ratio=0.2,
        min_available_nodes=1,
        min_train_nodes=1,
        fraction_evaluate=0.0,
        min_clients=1,
    )
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    result = failed.value.result
    assert "S1's minimum participation 2" in strategy.failed_rounds[1]
    for name, value in MODEL.items():
        np.testing.assert_array_equal(result.arrays[name].numpy(), value)


def test_flowers_own_loop_gets_a_failed_round_not_an_exception_when_s1_is_down(
    helper_key: SealingKeyPair,
) -> None:
    # configure_train / aggregate_train as Flower's Strategy.start (or a wrapper) calls them.
    helper = _DownAtFirst(InProcessHelper(keypair=helper_key))
    grid = InProcessGrid(
        make_app([ssa_mod, topk_mod]), 2, {"ssa-helper-fingerprint": helper_key.fingerprint}
    )
    strategy = SecureFedSubAvg(helper, topk_ratio=0.2)  # type: ignore[arg-type]
    assert list(strategy.configure_train(1, model_record(), ConfigRecord(), grid)) == []
    assert strategy.aggregate_train(1, []) == (None, None)
    assert "HelperUnavailableError" in strategy.failed_rounds[1]


class _OneReplyPerPull(InProcessGrid):
    """A grid whose replies arrive one per pull, like a real SuperLink's as clients finish."""

    synchronous = False
    pull_interval = 0.0

    def __init__(self, *args, events: list[str], **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.events = events

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        ids = [i for i in message_ids if i in self._replies][:1]
        self.events.append(f"pull {len(ids)}")
        return [r for i in ids for r in self._replies.pop(i)]


class _RecordingHelper(InProcessHelper):
    def __init__(self, *args, events: list[str], **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.events = events

    def add_clients(self, round_id, uploads):  # type: ignore[no-untyped-def]
        uploads = list(uploads)
        self.events.append(f"relay {len(uploads)}")
        return super().add_clients(round_id, uploads)

    def add_checked(self, round_id, items, *, hints):  # type: ignore[no-untyped-def]
        items = list(items)  # a checked round (the default) relays with S0's digests
        self.events.append(f"relay {len(items)}")
        return super().add_checked(round_id, items, hints=hints)


def test_uploads_are_relayed_to_s1_as_they_arrive(helper_key: SealingKeyPair) -> None:
    # Issue 8 item 8, S0's side: under start(), S0 relays (and evaluates) each chunk of uploads
    # before it pulls the next reply, so it never holds a round's uploads together, and the
    # result is the plaintext one.
    events: list[str] = []
    run_config = {"ssa-helper-fingerprint": helper_key.fingerprint, "topk-error-feedback": False}
    grid = _OneReplyPerPull(make_app([ssa_mod, topk_mod]), 4, run_config, events=events)
    helper = _RecordingHelper(keypair=helper_key, events=events)
    strategy = SecureFedSubAvg(
        helper, topk_ratio=0.2, min_available_nodes=4, frac_bits=32, max_abs=1e3
    )
    strategy.aggregation.lead.relay_chunk_bytes = 1  # one upload per chunk
    secure = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    train = events[: events.index("relay 1") + 8]
    assert [e for e in train if e.startswith("relay")] == ["relay 1"] * 4
    # Relays interleave with pulls: the first upload reached S1 before the last reply was pulled.
    assert train.index("relay 1") < max(i for i, e in enumerate(train) if e == "pull 1")
    plain = _plaintext_run(_k(0.2), rounds=1)
    for name in ("conv.weight", "emb.weight", "fc.bias"):
        np.testing.assert_allclose(
            secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
        )


def test_a_late_node_under_streaming_is_dropped_at_the_timeout(helper_key: SealingKeyPair) -> None:
    # A reply that never comes on an asynchronous grid: the phase ends at the timeout, the node
    # is dropped with that reason and the others' aggregate is exact.
    events: list[str] = []
    run_config = {"ssa-helper-fingerprint": helper_key.fingerprint, "topk-error-feedback": False}
    grid = _OneReplyPerPull(make_app([ssa_mod, topk_mod]), 3, run_config, events=events)
    gone = list(grid.get_node_ids())[2]
    grid._drop_nodes = lambda node, msg: node == gone and msg.metadata.message_type == "train"
    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=helper_key),
        topk_ratio=0.2,
        min_available_nodes=3,
        frac_bits=32,
        max_abs=1e3,
        fraction_evaluate=0.0,
    )
    secure = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1, timeout=0.5)
    assert "no reply before the timeout" in strategy.dropped[1][gone]
    plain = _plaintext_run(_k(0.2), rounds=1, num_nodes=3, drop=lambda node, _: node == gone)
    np.testing.assert_allclose(
        secure.arrays["conv.weight"].numpy(), plain.arrays["conv.weight"].numpy(), atol=1e-6
    )


def test_two_strategies_share_one_helper_connection(helper_key: SealingKeyPair) -> None:
    # Each start() opens its own S1 session: the second strategy's rounds are not refused as
    # "already opened" and its result is as exact as the first's.
    helper = InProcessHelper(keypair=helper_key)
    plain = _plaintext_run(_k(0.2))
    for _ in range(2):
        strategy, secure, _ = _secure_run(helper_key, helper=helper)
        assert strategy.failed_rounds == {}
        for name, value in MODEL.items():
            if value.dtype == np.float32:
                np.testing.assert_allclose(
                    secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
                )
    assert helper.service.session_count() == 1
