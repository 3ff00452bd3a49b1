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
(:mod:`flwr_fsl.families.ssa.protocol`). S0 sees each client's public part, its own master seed and
the reconstructed aggregate: per coordinate the sum and the count word over the clients that
chose it. By default (``weighted=False``) every client counts 1, so a count word is how many
clients chose the coordinate, not which; a coordinate one client chose gives S0 that client's
value, not its name. A reply carries no weight or metric in the clear. With ``weighted=True``
the count word is a sum of the clients' weights (``weighted_by_key``), which S0 can recover
from the counts and decode as subset sums (``tests/attacks/test_ssa_weight_recovery.py``,
``tests/attacks/test_ssa_count_subset_sum.py``). Federated evaluation is off by default
(``fraction_evaluate=0.0``; a value > 0 needs ``plaintext_evaluation=True``): its replies are
Flower's and carry ``num-examples`` and metrics in the clear — evaluate on the server
(``evaluate_fn``). Across rounds, top-k sets that stay the same from round to round can be
decoded by least squares over the count words with the participation S0 chose
(``tests/attacks/test_ssa_topk_cross_round.py``; distributed DP bounds it). Rounds with fewer
than ``min_clients`` accepted clients are not reconstructed.

**Failures.** A malformed, late, duplicated or unsolicited reply, or one S1 rejects, drops that
client with a logged reason (:attr:`dropped`); the others are aggregated exactly. If S1 cannot
be reached or answers inconsistently, the round fails loudly (logged at ERROR, recorded in
:attr:`failed_rounds`) and the global model is unchanged.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from logging import INFO
from typing import Any, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.core.checks import check_real
from flwr_fsl.core.engine import RoundState
from flwr_fsl.core.errors import ConfigurationError, RoundFailedError
from flwr_fsl.core.privacy import PrivacyBudget
from flwr_fsl.families.ssa.aggregation_strategy import (
    SSASettings,
    TwoServerAggregation,
    check_helper,
    secure_flower_kwargs,
)
from flwr_fsl.families.ssa.dp import DEFAULT_BUDGET, INDEX_MODE_DP, DistributedDP
from flwr_fsl.families.ssa.protocol import SSAParams
from flwr_fsl.families.topk.strategy import FedSubAvg
from flwr_fsl.helper import HelperConnection
from flwr_fsl.submodel.layout import FlatLayout
from flwr_fsl.submodel.mega_layout import MegaLayout


def _check_groups(groups: object) -> tuple[str, ...]:
    """Return ``groups`` as a tuple of distinct tensor names (checked by name).

    Raises
    ------
    ConfigurationError
        If ``groups`` is not a tuple or list of distinct non-empty names without commas.
    """
    if not isinstance(groups, tuple | list) or not all(
        isinstance(g, str) and g and "," not in g for g in groups
    ):
        raise ConfigurationError(f"groups must be a tuple of tensor names, got {groups!r}")
    if len(set(groups)) != len(groups):
        raise ConfigurationError(f"groups names a tensor twice: {groups!r}")
    return tuple(groups)


class SecureFedSubAvg(FedSubAvg):
    """Top-k federated submodel averaging through two-server secure aggregation (S0's side).

    Parameters
    ----------
    helper : HelperConnection
        Connection to S1.
    topk_ratio : float
        Fraction in (0, 1] of the model's floating coordinates each client uploads.
    helper_fingerprint : str, optional
        Pinned fingerprint of S1's public key, checked by S0 (clients check their own).
    frac_bits, max_abs, stash_size, num_hashes, min_clients : int, float, int, int, int
        :class:`~flwr_fsl.families.ssa.aggregation_strategy.SSASettings` (``min_clients``: minimum
        participation, default 2; a round with fewer accepted clients fails unreconstructed).
    dp : DistributedDP, None or "auto"
        Distributed differential privacy (``SSASettings.dp``, :mod:`flwr_fsl.families.ssa.dp`):
        clients clip, S0 and S1 each noise their share, ``(ε, δ)`` logged per round. Default
        ``"auto"``: off for flat top-k (error feedback rotates the choices; every run logs that
        no noise is added), :data:`~flwr_fsl.families.ssa.dp.INDEX_MODE_DP` with ``groups``
        (grouped embedding rows stay inside a client's own vocabulary, and exact counts name
        their chooser over rounds: ``tests/attacks/test_ssa_topk_mega_rows.py``). None: no
        noise. Start S1 with the matching ``flwr-fsl-helper --dp-*`` flags so S1 enforces its
        own noise.
    privacy_budget : PrivacyBudget or None
        The run's budget when ``dp`` is set (default
        :data:`~flwr_fsl.families.ssa.dp.DEFAULT_BUDGET`, ``ε = 20`` at ``δ = 1e-5``): the
        run stops before a round that would exceed it; S1 refuses such rounds too. None:
        account without stopping.
    weighted : bool
        False (default): every client's count word is 1 (the average over the clients that
        chose a coordinate, each counting once). True: weighted by ``weighted_by_key``
        (default ``num-examples``) or the reply's per-index counts, as plaintext ``FedSubAvg``;
        S0 can then recover the weights and decode who chose what (see the module docstring).
    plaintext_evaluation : bool
        Allow federated evaluation (``fraction_evaluate > 0``), whose replies give S0 every
        evaluated client's metrics and ``num-examples`` in the clear. Default False.
    value_check : str
        How both servers check every client's value words (``SSASettings.value_check``,
        ``SSAParams.value_check``): ``"projected"`` (default; random projections, every value
        word within ``2T = 8 sqrt(k w) * max_abs`` in fixed point, a few thousand upload words,
        :mod:`flwr_fsl.families.ssa.projected_check`), ``"exact"`` (every word within
        ``max_abs``; ``8 * L`` upload bytes per value word per key, 2-3x the upload,
        :mod:`flwr_fsl.families.ssa.range_check`) or ``"off"`` (unchecked).
    groups : tuple[str, ...]
        Tensors sent as whole rows (mega-elements, Cui §6 and §7.4): rows ranked by L1 norm,
        ``ceil(topk_ratio * rows)`` per group, and ``ceil(topk_ratio * rest)`` single
        coordinates of the other tensors, all in one SSA instance over a
        :class:`~flwr_fsl.submodel.mega_layout.MegaLayout` (every key ``width + 1`` words,
        ``width`` the widest row; narrower elements zero-padded). The servers learn the
        public sizes only (``m``, ``k``, ``width``). Default: none (flat coordinates).
    **kwargs
        Flower ``FedAvg`` arguments (fractions, minimum nodes, keys, metric aggregation) and
        ``sampling_seed``; ``fraction_evaluate`` defaults to 0.0.

    Raises
    ------
    ConfigurationError
        If ``topk_ratio`` or an SSA setting is out of range, ``fraction_evaluate > 0`` without
        ``plaintext_evaluation=True``, or ``weighted_by_key`` is given without
        ``weighted=True``.

    Attributes
    ----------
    aggregation : TwoServerAggregation
        The secure-aggregation component (S0's party and its link to S1).
    """

    def __init__(  # noqa: PLR0913
        self,
        helper: HelperConnection,
        topk_ratio: float,
        *,
        helper_fingerprint: str | None = None,
        frac_bits: int = 24,
        max_abs: float = 1e4,
        stash_size: int = 0,
        num_hashes: int = 3,
        min_clients: int = 2,
        dp: DistributedDP | Literal["auto"] | None = "auto",
        privacy_budget: PrivacyBudget | None = DEFAULT_BUDGET,
        weighted: bool = False,
        plaintext_evaluation: bool = False,
        value_check: str = "projected",
        groups: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        check_real("topk_ratio", topk_ratio, 0.0, 1.0, low_open=True)
        self.groups = _check_groups(groups)
        if isinstance(dp, str):
            if dp != "auto":
                raise ConfigurationError(f"dp must be a DistributedDP, None or 'auto', got {dp!r}")
            # Grouped rows of an embedding table lie inside the client's own vocabulary whatever
            # error feedback rotates, so exact counts name them over rounds: noise by default.
            dp = INDEX_MODE_DP if self.groups else None
        check_helper(helper, helper_fingerprint)
        kwargs = secure_flower_kwargs(type(self).__name__, weighted, plaintext_evaluation, kwargs)
        super().__init__(**kwargs)
        self.topk_ratio = topk_ratio
        settings = SSASettings(
            frac_bits,
            max_abs,
            stash_size,
            num_hashes,
            min_clients,
            dp,
            privacy_budget,
            weighted=weighted,
            value_check=value_check,
        )
        self.aggregation = TwoServerAggregation(helper, helper_fingerprint, settings)
        self.privacy_account = self.aggregation.privacy_account

    def start(self, *args: Any, **kwargs: Any) -> Result:
        """Run as ``PhasedStrategy.start``, in an S1 session of this run's own.

        Several strategies may share one connection to S1 (:meth:`TwoServerAggregation.own_session
        <flwr_fsl.families.ssa.aggregation_strategy.TwoServerAggregation.own_session>`).
        """
        self.aggregation.new_run()
        return super().start(*args, **kwargs)

    def summary(self) -> None:
        """Log the configuration."""
        super().summary()
        settings = self.aggregation.settings
        log(
            INFO,
            "\t└──> SSA: top-k ratio %s, %s fractional bits, %s%s",
            self.topk_ratio,
            settings.frac_bits,
            f"weighted by {self.weighted_by_key!r}" if settings.weighted else "unit weights",
            f", mega-element rows of {', '.join(self.groups)}" if self.groups else "",
        )

    def layout(self, model: Mapping[str, NDArray[np.generic]]) -> FlatLayout | MegaLayout:
        """Return the round's element space: flat coordinates, or mega-elements with ``groups``.

        Raises
        ------
        ConfigurationError
            If a group is not a floating tensor of the model with rows.
        """
        if self.groups:
            return MegaLayout.of(model, self.groups)
        return FlatLayout.of(model)

    def round_items(self, layout: FlatLayout | MegaLayout) -> int:
        """Return ``k``, the elements one client may send this round (public).

        Flat: ``ceil(topk_ratio * m)``. Mega-elements: per group ``ceil(topk_ratio * rows)``
        plus ``ceil(topk_ratio * coordinates)`` of the other tensors, exactly what
        ``topk_mod`` keeps at ``topk-ratio`` with these ``topk-groups``.
        """
        if isinstance(layout, MegaLayout):
            sizes = layout.group_sizes().values()
            return sum(min(n, math.ceil(self.topk_ratio * n)) for n in sizes)
        return min(layout.size, math.ceil(self.topk_ratio * layout.size))

    def round_config(
        self, state: RoundState, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> ConfigRecord:
        """FedAvg's train config plus the round's SSA parameters, S1's key and the top-k keys.

        Flat rounds send ``topk-count = k``; rounds with ``groups`` send ``topk-ratio``,
        ``topk-groups`` and ``topk-scope = "global"`` (the client's ``topk_mod`` then keeps
        exactly :meth:`round_items` elements).
        """
        layout = self.layout(state.model)
        if layout.size == 0:
            raise ConfigurationError("the model has no floating tensors to aggregate")
        k = self.round_items(layout)
        params = self.aggregation.round_params(
            grid,
            round_id=state.server_round,
            domain_size=layout.size,
            num_items=k,
            value_width=layout.width,
            hash_key=os.urandom(16),  # fresh per round: top-k sets change every round
            max_summands=max(1, len(list(grid.get_node_ids()))),
        )
        state.protocol = params
        out = super().round_config(state, arrays, config, grid)
        if self.groups:
            out["topk-ratio"] = float(self.topk_ratio)
            out["topk-groups"] = ",".join(self.groups)
            out["topk-scope"] = "global"
        else:
            out["topk-count"] = k
        for key, value in self.aggregation.round_fields(params, self.weighted_by_key).items():
            out[key] = value
        return out

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run a round with the uploads streamed into SSA as they arrive.

        Under :meth:`start`, S0 relays and evaluates the uploads one chunk at a time
        (:meth:`~flwr_fsl.core.engine.PhasedStrategy.stream`), so it never holds a
        round's uploads together; Flower's own loop (``configure_train`` /
        ``aggregate_train``) hands over all replies at once instead.
        """
        messages = list(self.configure_train(state.server_round, arrays, config, grid))
        if state.failure is not None:  # failed while configuring (e.g. S1 unreachable)
            return None, None
        params: SSAParams = state.protocol
        parse = self.aggregation.parser(params, accept_hints=False)
        uploads = self.stream(grid, state, "train", messages, parse)
        return self.aggregation.apply(
            state, params, uploads, self.layout(state.model), self.train_metrics
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, run SSA with S1, apply the count-weighted average."""
        state = self.round_state(server_round)
        if state.failure is not None:  # failed while configuring (e.g. S1 unreachable)
            return None, None
        params: SSAParams = state.protocol
        parse = self.aggregation.parser(params, accept_hints=False)
        uploads = self.receive(state, "train", replies, parse)
        try:
            return self.aggregation.apply(
                state, params, uploads, self.layout(state.model), self.train_metrics
            )
        except RoundFailedError as err:  # Flower's own loop may drive this method
            self.fail_round(state, err)
            return None, None

    def round_noise_multiplier(self) -> float | None:
        """Each server's noise multiplier of every round (None: DP off, no noise)."""
        return self.aggregation.noise_multiplier()

    def round_minimum(self, sampled: int) -> tuple[int, str]:
        """Return ``min_clients``, checked before round 1."""
        return self.aggregation.round_minimum()

    def privacy_stop_reason(self) -> str | None:
        """S1's refusal of a round past its own account of this run (the run then stops)."""
        return self.aggregation.helper_refusal

    def round_failed(self, state: RoundState, error: RoundFailedError) -> None:
        """Release the round on S1."""
        self.aggregation.abort(state)
