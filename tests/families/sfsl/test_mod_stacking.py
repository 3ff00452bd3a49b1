"""The SecAgg client mods stack, and PerturbedRows takes its randomized response per training.

* ``secagg_mod`` owns the SecAgg instance ``"model"``, ``PerturbedRows`` ``"union"`` and
  ``"rows"``: each passes the others' messages through untouched, refuses an unknown phase of
  its own and a malformed ``instance``; stacked in either order on one ClientApp they serve
  ``SecAggFedAvg`` and ``SFSLFedSubAvg`` on the same nodes, each equal to its plaintext
  average.
* ``SFSLFedSubAvg`` sends the round's train config with the perturb phase;
  ``PerturbedRows(rr=f(config, context), session_key=...)`` chooses ``p1..p4`` from it and keeps
  one memo of permanent answers per session (in ``Context.state`` and in ``memo_dir``): a
  session's answers persist across its rounds and never reach another session, ``p1, p2``
  cannot change within one, and a message without the session entry is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from flwr.clientapp.typing import Mod

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RunFailedError
from flwr_fsl.families.secagg.records import SECAGG_KEY
from flwr_fsl.families.sfsl.mod import SFSL_INSTANCES
from flwr_fsl.families.sfsl.perturb import PermanentMemo, RRParams
from flwr_fsl.mods import PerturbedRows, secagg_mod
from flwr_fsl.strategies import SecAggFedAvg, SFSLFedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.families.sfsl.test_strategy import (
    MODEL,
    PAPER,
    counts,
    paper_grid,
    real_rows,
    reference,
    row_delta,
)

N = 5
CPP = {"cpp1": RRParams.symmetric(1, 0), "cpp5": RRParams.symmetric(1, 1)}
COIN = RRParams(0.5, 0.5, 1.0, 0.0)  # S'' = the permanent "yes" answers, half of them random


def _rows(context: Context) -> tuple[np.ndarray, np.ndarray]:
    pid = int(context.node_config["partition-id"])
    return real_rows(pid), counts(pid)


def _union() -> np.ndarray:
    return np.unique(np.concatenate([real_rows(p) for p in range(N)]))


def _app(mods: list[Mod], seen: dict[str, dict[int, Any]]) -> ClientApp:
    """One ClientApp for both strategies; ``seen`` records what the client sent and got."""

    def spy(msg, context, call_next):  # type: ignore[no-untyped-def]
        pid = int(context.node_config["partition-id"])
        record = msg.content.config_records.get(SECAGG_KEY)
        if record is not None and record.get("phase") == "perturb":
            seen.setdefault("perturb-config", {})[pid] = msg.content.config_records.get("config")
        if record is not None and record.get("phase") == "train":
            seen.setdefault("train-config", {})[pid] = msg.content.config_records.get("config")
        reply = call_next(msg, context)
        out = reply.content.config_records.get(SECAGG_KEY) if reply.has_content() else None
        if out is not None and "perturbed" in out:
            seen.setdefault("perturbed", {})[pid] = np.frombuffer(out["perturbed"], "<i8")
        return reply

    app = ClientApp(mods=[spy, *mods])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        arrays = {k: a.numpy().copy() for k, a in msg.content["arrays"].items()}
        for r in real_rows(pid):
            arrays["emb"][r] += row_delta(pid, int(r)).astype(np.float32)
        arrays["fc"] += np.float32(pid)
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                    "metrics": MetricRecord({"num-examples": 10 * (pid + 1)}),
                }
            ),
            reply_to=msg,
        )

    return app


def _initial() -> ArrayRecord:
    return ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})


def _sfsl(grid: InProcessGrid, **train_config: Any) -> tuple[SFSLFedSubAvg, Any]:
    strategy = SFSLFedSubAvg(
        "emb", min_available_nodes=N, fraction_evaluate=0.0, max_count=100.0, **PAPER
    )
    try:
        result = strategy.start(
            grid=grid,
            initial_arrays=_initial(),
            num_rounds=1,
            train_config=ConfigRecord(train_config),
        )
    except RunFailedError as err:  # every round failed: the run fails; callers assert the rounds
        result = err.result
    return strategy, result


def _choose(config: ConfigRecord, context: Context) -> RRParams:
    return COIN if config["cpp"] == "coin" else CPP[str(config["cpp"])]


# ---- pass-through and strictness ---------------------------------------------------------------


def _message(instance: object, phase: str) -> tuple[Message, Context]:
    """A SecAgg train message for node 1000 and that node's (fresh) context."""
    grid = InProcessGrid(ClientApp(), 1)  # also sets Flower's task identity for Message()
    record = ConfigRecord({"phase": phase})
    if instance is not None:
        record["instance"] = instance  # type: ignore[assignment]
    return grid.create_message(RecordDict({SECAGG_KEY: record}), "train", 1000, "1"), grid.context(
        1000
    )


PERTURBED = PerturbedRows("emb", rows=_rows, rr=CPP["cpp1"])
MODS = {"secagg_mod": secagg_mod, "PerturbedRows.mod": PERTURBED.mod}
FOREIGN = [
    ("secagg_mod", instance, phase)
    for instance in SFSL_INSTANCES
    for phase in ("advertise", "share", "train", "perturb", "unmask", "no-such-phase")
] + [
    ("PerturbedRows.mod", instance, phase)
    for instance in ("model", None, "another")  # None: no instance field, i.e. "model"
    for phase in ("advertise", "share", "train", "unmask", "no-such-phase")
]


@pytest.mark.parametrize("mod, instance, phase", FOREIGN)
def test_a_mod_passes_other_instances_messages_through_untouched(
    mod: str, instance: str | None, phase: str
) -> None:
    passed: list[Message] = []
    sentinel = object()

    def call_next(msg: Message, context: Context) -> Any:
        passed.append(msg)
        return sentinel

    msg, context = _message(instance, phase)
    assert MODS[mod](msg, context, call_next) is sentinel
    assert passed == [msg]
    assert len(context.state) == 0  # no SecAgg state was created for another's aggregation


@pytest.mark.parametrize(
    "mod, instance, phase",
    [
        ("secagg_mod", "model", "perturb"),
        ("secagg_mod", None, "no-such-phase"),
        ("PerturbedRows.mod", "union", "perturb"),
        ("PerturbedRows.mod", "rows", "no-such-phase"),
        ("PerturbedRows.mod", "union", "no-such-phase"),
    ],
)
def test_an_unknown_phase_of_a_mods_own_instance_is_refused(
    mod: str, instance: str | None, phase: str
) -> None:
    def call_next(msg: Message, context: Context) -> Message:
        raise AssertionError("a message of the mod's own instance must not pass through")

    with pytest.raises(ClientInputError, match=r"unknown (SecAgg|SFSL) phase"):
        MODS[mod](*_message(instance, phase), call_next)


@pytest.mark.parametrize("mod", sorted(MODS))
@pytest.mark.parametrize("instance", [5, "", "two words", "rows;drop", b"rows", ["rows"]])
def test_a_malformed_instance_is_refused_by_both_mods(mod: str, instance: object) -> None:
    def call_next(msg: Message, context: Context) -> Message:
        raise AssertionError("a malformed SecAgg record must not pass through")

    with pytest.raises(ClientInputError, match="no valid instance"):
        MODS[mod](*_message(instance, "train"), call_next)


# ---- stacked on one ClientApp ------------------------------------------------------------------


@pytest.mark.parametrize("outer", ["PerturbedRows", "secagg_mod"])
def test_stacked_mods_serve_secagg_and_sfsl_on_the_same_nodes(outer: str) -> None:
    rows = PerturbedRows("emb", rows=_rows, rr=CPP["cpp1"])
    mods: list[Mod] = [rows.mod, secagg_mod] if outer == "PerturbedRows" else [secagg_mod, rows.mod]
    seen: dict[str, dict[int, Any]] = {}
    grid = paper_grid(_app(mods, seen), N)
    # Dense SecAgg first: FedAvg of the whole model, weights 10 (pid + 1).
    secagg = SecAggFedAvg(min_available_nodes=N, train_metrics=(), weighted=True)
    dense = secagg.start(grid=grid, initial_arrays=_initial(), num_rounds=1)
    assert secagg.failed_rounds == {} and secagg.dropped == {1: {}}
    weights = np.array([10.0 * (p + 1) for p in range(N)])
    emb = np.zeros_like(MODEL["emb"], dtype=np.float64)
    for pid, w in enumerate(weights):
        for r in real_rows(pid):
            emb[r] += w * row_delta(pid, int(r))
    np.testing.assert_allclose(dense.arrays["emb"].numpy(), emb / weights.sum(), atol=1e-5)
    fc = 1 + float(weights @ np.arange(N) / weights.sum())
    np.testing.assert_allclose(dense.arrays["fc"].numpy(), fc, atol=1e-5)
    # Then SFSL on the same nodes (same Context.state): the count-weighted row average.
    sfsl, result = _sfsl(grid)
    assert sfsl.failed_rounds == {} and sfsl.dropped == {1: {}}
    emb_ref, fc_ref = reference(range(N), seen["perturbed"])
    np.testing.assert_allclose(result.arrays["emb"].numpy(), emb_ref, atol=1e-5)
    np.testing.assert_allclose(result.arrays["fc"].numpy(), fc_ref, atol=1e-5)
    for node in grid.get_node_ids():  # each aggregation kept its own SecAgg state slot
        state = grid.context(node).state.config_records
        assert {"fsl.secagg.client-state", "fsl.secagg.union", "fsl.secagg.rows"} <= set(state)


# ---- the train config with the perturb phase, the memo per session -----------------------------


def test_the_perturb_phase_carries_the_rounds_train_config() -> None:
    seen: dict[str, dict[int, Any]] = {}
    rows = PerturbedRows("emb", rows=_rows, rr=_choose)
    grid = paper_grid(_app([rows.mod], seen), N)
    strategy, _ = _sfsl(grid, cpp="cpp1", lr=0.5)
    assert strategy.failed_rounds == {}
    for pid in range(N):
        config = dict(seen["perturb-config"][pid])
        assert config == {"cpp": "cpp1", "lr": 0.5, "server-round": 1}
        assert config == dict(seen["train-config"][pid])  # the rows phase's, too


def test_rr_per_training_and_one_memo_per_session() -> None:
    seen: dict[str, dict[int, Any]] = {}
    rows = PerturbedRows("emb", rows=_rows, rr=_choose, session_key="training-id")
    grid = paper_grid(_app([rows.mod], seen), N)
    union = _union()

    def memo(node: int, session: str) -> PermanentMemo:
        found = rows.memo(grid.context(node), session)
        assert found is not None
        return found

    # Training "a" under CPP1 (S'' = S), then "b" under CPP5 (S'' = U) on the same nodes.
    _sfsl(grid, cpp="cpp1", **{"training-id": "a"})
    first = dict(seen["perturbed"])
    _sfsl(grid, cpp="cpp5", **{"training-id": "b"})
    for pid, node in enumerate(grid.get_node_ids()):
        np.testing.assert_array_equal(first[pid], real_rows(pid))
        np.testing.assert_array_equal(seen["perturbed"][pid], union)  # no "no" of "a" leaked
        np.testing.assert_array_equal(memo(node, "a").yes, real_rows(pid))
        np.testing.assert_array_equal(memo(node, "a").no, np.setdiff1d(union, real_rows(pid)))
        np.testing.assert_array_equal(memo(node, "b").yes, union)
        assert memo(node, "b").no.size == 0
        assert rows.memo(grid.context(node)) is None  # nothing in the unscoped slot


def test_a_sessions_permanent_answers_persist_and_stay_in_it(tmp_path: Path) -> None:
    # COIN: each union row is answered "yes" by a fair permanent coin and S'' = the "yes" set.
    seen: dict[str, dict[int, Any]] = {}
    rows = PerturbedRows("emb", rows=_rows, rr=_choose, session_key="training-id")
    grid = paper_grid(_app([rows.mod], seen), N)
    runs = {}
    for session in ("a", "b", "a"):
        _sfsl(grid, cpp="coin", **{"training-id": session})
        runs.setdefault(session, []).append(dict(seen["perturbed"]))
    (a1, a2), (b,) = runs["a"], runs["b"]
    for pid in range(N):  # "a" again: the same answers, undisturbed by "b"
        np.testing.assert_array_equal(a1[pid], a2[pid])
    # "b" drew its own coins: over ~5 x 25 union rows, equal sets by chance has p ~ 2^-125.
    assert any(not np.array_equal(a1[pid], b[pid]) for pid in range(N))
    # On disk: one file per node and session; a restarted node (fresh state) keeps them.
    on_disk = PerturbedRows(
        "emb", rows=_rows, rr=_choose, session_key="training-id", memo_dir=tmp_path
    )
    before: dict[str, dict[int, Any]] = {}
    grid = paper_grid(_app([on_disk.mod], before), N)
    _sfsl(grid, cpp="coin", **{"training-id": "a"})
    _sfsl(grid, cpp="coin", **{"training-id": "b"})
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 * N and all(f.startswith("node-") and f.endswith(".rr") for f in files)
    after: dict[str, dict[int, Any]] = {}
    _sfsl(paper_grid(_app([on_disk.mod], after), N), cpp="coin", **{"training-id": "b"})
    for pid in range(N):
        np.testing.assert_array_equal(after["perturbed"][pid], before["perturbed"][pid])


@pytest.mark.parametrize("session_key", [None, "training-id"])
def test_p1_p2_cannot_change_within_one_memo_scope(session_key: str | None) -> None:
    rows = PerturbedRows("emb", rows=_rows, rr=_choose, session_key=session_key)
    grid = paper_grid(_app([rows.mod], {}), N)
    strategy, _ = _sfsl(grid, cpp="cpp1", **{"training-id": "a"})
    assert strategy.failed_rounds == {}
    strategy, result = _sfsl(grid, cpp="cpp5", **{"training-id": "a"})
    assert 1 in strategy.failed_rounds  # every client refused: the round keeps the model
    assert len(strategy.dropped[1]) == N
    assert all("p1, p2 changed" in why for why in strategy.dropped[1].values())
    np.testing.assert_array_equal(result.arrays["emb"].numpy(), MODEL["emb"])
    # p3, p4 alone may change: CPP1 -> (1, 0, 0.5, 0.5) keeps the memo's p1, p2.
    relaxed = RRParams(1.0, 0.0, 0.5, 0.5)
    rows.rr = lambda config, context: relaxed if config["cpp"] == "relaxed" else CPP["cpp1"]
    strategy, _ = _sfsl(grid, cpp="relaxed", **{"training-id": "a"})
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}


def test_a_perturb_message_without_the_session_or_a_usable_config_is_refused() -> None:
    rows = PerturbedRows("emb", rows=_rows, rr=_choose, session_key="training-id")
    grid = paper_grid(_app([rows.mod], {}), N)
    strategy, _ = _sfsl(grid, cpp="cpp1")  # no training-id
    assert all("session key 'training-id'" in why for why in strategy.dropped[1].values())
    assert len(strategy.dropped[1]) == N
    strategy, _ = _sfsl(grid, cpp="cpp1", **{"training-id": 1.5})
    assert all("not a str, bytes or int" in why for why in strategy.dropped[1].values())
    strategy, _ = _sfsl(grid, cpp="cpp9", **{"training-id": "a"})  # rr(config) raises KeyError
    assert all("refused the train config" in why for why in strategy.dropped[1].values())
    for node in grid.get_node_ids():  # no memo was drawn by a refused message
        assert not any(k.startswith("fsl.sfsl.memo") for k in grid.context(node).state)


def test_constructor_arguments_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="table"):
        PerturbedRows("", rows=_rows, rr=COIN)
    with pytest.raises(ConfigurationError, match="rows"):
        PerturbedRows("emb", rows=None, rr=COIN)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="rr must be"):
        PerturbedRows("emb", rows=_rows, rr=(0.5, 0.5, 1.0, 0.0))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="session_key"):
        PerturbedRows("emb", rows=_rows, rr=COIN, session_key="")
    with pytest.raises(ConfigurationError, match="config_key"):
        PerturbedRows("emb", rows=_rows, rr=COIN, config_key="")
