"""``SecureFedSubAvg``: top-k federated submodel learning with two-server secure aggregation.

This strategy is S0 of Cui et al.'s SSA (Fig. 4) inside Flower's ServerApp; S1 is the helper
process (:mod:`flwr_fsl.helper`), reached through a :class:`~flwr_fsl.helper.HelperConnection`
(gRPC in deployment, the in-process twin in simulation — same bytes). Each round:

1. ``configure_train`` picks ``k = ceil(topk_ratio * m)`` over the model's ``m`` floating
   coordinates and a fresh public hash key, and sends the SSA parameters and S1's public key
   with the model; ``topk-count = k`` overrides the clients' ``topk_mod`` setting so every
   client uploads at most ``k`` coordinates (``ssa_mod`` outside ``topk_mod`` on the client).
2. ``aggregate_train`` validates each reply (as :class:`FedSubAvg` does, plus the DPF keys'
   shape), relays the public parts and sealed S1 material to S1, adds the clients S1 accepted
   to its own share, takes S1's share, reconstructs ``sum c*dw`` and ``sum c`` per coordinate
   and applies the count-weighted average — the same result as :class:`FedSubAvg` on the
   plaintext top-k updates, up to the fixed-point error (``clients * 2**-frac_bits`` per
   coordinate before division).

**Threat model and leakage.** Two non-colluding semi-honest servers, semi-honest clients
(:mod:`flwr_fsl.protocols.ssa`). S0 sees each client's public part, its own master seed, the
client's ``num-examples`` (as in FedAvg) and the reconstructed aggregate: per coordinate the
weighted sum and the total weight of the clients that chose it. It does not see which
coordinates a single client chose or their values (unless the round has one client).

**Failures.** A malformed, late, duplicated or unsolicited reply, or one S1 rejects, drops that
client with a logged reason (:attr:`dropped`); the others are aggregated exactly. If S1 cannot
be reached or answers inconsistently, the round fails loudly (logged at ERROR, recorded in
:attr:`failed_rounds`) and the global model is unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from flwr_fsl.helper import HelperConnection, HelperError
from flwr_fsl.protocols.ssa import SSAParams
from flwr_fsl.records import HELPER_KEY_FIELD, PARAMS_FIELD, SESSION_FIELD
from flwr_fsl.strategies.two_server import TwoServerStrategy
from flwr_fsl.submodel.layout import FlatLayout


class SecureFedSubAvg(TwoServerStrategy):
    """Top-k federated submodel averaging through two-server secure aggregation (S0's side).

    Parameters
    ----------
    helper : HelperConnection
        Connection to S1.
    topk_ratio : float
        Fraction in (0, 1] of the model's floating coordinates each client uploads.
    **kwargs
        :class:`~flwr_fsl.strategies.two_server.TwoServerStrategy` settings
        (``helper_fingerprint``, ``frac_bits``, ``max_abs``, ``stash_size``, ``num_hashes``) and
        Flower ``FedAvg`` arguments (fractions, minimum nodes, keys, metric aggregation).

    Raises
    ------
    ValueError
        If ``topk_ratio`` is out of range.
    """

    def __init__(self, helper: HelperConnection, topk_ratio: float, **kwargs: Any) -> None:
        if not 0.0 < topk_ratio <= 1.0:
            raise ValueError(f"topk_ratio must be in (0, 1], got {topk_ratio}")
        super().__init__(helper, **kwargs)
        self.topk_ratio = topk_ratio

    def summary(self) -> None:
        """Log the configuration."""
        super().summary()
        log(INFO, "\t└──> SSA: top-k ratio %s, %s fractional bits", self.topk_ratio, self.frac_bits)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Attach the round's SSA parameters and S1's key to FedAvg's train messages."""
        layout = FlatLayout.of({k: v.numpy() for k, v in arrays.items()})
        if layout.size == 0:
            raise ValueError("the model has no floating tensors to aggregate")
        k = min(layout.size, math.ceil(self.topk_ratio * layout.size))
        params = SSAParams(
            round_id=server_round,
            domain_size=layout.size,
            num_items=k,
            value_width=1,
            hash_key=os.urandom(16),  # fresh per round: top-k sets change every round
            count_weighted=True,
            num_hashes=self.num_hashes,
            stash_size=self.stash_size,
            frac_bits=self.frac_bits,
            max_abs=self.max_abs,
            max_summands=max(1, len(list(grid.get_node_ids()))),
        )
        self._params[server_round] = params
        config = ConfigRecord(dict(config))
        config["topk-count"] = k
        config[PARAMS_FIELD] = params.to_bytes()
        config[HELPER_KEY_FIELD] = self._helper_public_key()
        config[SESSION_FIELD] = self.helper.session_id
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, run SSA with S1, apply the count-weighted average."""
        params = self._params.pop(server_round)
        uploads = self._collect_uploads(server_round, params, list(replies), accept_hints=False)
        if not uploads.contents:
            log(WARNING, "aggregate_train: no valid reply; the global model is unchanged")
            return None, None
        try:
            self.helper.open_round(server_round, params.to_bytes())
        except HelperError as err:
            self._fail(server_round, err)
            return None, None
        outcome = self._secure_aggregate(server_round, params, uploads)
        if outcome is None:
            return None, None
        result, accepted = outcome
        layout = FlatLayout.of(self._global)
        new_flat = layout.flatten(self._global) + result.average()[:, 0]
        new_arrays = layout.unflatten(new_flat, self._global)
        assert result.counts is not None
        metrics = self._round_metrics(
            server_round, accepted, uploads, float(np.count_nonzero(result.counts)) / layout.size
        )
        log(INFO, "aggregate_train: securely aggregated %d clients", len(accepted))
        return ArrayRecord({k: Array(v) for k, v in new_arrays.items()}), metrics
