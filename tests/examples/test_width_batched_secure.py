"""``--secure-sesa``: the batched twin's SESA arm through the real protocol equals the twin.

``benchmarks/width_accuracy.py --engine batched --secure-sesa`` replaces the twin's plain
``F_p`` sum by one in-process SESA round per training round
(:meth:`width_mnist.batched.BatchedArm.secure_aggregate`); the clients pick the same shards and
train the same narrow models, so the new global model must equal the twin's up to the fixed
point's stochastic rounding.
"""

from __future__ import annotations

import numpy as np

from flwr_fsl.testing.local import app_run_config
from tests.examples.test_width_batched import APP_DIR, CLIENTS, TINY, _initial, app  # noqa: F401


def test_secure_sesa_arm_equals_the_twin(app) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    batched, _client_app, _server_app, task = app
    config = {**app_run_config(APP_DIR), **TINY, "arms": "sesa", "num-server-rounds": 1}
    settings = task.Settings.from_run_config(config)
    rates = task.CapacityMix.parse(settings.width_mix).fixed(CLIENTS)
    data = batched.Data.load(settings, CLIENTS)
    clients = batched.sampled_clients(settings, CLIENTS, 1)
    twin = batched.BatchedArm("sesa", settings, _initial(task), rates)
    secure = batched.BatchedArm("sesa", settings, _initial(task), rates, secure=True)
    assert twin.choices(1, clients) == secure.choices(1, clients)
    twin.round(1, clients, data)
    secure.round(1, clients, data)
    for key, value in twin.model.items():
        # Each side rounds every delta stochastically to 2^-22 (~2.4e-7).
        np.testing.assert_allclose(secure.model[key], value, atol=1e-6, err_msg=key)
    assert any(not np.array_equal(secure.model[k], v) for k, v in _initial(task).items())
