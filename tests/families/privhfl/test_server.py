"""PrivHFL's secure answering without Flower (flwr_fsl.families.privhfl.server and .client).

:func:`run_secure_query` drives the strategy's :class:`PrivHFLServer` with an exchange that
calls the clients' handlers directly. Its soft labels equal softmax of the plaintext logit sums
within the fixed-point error (MLP and CNN answerers of :mod:`flwr_fsl.models.privhfl`, the DCF
comparison and the paper's DReLU); a corrupted answerer reply drops only that answerer, a
corrupted querier reply only that querier, and a client's ``ClientInputError`` drops it with
the reason the Flower engine records.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.privhfl.client import SecureAnswerer
from flwr_fsl.families.privhfl.inference import SecureModel, error_bound, from_torch
from flwr_fsl.families.privhfl.protocol import PrivHFLConfig
from flwr_fsl.families.privhfl.queries import softmax
from flwr_fsl.families.privhfl.server import PrivHFLServer, run_secure_query
from flwr_fsl.families.privhfl.strategy import PrivHFL
from flwr_fsl.models import set_torch_threads
from flwr_fsl.models.privhfl import IMAGE_SHAPE, mlp, predict_logits, vgg7

CLASSES = 4
BATCH = 3


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    set_torch_threads(1)


def _nets() -> dict[int, torch.nn.Sequential]:
    torch.manual_seed(0)
    return {
        0: mlp((16,), CLASSES),
        1: vgg7(1, CLASSES),  # a CNN: convolutions, max pools
        2: mlp((8, 6), CLASSES),
    }


@pytest.fixture(scope="module")
def parties() -> tuple[dict[int, torch.nn.Sequential], dict[int, np.ndarray]]:
    set_torch_threads(1)
    nets = _nets()
    rng = np.random.default_rng(4)
    queries = {q: rng.uniform(0, 1, (BATCH, *IMAGE_SHAPE)).astype(np.float32) for q in (0, 1)}
    return nets, queries


def _models(nets: dict[int, torch.nn.Sequential]) -> dict[int, SecureModel]:
    return {n: from_torch(net.eval(), IMAGE_SHAPE) for n, net in nets.items()}


def _plain(nets: dict[int, torch.nn.Sequential], q: int, x: np.ndarray, without: int = -1) -> tuple:
    answers = [n for n in nets if n not in (q, without)]
    total = sum(predict_logits(nets[a], x).astype(np.float64) for a in answers)
    return answers, total


@pytest.mark.parametrize("relu", ["dcf", "drelu"])
def test_driver_equals_the_plaintext_answers(relu: str, parties: tuple) -> None:
    nets, queries = parties
    models = _models(nets)
    result = run_secure_query(PrivHFLConfig(comparison=relu), models, queries)  # type: ignore[arg-type]
    assert not result.dropped
    assert sorted(result.soft_labels) == [0, 1] and result.answerers == {0: 2, 1: 2}
    for q, x in queries.items():
        answers, total = _plain(nets, q, x)
        bound = sum(error_bound(models[a], 1.0) for a in answers)
        assert np.max(np.abs(result.logits[q] - total)) <= bound
        np.testing.assert_allclose(result.soft_labels[q], softmax(total), atol=1e-4)
        assert np.array_equal(result.soft_labels[q].argmax(1), softmax(total).argmax(1))
    steps = [p for p in result.phases if p.startswith("step-")]
    assert result.phases[:2] == ["keys", "generate"] and result.phases[-1] == "retrain"
    assert steps == [f"step-{k}" for k in range(1, len(steps) + 1)]
    assert any(p.startswith("sign-") for p in result.phases) == (relu == "drelu")


def _corrupt(phase: str, node: int) -> Callable[[str, int, bytes], bytes]:
    def relay(p: str, n: int, reply: bytes) -> bytes:
        return reply[:-8] if (p, n) == (phase, node) else reply

    return relay


@pytest.mark.parametrize("relu", ["dcf", "drelu"])
def test_corrupted_answerer_reply_drops_only_that_answerer(relu: str, parties: tuple) -> None:
    nets, queries = parties
    models = _models(nets)
    cfg = PrivHFLConfig(comparison=relu)  # type: ignore[arg-type]
    result = run_secure_query(cfg, models, queries, relay=_corrupt("step-2", 2))
    assert list(result.dropped) == [2] and result.dropped[2].startswith("step-2: ")
    assert result.answerers == {0: 1, 1: 1}  # each answered by the other alone
    for q, x in queries.items():
        answers, total = _plain(nets, q, x, without=2)
        assert answers == [1 - q]
        assert np.max(np.abs(result.logits[q] - total)) <= error_bound(models[1 - q], 1.0)
        np.testing.assert_allclose(result.soft_labels[q], softmax(total), atol=1e-4)


def test_corrupted_querier_reply_drops_only_that_querier(parties: tuple) -> None:
    nets, queries = parties
    result = run_secure_query(
        PrivHFLConfig(comparison="dcf"), _models(nets), queries, relay=_corrupt("generate", 1)
    )
    assert list(result.dropped) == [1] and result.dropped[1].startswith("generate: ")
    # a dropped node leaves the round: it answers nobody either
    assert list(result.soft_labels) == [0] and result.answerers == {0: 1}
    _, total = _plain(nets, 0, queries[0], without=1)
    np.testing.assert_allclose(result.soft_labels[0], softmax(total), atol=1e-4)


def test_client_input_error_drops_the_client_with_the_engines_reason(parties: tuple) -> None:
    nets, queries = parties
    models: dict[int, SecureModel | SecureAnswerer] = dict(_models(nets))
    models[0] = SecureAnswerer(0, _models(nets)[0], max_answer=BATCH - 1)
    result = run_secure_query(PrivHFLConfig(comparison="dcf"), models, queries, plan={1: [0, 2]})
    assert result.dropped == {
        0: "step-1: client error: ClientInputError: "
        "a session holds more queries than this node answers"
    }
    assert result.answerers == {1: 1}
    _, total = _plain(nets, 1, queries[1], without=0)
    np.testing.assert_allclose(result.soft_labels[1], softmax(total), atol=1e-4)


def test_a_querier_left_without_answerers_gets_none(parties: tuple) -> None:
    nets, queries = parties
    result = run_secure_query(
        PrivHFLConfig(comparison="dcf"), _models(nets), queries, plan={0: [2], 1: [0, 2]},
        relay=_corrupt("keys", 2),
    )  # fmt: skip
    assert list(result.dropped) == [2] and result.dropped[2].startswith("keys: ")
    assert 0 not in result.answerers and result.answerers == {1: 1}  # 0 was never asked
    assert list(result.soft_labels) == [1]


def test_driver_refuses_inconsistent_parties(parties: tuple) -> None:
    nets, queries = parties
    cfg = PrivHFLConfig(comparison="dcf")
    with pytest.raises(ConfigurationError, match="querier"):
        run_secure_query(cfg, _models(nets), {})
    with pytest.raises(ConfigurationError, match="image shape"):
        run_secure_query(cfg, _models(nets), {0: queries[0], 1: queries[1][:, :, :8]})
    odd = {**_models(nets), 3: from_torch(mlp((4,), CLASSES + 1).eval(), IMAGE_SHAPE)}
    with pytest.raises(ConfigurationError, match="outputs"):
        run_secure_query(cfg, odd, queries)


def test_the_strategy_runs_the_same_server() -> None:
    strategy = PrivHFL(answering="secure", comparison="drelu", num_classes=CLASSES)
    server = strategy.secure_server
    assert isinstance(server, PrivHFLServer)
    assert server.config is strategy.secure_config and server.config.comparison == "drelu"
    assert server.num_classes == CLASSES and server.max_batch == strategy.num_queries
    assert len(server.run_session) == 16
