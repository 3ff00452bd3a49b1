"""``SecAggFedAvg``: Flower's ``FedAvg`` through Bonawitz et al.'s secure aggregation.

A drop-in for :class:`flwr.serverapp.strategy.FedAvg` (same knobs, same ``start``) for an
unchanged ``@app.train`` behind :func:`~flwr_fsl.mods.secagg_mod`. Each round is four phases
of the round engine (:class:`~flwr_fsl.core.engine.PhasedStrategy`), the protocol being
:mod:`flwr_fsl.families.secagg.protocol`:

Every phase is a ``train`` message (the mod answers the control phases itself, so the
ClientApp needs no extra registered function):

1. ``advertise``: the sampled clients send two public keys;
2. ``share``: the roster goes out, each client's shares for the
   others come back sealed to them and wait in the server's mailbox;
3. ``train``: the model and config (as ``FedAvg`` sends them) plus ``U2``; each client trains
   and replies only its masked vector (:class:`~flwr_fsl.families.secagg.vector.WeightedVector`:
   weighted update, weight, weighted train metrics), added to the running sum as it arrives
   (:meth:`~flwr_fsl.core.engine.PhasedStrategy.stream`);
4. ``unmask``: each survivor gets its mailbox and returns shares;
   the server removes the masks and applies ``w + sum c (w_i - w) / sum c``.

**Threat model and leakage.** One honest-but-curious server (this ServerApp) that may collude
with fewer than ``t`` clients; honest-but-curious clients; no client-to-client channel (shares
are sealed to their recipient and relayed). The server learns the sum over the clients that
finished (the new model, the total weight ``sum c``, the weighted mean of each secure train
metric), who finished which phase, and sizes. It does not learn any client's update, weight
(``num-examples``) or metrics: no reply carries them in the clear. ``t`` is
``reconstruction_threshold`` (a count, or a fraction of the sampled clients) — at least
``t`` clients must finish the round, or it fails with the model unchanged. Not covered: a
server that deviates from the protocol (see :mod:`flwr_fsl.families.secagg.protocol`), federated
evaluation (its replies are Flower's and carry ``num-examples``; use ``evaluate_fn``).

**Failures.** A client that errs, times out or sends a malformed message is dropped at that
phase with a logged reason; clients dropped after sharing are recovered in Unmask. Fewer than
``t`` clients left at any phase, or inconsistent shares, fail the round (model unchanged).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.core.engine import PhasedStrategy, RoundState
from flwr_fsl.core.errors import ConfigurationError, RoundFailedError
from flwr_fsl.families.secagg.protocol import SecAggParams, SecAggServer, encode_ids
from flwr_fsl.families.secagg.records import SECAGG_KEY, read_masked_input, read_secagg_bytes
from flwr_fsl.families.secagg.vector import WeightedVector

__all__ = ["SecAggFedAvg", "SecAggPhases"]


@dataclass
class SecAggPhases:
    """Bonawitz's phases on the round engine, for any vector: a component a strategy holds.

    Every phase is a ``train`` message whose SecAgg record names the phase and the
    ``instance`` (so one round can run several aggregations, e.g. Niu's union and rows); the
    client side is :func:`flwr_fsl.families.secagg.mod.secagg_control` (and the caller's own handler
    of the masked phase). Phase names in the round's traffic are the SecAgg phases, prefixed
    with the instance unless it is ``"model"``.

    Parameters
    ----------
    strategy : PhasedStrategy
        The strategy whose :meth:`~PhasedStrategy.send` / :meth:`~PhasedStrategy.stream` run
        the phases (drops, timeouts, traffic).
    instance : str
        The aggregation's name within a round.
    """

    strategy: PhasedStrategy
    instance: str = "model"

    def _phase(self, phase: str) -> str:
        return phase if self.instance == "model" else f"{self.instance}-{phase}"

    def record(self, params: SecAggParams, phase: str, **fields: Any) -> ConfigRecord:
        """Return the SecAgg record of one message: phase, instance, parameters, ``fields``."""
        return ConfigRecord(
            {"phase": phase, "instance": self.instance, "params": params.to_bytes(), **fields}
        )

    def keys(
        self, grid: Grid, state: RoundState, nodes: Sequence[int], params: SecAggParams
    ) -> SecAggServer:
        """AdvertiseKeys and ShareKeys with ``nodes``; return the server holding ``U2``.

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``t`` clients are left after either phase (the round fails).
        """
        server = SecAggServer(params)
        ad = RecordDict({SECAGG_KEY: self.record(params, "advertise")})
        self.strategy.send(
            grid, state, self._phase("advertise"), dict.fromkeys(nodes, ad), MessageType.TRAIN,
            lambda n, c: server.add_advertisement(n, read_secagg_bytes(c, "advertise")),
        )  # fmt: skip
        roster = RecordDict({SECAGG_KEY: self.record(params, "share", roster=server.roster())})
        members = [n for n in nodes if n in state.survivors]
        self.strategy.send(
            grid, state, self._phase("share"), dict.fromkeys(members, roster), MessageType.TRAIN,
            lambda n, c: server.add_shares(n, read_secagg_bytes(c, "shares")),
        )  # fmt: skip
        server.sharers()
        return server

    def masked(
        self,
        grid: Grid,
        state: RoundState,
        server: SecAggServer,
        contents: Mapping[int, RecordDict],
        phase: str = "train",
    ) -> None:
        """Send the masked-input messages and add each reply to the sum as it arrives."""
        asked = {n: c for n, c in contents.items() if n in state.survivors}
        name = self._phase(phase)
        messages = self.strategy.prepare(state, name, asked, MessageType.TRAIN)

        def parse(node: int, content: RecordDict) -> None:
            rows = server.rows_of(node)
            size = server.params.vector_length if rows is None else rows.size
            server.add_masked_input(node, read_masked_input(content, size))

        for _ in self.strategy.stream(grid, state, name, messages, parse):
            pass

    def unmask(self, grid: Grid, state: RoundState, server: SecAggServer) -> NDArray[np.uint64]:
        """Unmask with the survivors and return the sum of their vectors.

        Raises
        ------
        RoundFailedError
            If too few survivors answer or the shares are inconsistent.
        """
        params = server.params
        self.strategy.send(
            grid, state, self._phase("unmask"),
            {
                n: RecordDict(
                    {SECAGG_KEY: self.record(params, "unmask", request=server.unmask_request(n))}
                )
                for n in server.survivors
            },
            MessageType.TRAIN,
            lambda n, c: server.add_unmask(n, read_secagg_bytes(c, "unmask")),
        )  # fmt: skip
        return server.result()


class SecAggFedAvg(PhasedStrategy):
    """Flower ``FedAvg`` with Bonawitz secure aggregation of updates, weights and metrics.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
evaluate_metrics_aggr_fn, sampling_seed
        As in :class:`flwr.serverapp.strategy.FedAvg` (train metrics are aggregated inside
        the secure vector, so there is no ``train_metrics_aggr_fn``).
    reconstruction_threshold : int or float
        ``t``: shares needed to unmask, and the fewest clients that may finish a round. An int
        ``>= 2``, or a fraction in ``(0, 1]`` of the sampled clients (rounded up, at least 2).
        Default 0.6, Flower's SecAgg+ default.
    clipping_range : float
        Largest ``|w_i - w|`` per coordinate a client contributes (larger changes are
        clipped, as Flower's SecAgg+ clips). Default 8.
    max_weight : float
        Largest ``weighted_by_key`` a client may use (sizes the fixed point). Default 1e5.
    train_metrics : sequence of str
        Train metrics averaged securely (weighted by ``weighted_by_key`` over the clients that
        report them); others never leave the client. Default ``("train_loss",)``.
    max_metric : float
        Largest ``|metric|``. Default 1e3.
    frac_bits : int
        Fixed-point fractional bits. Default 24.
    max_clients : int
        Most clients per round (sizes the overflow bound). Default 1000.

    Raises
    ------
    ConfigurationError
        If a setting is invalid or the fixed point could overflow (checked here, before round
        1, naming the setting).
    """

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        *,
        reconstruction_threshold: int | float = 0.6,
        clipping_range: float = 8.0,
        max_weight: float = 1e5,
        train_metrics: Sequence[str] = ("train_loss",),
        max_metric: float = 1e3,
        frac_bits: int = 24,
        max_clients: int = 1000,
        sampling_seed: int | None = None,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            sampling_seed=sampling_seed,
            max_weight=max_weight,
        )
        t = reconstruction_threshold
        if isinstance(t, bool) or not isinstance(t, int | float):
            raise ConfigurationError("reconstruction_threshold must be an int or a float")
        if isinstance(t, int) and t < 2:
            raise ConfigurationError(f"reconstruction_threshold must be >= 2, got {t}")
        if isinstance(t, float) and not 0.0 < t <= 1.0:
            raise ConfigurationError(
                f"reconstruction_threshold as a fraction must be in (0, 1], got {t}"
            )
        if isinstance(max_clients, bool) or not isinstance(max_clients, int) or max_clients < 2:
            raise ConfigurationError(f"max_clients must be an int >= 2, got {max_clients!r}")
        if isinstance(frac_bits, bool) or not isinstance(frac_bits, int):
            raise ConfigurationError(f"frac_bits must be an int, got {frac_bits!r}")
        metrics = tuple(train_metrics)
        if any(not isinstance(m, str) or not m or m == weighted_by_key for m in metrics):
            raise ConfigurationError("train_metrics must be metric names other than the weight")
        self.reconstruction_threshold = t
        self.clipping_range = float(clipping_range)
        self.max_metric = float(max_metric)
        self.frac_bits = frac_bits
        self.max_clients = max_clients
        self.train_metrics = metrics
        # Validates the fixed point for the largest round now, before round 1.
        try:
            WeightedVector(
                ("w",), ((1,),), metrics, self.clipping_range, float(max_weight),
                self.max_metric, frac_bits, max_clients,
            )  # fmt: skip
        except ConfigurationError as err:
            raise ConfigurationError(
                f"SecAggFedAvg (clipping_range / max_weight / max_metric / frac_bits / "
                f"max_clients): {err}"
            ) from err
        self.session = os.urandom(16)

    def threshold_for(self, sampled: int) -> int:
        """Return ``t`` for a round that sampled ``sampled`` clients."""
        t = self.reconstruction_threshold
        if isinstance(t, float):
            return max(2, math.ceil(t * sampled))
        return t

    def configure_train(self, *args: object, **kwargs: object) -> Iterable[Message]:
        """Not available: a SecAgg round is four phases; run it with :meth:`start`."""
        raise NotImplementedError("SecAggFedAvg runs its rounds in start() (four phases)")

    def aggregate_train(self, *args: object, **kwargs: object) -> tuple[None, None]:
        """Not available: a SecAgg round is four phases; run it with :meth:`start`."""
        raise NotImplementedError("SecAggFedAvg runs its rounds in start() (four phases)")

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run one SecAgg round (module docstring); None arrays when it failed."""
        model = {k: a.numpy() for k, a in arrays.items()}
        state.model = model
        nodes = self.sample(state, grid)
        if not nodes:
            return None, None
        if len(nodes) > self.max_clients:
            raise RoundFailedError(
                f"{len(nodes)} clients sampled, max_clients is {self.max_clients}"
            )
        layout = WeightedVector(
            tuple(model),
            tuple(tuple(v.shape) for v in model.values()),
            self.train_metrics,
            self.clipping_range,
            self.max_weight,
            self.max_metric,
            self.frac_bits,
            self.max_clients,
        )
        t = self.threshold_for(len(nodes))
        if len(nodes) < t:
            raise RoundFailedError(f"{len(nodes)} clients sampled, fewer than t = {t}")
        params = SecAggParams(state.server_round, self.session, t, layout.length)
        state.protocol = params
        phases = SecAggPhases(self)
        server = phases.keys(grid, state, nodes, params)
        # MaskedInput: the train message, streamed into the running sum.
        train = RecordDict(
            {
                self.arrayrecord_key: arrays,
                self.configrecord_key: ConfigRecord(
                    {**dict(config), "server-round": state.server_round}
                ),
                SECAGG_KEY: phases.record(
                    params,
                    "train",
                    sharers=encode_ids(server.sharers()),
                    names=list(layout.names),
                    metrics=list(layout.metrics),
                    clip=layout.clip,
                    **{
                        "max-weight": layout.max_weight,
                        "max-metric": layout.max_metric,
                        "frac-bits": layout.frac_bits,
                        "max-clients": layout.max_clients,
                        "weight-key": self.weighted_by_key,
                    },
                ),
            }
        )
        phases.masked(grid, state, server, dict.fromkeys(server.sharers(), train))
        survivors = server.survivors
        total = phases.unmask(grid, state, server)
        new, metrics, _ = layout.decode(total, model)
        log(
            INFO,
            "aggregate_train: SecAgg over %d of %d sampled clients (t = %d)",
            len(survivors),
            len(nodes),
            t,
        )
        out = MetricRecord({**metrics, "secagg-clients": len(survivors)})
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()}), out
