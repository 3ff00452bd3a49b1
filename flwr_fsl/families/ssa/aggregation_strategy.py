"""Two-server SSA as a component a strategy holds: :class:`TwoServerAggregation`.

The protocol logic — the order S0 and S1 aggregate in, their invariants, S0's PSR answers, the
U-DPF stored keys — lives in the Flower-free :class:`~flwr_fsl.families.ssa.two_server.LeadServer`.
This module only connects it to Flower: the round's fields in the train message, parsing a
reply into a :class:`~flwr_fsl.families.ssa.two_server.ClientUpload` (the engine drops a client
whose reply does not parse), dropping the clients S1 rejects, and releasing S1's round when
the round fails. :class:`~flwr_fsl.strategies.SecureFedSubAvg` (top-k coordinates) and
:class:`~flwr_fsl.strategies.SecureRowFedSubAvg` (table rows) each hold one.

With ``SSASettings.dp`` (:class:`~flwr_fsl.families.ssa.dp.DistributedDP`) every round's
parameters carry the DP settings (clients clip, each server noises its share) and the run
(:class:`~flwr_fsl.families.ssa.dp.RunScope`: the Flower run id and ``SSASettings.budget``, by
which S1 keeps its own account); the noisy aggregate is post-processed (elements with a small
noisy count are left unchanged, :func:`~flwr_fsl.families.ssa.dp.suppress_small_counts`).
:attr:`TwoServerAggregation.privacy_account` is the run's
:class:`~flwr_fsl.core.privacy.PrivacyAccount` (the strategy's, which the round engine spends
before each round and stops the run with); its ``(ε, δ)`` is logged after every round and
reported as the ``dp-epsilon`` metric. When S1 refuses a round past its own account of the run
(:class:`~flwr_fsl.core.privacy.PrivacyBudgetExhaustedError`), :attr:`helper_refusal` keeps why
and the strategy stops the run before the next round.

Every round is opened on S1 in :meth:`TwoServerAggregation.round_fields`, before any client is
asked anything: a round while S1 is down fails there (model unchanged, nobody trains for
nothing), and a restarted S1 is noticed there — S0 forgets its stored U-DPF keys before it
announces which keys it holds (``fsl.udpf.held``), so clients send fresh keys instead of hints
(:meth:`LeadServer.open <flwr_fsl.families.ssa.two_server.LeadServer.open>`). A restarted S1 that
comes back with a key other than the pinned one fails each round there
(:class:`~flwr_fsl.families.ssa.two_server.HelperKeyMismatchError`, logged by the round engine
with both fingerprints; the model is unchanged and no client is asked anything) until it is
back with the pinned key; the run goes on.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.core.checks import check_bool, check_choice, check_int, check_real, check_str
from flwr_fsl.core.engine import RoundState
from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.privacy import (
    DEFAULT_DELTA,
    PrivacyAccount,
    PrivacyBudget,
    PrivacyBudgetExhaustedError,
    refuse_plaintext_evaluation,
)
from flwr_fsl.families.ssa.dp import (
    DEFAULT_BUDGET,
    DistributedDP,
    RunScope,
    noise_std,
    suppress_small_counts,
)
from flwr_fsl.families.ssa.messages import VALUE_CHECKS
from flwr_fsl.families.ssa.protocol import SSAParams
from flwr_fsl.families.ssa.records import (
    HELPER_KEY_FIELD,
    PARAMS_FIELD,
    SESSION_FIELD,
    SSA_UPLOAD_KEY,
    WEIGHT_KEY_FIELD,
    read_hint_upload,
    read_ssa_upload,
)
from flwr_fsl.families.ssa.two_server import ClientUpload, HelperParty, LeadServer, SSARound
from flwr_fsl.helper.setup import note_in_process
from flwr_fsl.submodel.aggregate import apply_count_weighted_parts
from flwr_fsl.submodel.layout import Layout

TrainMetrics = Callable[[list[RecordDict], RoundState, float], MetricRecord]
Uploads = Mapping[int, ClientUpload] | Iterable[tuple[int, ClientUpload]]

__all__ = ["SSASettings", "TwoServerAggregation", "read_upload", "secure_flower_kwargs"]


@dataclass(frozen=True)
class SSASettings:
    """Fixed-point and hashing settings of every SSA round of a run.

    Parameters
    ----------
    frac_bits, max_abs : int, float
        Fixed-point format of the payload words (``max_abs`` bounds ``c * dw`` and ``c``).
    stash_size, num_hashes : int
        Cuckoo stash size and number of hash functions.
    min_clients : int
        Minimum participation: a round with fewer accepted clients fails unreconstructed.
    dp : DistributedDP or None
        Distributed differential privacy (:mod:`flwr_fsl.families.ssa.dp`): clients clip to
        ``dp.clip_norm`` / ``dp.max_weight`` and each server adds noise of multiplier
        ``dp.noise_multiplier`` (> 0 here) to its share; None: no noise.
    budget : PrivacyBudget or None
        The run's privacy budget (default :data:`~flwr_fsl.families.ssa.dp.DEFAULT_BUDGET`,
        used only with ``dp``): S0 stops the run before a round that would exceed it, and S1
        (told it in every round's parameters) refuses such a round; None accounts without
        stopping. Its ``delta`` must equal ``dp.delta``.
    weighted : bool
        False (default): unit weights, every client's count word is 1 (``SSAParams.weighted``);
        True: the strategy's ``weighted_by_key`` (or per-element counts) as the weight.
    value_check : str
        How both servers check every client's value words (``SSAParams.value_check``):
        ``"projected"`` (default; random projections, every value word within
        ``2T = 8 sqrt(k w) * max_abs`` in fixed point, a few thousand upload words,
        :mod:`flwr_fsl.families.ssa.projected_check`), ``"exact"`` (every word within
        ``max_abs``; ``8 * L`` upload bytes per value word per key, 2-3x the upload,
        :mod:`flwr_fsl.families.ssa.range_check`) or ``"off"`` (unchecked).

    Raises
    ------
    ConfigurationError
        If a setting is out of range (checked before round 1, naming the setting).
    """

    frac_bits: int = 24
    max_abs: float = 1e4
    stash_size: int = 0
    num_hashes: int = 3
    min_clients: int = 2
    dp: DistributedDP | None = None
    budget: PrivacyBudget | None = DEFAULT_BUDGET
    weighted: bool = False
    value_check: str = "projected"

    def __post_init__(self) -> None:
        # Types first, by name; SSAParams below checks the ranges.
        check_int("frac_bits", self.frac_bits, 0)
        check_real("max_abs", self.max_abs, 0.0, low_open=True)
        check_int("stash_size", self.stash_size, 0)
        check_int("num_hashes", self.num_hashes, 1)
        check_bool("weighted", self.weighted)
        check_choice("value_check", self.value_check, VALUE_CHECKS)
        if isinstance(self.min_clients, bool) or not isinstance(self.min_clients, int):
            raise ConfigurationError(f"min_clients must be an integer, got {self.min_clients!r}")
        if self.min_clients < 1:
            raise ConfigurationError(f"min_clients must be >= 1, got {self.min_clients}")
        if self.dp is not None:
            if not isinstance(self.dp, DistributedDP):
                raise ConfigurationError(f"dp must be a DistributedDP, got {self.dp!r}")
            if self.dp.noise_multiplier <= 0:
                raise ConfigurationError(
                    f"dp.noise_multiplier must be > 0 (S0's noise protects the clients against "
                    f"S1), got {self.dp.noise_multiplier}"
                )
        if self.budget is not None:
            if not isinstance(self.budget, PrivacyBudget):
                raise ConfigurationError(
                    f"privacy_budget must be a PrivacyBudget or None, got {self.budget!r}"
                )
            if self.dp is not None and self.dp.delta != self.budget.delta:
                raise ConfigurationError(
                    f"dp.delta {self.dp.delta:g} differs from privacy_budget.delta "
                    f"{self.budget.delta:g}: give both the same delta"
                )
        # SSAParams raises ConfigurationError itself (naming the bad setting).
        self.params(round_id=1, domain_size=64, num_items=1, value_width=1, hash_key=bytes(16))

    def params(self, **fields: Any) -> SSAParams:
        """Return the round's :class:`SSAParams` with these settings and ``fields``."""
        return SSAParams(
            count_weighted=True,
            num_hashes=self.num_hashes,
            stash_size=self.stash_size,
            frac_bits=self.frac_bits,
            max_abs=self.max_abs,
            dp=self.dp,
            weighted=self.weighted,
            value_check=self.value_check,
            **fields,
        )


def check_helper(helper: object, helper_fingerprint: object) -> None:
    """Refuse, by name, a ``helper`` that is not an S1 connection or a bad fingerprint.

    Raises
    ------
    ConfigurationError
        If ``helper`` lacks :class:`HelperParty`'s methods (e.g. an address string was
        passed: connect first with :func:`flwr_fsl.helper.connect_helper`), or
        ``helper_fingerprint`` is neither None nor a non-empty string.
    """
    needed = ("public_key", "open_session", "open_round")
    if not all(callable(getattr(helper, name, None)) for name in needed):
        raise ConfigurationError(
            f"helper must be a connection to S1 (HelperConnection or InProcessHelper), got "
            f"{type(helper).__name__}"
        )
    if helper_fingerprint is not None:
        check_str("helper_fingerprint", helper_fingerprint)


def secure_flower_kwargs(
    strategy: str, weighted: bool, plaintext_evaluation: bool, kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Check an SSA strategy's weighting and evaluation arguments; return Flower's with defaults.

    Federated evaluation defaults to off (``fraction_evaluate=0.0``): evaluate replies carry
    every client's metrics and ``num-examples`` in the clear. A ``fraction_evaluate > 0`` is
    refused unless ``plaintext_evaluation``
    (:func:`flwr_fsl.core.privacy.refuse_plaintext_evaluation`).

    Parameters
    ----------
    strategy : str
        The strategy's class name (for the messages).
    weighted : bool
        The strategy's ``weighted`` argument.
    plaintext_evaluation : bool
        The strategy's opt-in to federated evaluation in the clear.
    kwargs : dict
        The Flower ``FedAvg`` arguments given to the strategy.

    Returns
    -------
    dict
        ``kwargs`` with ``fraction_evaluate`` defaulting to 0.0.

    Raises
    ------
    ConfigurationError
        If ``weighted`` or ``plaintext_evaluation`` is not a bool, ``weighted_by_key`` is set
        while ``weighted`` is False (it would have no effect), ``clipping_range`` is given (it
        would have no effect), or federated evaluation is asked for without
        ``plaintext_evaluation=True``.
    """
    for name, value in (("weighted", weighted), ("plaintext_evaluation", plaintext_evaluation)):
        if not isinstance(value, bool):
            raise ConfigurationError(f"{strategy}: {name} must be a bool, got {value!r}")
    key = kwargs.get("weighted_by_key")
    if not weighted and key is not None and key != "num-examples":
        raise ConfigurationError(
            f"{strategy}: weighted_by_key={key!r} is used only with weighted=True (by default "
            "every client counts 1 and no metric is read)"
        )
    if "clipping_range" in kwargs:
        # FedSubAvg's plaintext clip never runs here: the clients' fixed-point encoding
        # refuses any value beyond max_abs instead.
        raise ConfigurationError(
            f"{strategy}: clipping_range does not apply to secure aggregation; each value is "
            "bounded by max_abs (clients refuse larger ones)"
        )
    out = {"fraction_evaluate": 0.0, **kwargs}
    refuse_plaintext_evaluation(strategy, out["fraction_evaluate"], plaintext_evaluation)
    return out


def read_upload(content: RecordDict, key: str = SSA_UPLOAD_KEY) -> ClientUpload:
    """Read a client's SSA upload (fresh keys or a U-DPF hint) or PSR query record.

    Raises
    ------
    SubmodelFormatError
        If the record is missing or malformed.
    """
    if key.split("#")[0] == SSA_UPLOAD_KEY:  # an SSA upload (a mixed round's part too)
        hint = read_hint_upload(content, key)
        if hint is not None:
            return ClientUpload(hint=hint[0], sealed=hint[1])
    public, seed, sealed = read_ssa_upload(content, key)
    return ClientUpload(public, seed, sealed)


_CLAIMED: weakref.WeakKeyDictionary[HelperParty, bytes] = weakref.WeakKeyDictionary()
"""Connection to S1 -> the session a ``start()`` last ran in (the next one opens a new one)."""


class TwoServerAggregation:
    """S0's two-server SSA for a strategy: wraps a :class:`LeadServer` for the round engine.

    Parameters
    ----------
    helper : HelperParty
        The connection to S1 (:func:`flwr_fsl.helper.connect_helper`).
    helper_fingerprint : str, optional
        Pinned fingerprint of S1's public key, checked by S0 (clients check their own).
    settings : SSASettings
        Fixed-point and hashing settings.
    """

    def __init__(
        self,
        helper: HelperParty,
        helper_fingerprint: str | None = None,
        settings: SSASettings | None = None,
    ) -> None:
        self.settings = settings or SSASettings()
        self.lead = LeadServer(helper, helper_fingerprint, self.settings.min_clients)
        note_in_process(helper)  # the simulation caveat, once per process
        dp = self.settings.dp
        delta = dp.delta if dp is not None else DEFAULT_DELTA
        self.privacy_account = PrivacyAccount(
            self.settings.budget if dp is not None else None, delta=delta
        )
        self.helper_refusal: str | None = None
        self._own_session = False  # see own_session: False until this start()'s session is open

    def new_run(self) -> None:
        """Mark a new ``start()`` of the strategy: its first round takes a session of its own."""
        self._own_session = False

    def own_session(self) -> None:
        """Open an S1 session of this run's own, once per ``start()``, before S1 is first asked.

        Every ``start()`` numbers its rounds from 1 and S1 refuses a round id a session has
        opened before, so two strategies on one connection (or one strategy started twice)
        would collide in one session. The first ``start()`` on a connection runs in the
        connection's session (the one :func:`~flwr_fsl.helper.connect_helper` opened, or a new
        one); a later one opens a new session (the connection closes its previous one). A new
        session is empty on S1, so S0 forgets its stored U-DPF keys (clients send fresh keys
        in the first round). S1 keeps its privacy account of a DP run across sessions (by run
        id). Idempotent until :meth:`new_run`.

        Raises
        ------
        HelperError
            If S1 cannot be reached or refuses the session: the round fails, the next one
            tries again.
        ConfigurationError, HelperKeyMismatchError
            As :meth:`LeadServer.helper_key
            <flwr_fsl.families.ssa.two_server.LeadServer.helper_key>` (checked first).
        """
        if self._own_session:
            return
        self.lead.helper_key()  # no session on an S1 whose key does not match the pin
        self.lead.forget_keys()
        helper = self.lead.helper
        try:
            claimed = _CLAIMED.get(helper)
        except TypeError:  # a connection that cannot be weakly referenced: a new session
            claimed = helper.session_id
        if claimed is not None and claimed == helper.session_id:  # a start() ran in it
            helper.open_session()
        with contextlib.suppress(TypeError):
            _CLAIMED[helper] = helper.session_id
        self._own_session = True

    def round_minimum(self) -> tuple[int, str]:
        """Return the fewest clients a round needs and the setting that decides it.

        S0's ``min_clients``. S1's own minimum (``flwr-fsl-helper --min-clients``) is S1's to
        enforce at round time, whatever S0 checks.
        """
        return self.settings.min_clients, "min_clients"

    def noise_multiplier(self) -> float | None:
        """Return the ``z`` of every round (each server's noise; None: no DP)."""
        return None if self.settings.dp is None else self.settings.dp.noise_multiplier

    def round_params(self, grid: Grid, **fields: Any) -> SSAParams:
        """Return the round's :class:`SSAParams`; a DP round names its run (run id, budget)."""
        run = None
        if self.settings.dp is not None:
            run = RunScope(str(grid.run.run_id), self.settings.budget)
        return self.settings.params(run=run, **fields)

    def describe_privacy(self, parts: int = 1) -> str:
        """One line: the run's ``(ε, δ)`` against each server, or that no noise is added.

        ``parts``: releases per round (a mixed round's parts, each noised at ``z``).
        """
        z = self.noise_multiplier()
        if z is None:
            seen = "weighted sum and total weight" if self.settings.weighted else "sum and count"
            return (
                "differential privacy: off -- no noise is added (epsilon = inf): both servers "
                f"see every element's exact {seen}"
            )
        account = self.privacy_account
        budget = self.settings.budget
        each = ""
        if parts > 1:
            each = f" on each of {parts} parts (one round at {z / math.sqrt(parts):.3g})"
        limit = "no budget" if budget is None else f"budget epsilon = {budget.epsilon:g}"
        return (
            f"differential privacy: (epsilon, delta) = ({account.epsilon():.3g}, "
            f"{account.delta:g}) against each server (S0 by S1's noise, S1 by S0's) after "
            f"{account.rounds} round(s) at noise multiplier {z:g}{each} ({limit}; S1 keeps its "
            "own account of the run)"
        )

    def round_fields(self, params: SSAParams, weight_key: str) -> dict[str, Any]:
        """Open the round on S1 and return what every client needs (parameters, S1's key, session).

        A weighted round also names its weight key (:data:`WEIGHT_KEY_FIELD`); a round with
        unit weights names none (clients read no metric).

        Raises
        ------
        RoundFailedError
            If S1 cannot be reached, refuses the round, or came back with a key that does
            not match the pinned fingerprint
            (:class:`~flwr_fsl.families.ssa.two_server.HelperKeyMismatchError`): the round
            fails before any client is asked anything.
        ConfigurationError
            If S1's key has never matched the pinned fingerprint in this run.
        """
        self.own_session()
        losses = len(self.lead.session_losses)
        try:
            self.lead.open(params)
        except PrivacyBudgetExhaustedError as err:
            self.helper_refusal = f"S1 refused round {params.round_id}: {err}"
            raise
        if len(self.lead.session_losses) > losses:
            log(
                WARNING,
                "round %s: S1 no longer held this run's session (restarted or expired): "
                "session re-opened; stored U-DPF keys forgotten, clients send fresh keys",
                params.round_id,
            )
        fields: dict[str, Any] = {
            PARAMS_FIELD: params.to_bytes(),
            HELPER_KEY_FIELD: self.lead.helper_key(),
            SESSION_FIELD: self.lead.session_id,
        }
        if params.weighted:
            fields[WEIGHT_KEY_FIELD] = weight_key
        return fields

    def parser(
        self, params: SSAParams, accept_hints: bool
    ) -> Callable[[int, RecordDict], ClientUpload]:
        """Return the engine's ``parse`` for the round's uploads (record and keys).

        A secure reply carries no weight or metric in the clear: each client's weight (1 by
        default, ``SSAParams.weighted``) rides in the count word of its payload, so S0 learns
        only per-element count words. Anything else in the reply is ignored.
        """

        def parse(node: int, content: RecordDict) -> ClientUpload:
            upload = read_upload(content)
            self.lead.check_upload(params, node, upload, accept_hints=accept_hints)
            return upload

        return parse

    def aggregate(self, state: RoundState, params: SSAParams, uploads: Uploads) -> SSARound | None:
        """Securely aggregate the round with S1; drop the clients S1 rejects.

        ``uploads`` may be a mapping or a stream (:meth:`PhasedStrategy.stream
        <flwr_fsl.core.engine.PhasedStrategy.stream>`): S0 relays and evaluates them one
        chunk at a time as they arrive. Returns None when no client is left. Raises
        :class:`~flwr_fsl.core.errors.RoundFailedError` when the round fails (the engine then
        calls :meth:`abort`).
        """
        stream = iter(uploads.items() if isinstance(uploads, Mapping) else uploads)
        first = next(stream, None)
        if first is None:
            log(WARNING, "aggregate_train: no valid reply; the global model is unchanged")
            self.abort(state, [params.round_id])  # a mixed round's part has its own id
            return None
        try:
            if isinstance(uploads, Mapping):
                outcome = self.lead.aggregate(params, uploads)  # checks participation up front
            else:
                outcome = self.lead.aggregate(params, itertools.chain([first], stream))
        except PrivacyBudgetExhaustedError as err:
            self.helper_refusal = f"S1 refused round {params.round_id}: {err}"
            raise
        for node, reason in outcome.rejected.items():
            state.drop(node, f"rejected by S1: {reason}")
        state.survivors = list(outcome.accepted)
        if not outcome.accepted:
            return None
        log(INFO, "aggregate_train: securely aggregated %d clients", len(outcome.accepted))
        return outcome

    def apply(
        self,
        state: RoundState,
        params: SSAParams,
        uploads: Uploads,
        layout: Layout,
        train_metrics: TrainMetrics,
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the parsed uploads and apply the count-weighted average to the model.

        Parameters
        ----------
        state : RoundState
            The round (its ``model`` is what the deltas refer to).
        params : SSAParams
            The round's parameters.
        uploads : Mapping[int, ClientUpload] or iterable of (int, ClientUpload)
            What :meth:`parser` returned per accepted node (a stream is consumed lazily).
        layout : Layout
            The element space of the round (flat coordinates or table rows).
        train_metrics : Callable
            The strategy's round metrics (client contents — none here —, state, touched
            fraction).

        Returns
        -------
        tuple[ArrayRecord | None, MetricRecord | None]
            The new model and metrics, or ``(None, None)`` when nobody is left.

        Raises
        ------
        RoundFailedError
            If the secure aggregation fails (the model is unchanged).
        """
        return self.apply_parts(state, [(params, uploads, layout)], train_metrics)

    def apply_parts(
        self,
        state: RoundState,
        parts: Sequence[tuple[SSAParams, Uploads, Layout]],
        train_metrics: TrainMetrics,
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate several parts of one model (each its own SSA round) and apply them at once.

        A mixed index-mode round (:mod:`flwr_fsl.families.ssa.mixed`) has one part per row table
        plus one for the dense tensors; each is aggregated with S1 as its own round, released
        (DP post-processing per part) and the model is updated by one count-weighted apply
        over all parts (:func:`~flwr_fsl.submodel.aggregate.apply_count_weighted_parts`).
        :meth:`apply` is the one-part case.

        Parameters
        ----------
        state : RoundState
            The round (its ``model`` is what the deltas refer to).
        parts : Sequence[tuple[SSAParams, uploads, Layout]]
            Per part its round parameters, the parsed uploads and its element space.
        train_metrics : Callable
            As in :meth:`apply`.

        Returns
        -------
        tuple[ArrayRecord | None, MetricRecord | None]
            The new model and metrics, or ``(None, None)`` when a part has nobody left.

        Raises
        ------
        RoundFailedError
            If a part's secure aggregation fails (the model is unchanged).
        """
        released: list[tuple[Layout, NDArray[np.float64], NDArray[np.float64]]] = []
        hinted, survivors = 0, None
        for params, uploads, layout in parts:
            outcome = self.aggregate(state, params, uploads)
            if outcome is None:
                return None, None
            counts = outcome.result.counts
            assert counts is not None  # every round of this component is count-weighted
            sums = outcome.result.sums
            if params.dp is not None:
                sums, counts = self._release(state, params, sums, counts)
            released.append((layout, sums, counts))
            hinted += outcome.hinted
            accepted = set(outcome.accepted)
            survivors = accepted if survivors is None else survivors & accepted
        state.survivors = sorted(survivors or ())
        new_arrays = apply_count_weighted_parts(state.model, released)
        touched = sum(int(np.count_nonzero(c)) for _, _, c in released)
        metrics = train_metrics([], state, float(touched) / sum(lay.size for lay, _, _ in released))
        metrics["udpf-clients"] = hinted
        if self.settings.dp is not None:
            metrics["dp-epsilon"] = self.privacy_account.epsilon()
            metrics["dp-delta"] = self.privacy_account.delta
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in new_arrays.items()}), metrics

    def _release(
        self,
        state: RoundState,
        params: SSAParams,
        sums: NDArray[np.float64],
        counts: NDArray[np.float64],
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Post-process a noisy aggregate and log the run's ``(ε, δ)`` (S0's noise vs S1)."""
        dp = params.dp
        assert dp is not None
        sigma = noise_std(dp, params.num_items, params.value_width, params.frac_bits)
        # Both servers add at least sigma (S1 may add more): the count noise std is >= this.
        sums, counts, threshold = suppress_small_counts(sums, counts, math.sqrt(2) * sigma)
        log(
            INFO,
            "aggregate_train: DP round %s: noise std %.4g per word and server, %d elements "
            "above the noisy-count threshold %.4g; against each server alone after %s",
            state.server_round,
            sigma,
            int(np.count_nonzero(counts)),
            threshold,
            self.privacy_account.describe(),
        )
        return sums, counts

    def abort(self, state: RoundState, round_ids: Iterable[int] | None = None) -> None:
        """Release the round on S1 (after a failure, or when nobody is left).

        ``round_ids``: the S1 rounds to release (a mixed round has one per part); default the
        Flower round's own id.
        """
        for round_id in [state.server_round] if round_ids is None else round_ids:
            problem = self.lead.abort(round_id)
            if problem is not None:
                log(WARNING, "could not abort round %s on S1: %s", round_id, problem)
