"""``ssa_mod`` weights: per-index counts ride in the count word, as plaintext FedSubAvg uses them.

A coordinate-sparse reply may carry a positive count per index (codec v2 ``counts``: e.g. how
many local samples touched the coordinate). Plaintext :class:`~flwr_fsl.strategies.FedSubAvg`
averages each coordinate by those counts; ``ssa_mod`` must put the same count into each
coordinate's payload ``(c * dw, c)`` — not the reply's ``num-examples`` — so that the secure
aggregate equals the plaintext one. Replies without counts are weighted by ``num-examples``
in both. That is ``SecureFedSubAvg(weighted=True)``; by default (unit weights) every count word
is 1 whatever the reply carries, which equals plaintext ``FedSubAvg`` on replies of weight 1
without counts. A row (mega-element) update is refused by the top-k mod (index mode carries rows).
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, Message, MetricRecord
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import RunFailedError
from flwr_fsl.core.records import encode_update
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.records import SSA_UPLOAD_KEY
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.mods import ssa_mod
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate, TensorUpdate
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, model_record

NODES = 4
RATIO = 0.2  # k = ceil(0.2 * 115) = 23 coordinates per client and round
PER_TENSOR = 6  # coordinates each client updates per floating tensor (3 tensors: 18 <= k)
FLOATS = [name for name, value in MODEL.items() if value.dtype == np.float32]


def client_update(seed: int, pid: int, server_round: int, mode: str) -> SubmodelUpdate:
    """One client's coordinate-sparse update: per-index counts (``counts``) or none.

    ``mode`` ``"unit"``: no counts and weight 1 (what unit weights make of any reply).
    """
    rng = np.random.default_rng([seed, pid, server_round])
    tensors = {}
    for name in FLOATS:
        size = MODEL[name].size
        idx = np.sort(rng.choice(size, PER_TENSOR, replace=False)).astype(np.int64)
        values = rng.normal(size=PER_TENSOR).astype(np.float32)
        counts = rng.integers(1, 40, size=PER_TENSOR).astype(np.float64)
        with_counts = mode == "counts" or (mode == "mixed" and pid % 2 == 0)
        tensors[name] = TensorUpdate(
            Encoding.COORDINATES, values, idx, counts if with_counts else None
        )
    return SubmodelUpdate(tensors, weight=1.0 if mode == "unit" else float(10 * (pid + 1)))


def sparse_app(mods: list[Mod], seed: int, mode: str) -> ClientApp:
    """A ClientApp whose train replies with a coordinate-sparse update (codec v2)."""
    app = ClientApp(mods=mods)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])  # type: ignore[arg-type]
        update = client_update(seed, pid, rnd, mode)
        content = encode_update(update)
        content["metrics"] = MetricRecord({"num-examples": int(update.weight)})
        return Message(content, reply_to=msg)

    return app


def secure_and_plain(
    seed: int, mode: str, rounds: int = 2, *, weighted: bool = True, plain_mode: str = ""
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], SecureFedSubAvg]:
    """Final float tensors of SecureFedSubAvg + ssa_mod and of plaintext FedSubAvg.

    The plaintext clients reply in ``plain_mode`` (default: ``mode``).
    """
    key = SealingKeyPair.generate()
    run_config = {"ssa-helper-fingerprint": key.fingerprint}
    knobs = {"min_available_nodes": NODES, "fraction_evaluate": 0.0}
    secure = SecureFedSubAvg(
        InProcessHelper(keypair=key),
        topk_ratio=RATIO,
        frac_bits=32,
        max_abs=1e3,
        weighted=weighted,
        **knobs,
    )
    got = secure.start(
        grid=InProcessGrid(sparse_app([ssa_mod], seed, mode), NODES, run_config),
        initial_arrays=model_record(),
        num_rounds=rounds,
    )
    plain = FedSubAvg(**knobs).start(
        grid=InProcessGrid(sparse_app([], seed, plain_mode or mode), NODES, {}),
        initial_arrays=model_record(),
        num_rounds=rounds,
    )
    return (
        {n: got.arrays[n].numpy() for n in FLOATS},
        {n: plain.arrays[n].numpy() for n in FLOATS},
        secure,
    )


def test_per_index_counts_weight_the_secure_aggregate_as_in_plaintext() -> None:
    secure, plain, strategy = secure_and_plain(seed=1, mode="counts")
    assert strategy.failed_rounds == {} and not any(strategy.dropped.values())
    for name in FLOATS:
        np.testing.assert_allclose(secure[name], plain[name], atol=1e-6, err_msg=name)
    # The counts matter: weighting every coordinate by num-examples (what ssa_mod did before
    # it read the counts) gives another model, far outside the tolerance above.
    _, by_weight, _ = secure_and_plain(seed=1, mode="none")
    assert max(float(np.max(np.abs(secure[n] - by_weight[n]))) for n in FLOATS) > 1e-2


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.sampled_from(["counts", "none", "mixed"]))
def test_secure_equals_plaintext_with_counts_without_and_mixed(seed: int, mode: str) -> None:
    secure, plain, strategy = secure_and_plain(seed, mode, rounds=1)
    assert strategy.failed_rounds == {}
    for name in FLOATS:
        np.testing.assert_allclose(secure[name], plain[name], atol=1e-6, err_msg=name)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.sampled_from(["counts", "none", "mixed"]))
def test_unit_weights_by_default_ignore_counts_and_num_examples(seed: int, mode: str) -> None:
    # Default SecureFedSubAvg: every client counts 1 per coordinate, whatever counts or
    # num-examples its reply carries: plaintext FedSubAvg on the same updates with weight 1.
    secure, plain, strategy = secure_and_plain(
        seed, mode, rounds=1, weighted=False, plain_mode="unit"
    )
    assert strategy.failed_rounds == {}
    for name in FLOATS:
        np.testing.assert_allclose(secure[name], plain[name], atol=1e-6, err_msg=name)


def test_a_row_update_is_refused_by_the_topk_mod() -> None:
    key = SealingKeyPair.generate()
    app = ClientApp(mods=[ssa_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rows = TensorUpdate(Encoding.ROWS, np.ones((1, 4), np.float32), np.array([0]))
        content = encode_update(SubmodelUpdate({"emb.weight": rows}, weight=1.0))
        content["metrics"] = MetricRecord({"num-examples": 1})
        return Message(content, reply_to=msg)

    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=key), topk_ratio=RATIO, min_available_nodes=2, min_clients=1
    )
    grid = InProcessGrid(app, 2, {"ssa-helper-fingerprint": key.fingerprint})
    with pytest.raises(RunFailedError):  # no round produced a result
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    reasons = list(strategy.dropped[1].values())
    assert len(reasons) == 2 and all("index mode" in r for r in reasons), reasons


def test_s0_sees_no_count_and_a_reply_size_independent_of_the_counts() -> None:
    # S0's view of a client: the upload record only (no MetricRecord, no counts), whose size
    # depends on the public round parameters alone — clients with and without per-index
    # counts (mode "mixed": even partitions send counts) send equally long replies.
    key = SealingKeyPair.generate()
    seen: list[Message] = []

    def record(msg: Message, context: Context, call_next: object) -> Message:
        reply = call_next(msg, context)  # type: ignore[operator]
        seen.append(reply)
        return reply

    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=key), topk_ratio=RATIO, min_available_nodes=NODES
    )
    grid = InProcessGrid(
        sparse_app([record, ssa_mod], seed=3, mode="mixed"),
        NODES,
        {"ssa-helper-fingerprint": key.fingerprint},
    )
    strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    train = [r for r in seen if r.metadata.message_type == "train"]
    assert len(train) == NODES
    for reply in train:
        assert not reply.content.metric_records and not reply.content.array_records
        assert list(reply.content.config_records) == [SSA_UPLOAD_KEY]
    up = strategy.rounds[1].phase("train").up_bytes
    assert len(up) == NODES and len(set(up.values())) == 1, up
