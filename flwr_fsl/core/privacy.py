"""Run-level privacy accounting, budgets and the client's own floors, shared by every family.

**Accounting.** Every noised release the project makes is a Gaussian mechanism (SSA's server
noise) or close to one (the distributed discrete Gaussian of SecAgg/SFSL clients, see
:mod:`flwr_fsl.crypto.discrete_gaussian`), so a round is recorded by its *effective noise
multiplier* ``z`` (noise std over L2 sensitivity; a ``ρ``-zCDP release is ``z = 1/sqrt(2ρ)``).
:class:`PrivacyAccount` composes the rounds with Google's ``dp-accounting`` Rényi-DP accountant
(Mironov 2017), which is tighter than the zCDP conversion ``ε = ρ + 2 sqrt(ρ ln 1/δ)`` kept in
:func:`flwr_fsl.families.ssa.dp.zcdp_to_epsilon` as a cross-check. Every round that reaches its
release point counts, whether a given client took part or not: no amplification by sampling is
claimed, because the sampling is the server's and the server is the adversary.

**Budget.** A run carries a :class:`PrivacyBudget`. Before each round the strategy asks
:meth:`PrivacyAccount.refusal` whether one more round at its ``z`` stays within the budget and
stops the run when it would not; a helper server (SSA's S1) keeps its own account of the same
run on disk and refuses rounds past it, so restarting either party does not reset the budget.
A budget is what bounds what any number of rounds (or replays) can reveal.

**Client floors.** A client does not take the server's word for the noise or the weights: its
node config may set a floor (:data:`NODE_MIN_NOISE_KEY`) and an allow-list of weight metrics
(:data:`NODE_WEIGHT_KEYS_KEY`); :func:`check_noise_floor` and :func:`check_weight_key` refuse a
round below them, naming the key.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from flwr_fsl.core.checks import check_bool, check_fraction
from flwr_fsl.core.errors import ConfigurationError, RoundFailedError

__all__ = [
    "DEFAULT_DELTA",
    "MAX_ACCOUNT_ROUNDS",
    "NODE_MIN_NOISE_KEY",
    "NODE_WEIGHT_KEYS_KEY",
    "PrivacyAccount",
    "PrivacyBudget",
    "PrivacyBudgetExhaustedError",
    "check_noise_floor",
    "check_weight_key",
    "node_noise_floor",
    "node_weight_keys",
    "refuse_plaintext_evaluation",
    "rho_to_noise_multiplier",
]

DEFAULT_DELTA = 1e-5
"""``δ`` of the reported ``(ε, δ)`` when no budget names one."""

MAX_ACCOUNT_ROUNDS = 1_000_000
"""Most rounds an account file may list (its decoder refuses longer files)."""

NODE_MIN_NOISE_KEY = "fsl-min-noise-multiplier"
"""Node-config key: the smallest effective noise multiplier this client accepts for a round."""

NODE_WEIGHT_KEYS_KEY = "fsl-weight-keys"
"""Node-config key: comma-separated metric names (besides ``num-examples``) usable as weights."""

WEIGHT_KEY_ALWAYS_ALLOWED = "num-examples"


class PrivacyBudgetExhaustedError(RoundFailedError):
    """One more round would exceed the run's privacy budget: the run must stop."""


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PrivacyBudget:
    """The most ``(ε, δ)`` a run may spend.

    Parameters
    ----------
    epsilon : float
        Finite and > 0.
    delta : float
        In ``(0, 1)``.

    Raises
    ------
    ConfigurationError
        If a field is out of range (the message names it).
    """

    epsilon: float
    delta: float = DEFAULT_DELTA

    def __post_init__(self) -> None:
        eps = _number("epsilon", self.epsilon)
        if not (math.isfinite(eps) and eps > 0):
            raise ConfigurationError(f"epsilon must be finite and > 0, got {self.epsilon!r}")
        delta = _number("delta", self.delta)
        if not 0 < delta < 1:
            raise ConfigurationError(f"delta must be in (0, 1), got {self.delta!r}")


def rho_to_noise_multiplier(rho: float) -> float:
    """Return the Gaussian ``z`` with the same Rényi curve as ``ρ``-zCDP: ``z = 1/sqrt(2ρ)``.

    Raises
    ------
    ConfigurationError
        If ``rho`` is negative or NaN.
    """
    if not rho >= 0:
        raise ConfigurationError(f"rho must be >= 0, got {rho!r}")
    return math.inf if rho == 0 else (0.0 if math.isinf(rho) else 1.0 / math.sqrt(2.0 * rho))


def _check_z(noise_multiplier: float) -> float:
    z = _number("noise_multiplier", noise_multiplier)
    if math.isnan(z) or z < 0:
        raise ConfigurationError(f"noise_multiplier must be >= 0, got {noise_multiplier!r}")
    return z


def _rdp_epsilon(noise_multipliers: list[float], delta: float) -> float:
    """``ε`` at ``δ`` of the composed Gaussian rounds (``inf`` if any has ``z = 0``)."""
    if not noise_multipliers:
        return 0.0
    if any(z == 0 for z in noise_multipliers):
        return math.inf
    # Imported here: it loads scipy, which only a run that accounts needs.
    import dp_accounting
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    counts: dict[float, int] = {}
    for z in noise_multipliers:
        if not math.isinf(z):  # z = inf: a round that released nothing about any client
            counts[z] = counts.get(z, 0) + 1
    for z, n in counts.items():
        accountant.compose(dp_accounting.GaussianDpEvent(z), n)
    return float(accountant.get_epsilon(delta)) if counts else 0.0


@dataclass
class PrivacyAccount:
    """The ``(ε, δ)`` a run has spent, round by round, with its budget.

    Parameters
    ----------
    budget : PrivacyBudget, optional
        The run's ceiling; ``None`` accounts without stopping (the reported ``δ`` is then
        ``delta``).
    delta : float
        ``δ`` reported when there is no budget.
    path : pathlib.Path, optional
        A JSON file the account is kept in: loaded if it exists, rewritten atomically after
        every round, so a restarted party resumes the same account.

    Attributes
    ----------
    noise_multipliers : list[float]
        The effective ``z`` of every round spent, in order.
    """

    budget: PrivacyBudget | None = None
    delta: float = DEFAULT_DELTA
    path: Path | None = None
    noise_multipliers: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.budget is not None:
            self.delta = self.budget.delta
        elif not 0 < _number("delta", self.delta) < 1:
            raise ConfigurationError(f"delta must be in (0, 1), got {self.delta!r}")
        if self.path is not None and self.path.exists():
            self.noise_multipliers = self.decode(self.path.read_bytes())

    @property
    def rounds(self) -> int:
        """Rounds spent."""
        return len(self.noise_multipliers)

    def epsilon(self) -> float:
        """``ε`` spent so far at :attr:`delta` (0 before any round)."""
        return _rdp_epsilon(self.noise_multipliers, self.delta)

    def epsilon_after(self, noise_multiplier: float) -> float:
        """``ε`` the account would show after one more round at ``noise_multiplier``."""
        return _rdp_epsilon([*self.noise_multipliers, _check_z(noise_multiplier)], self.delta)

    def refusal(self, noise_multiplier: float) -> str | None:
        """Why one more round at ``noise_multiplier`` may not run (``None``: it may).

        Raises
        ------
        ConfigurationError
            If ``noise_multiplier`` is negative or NaN.
        """
        if self.budget is None:
            return None
        after = self.epsilon_after(noise_multiplier)
        if after <= self.budget.epsilon:
            return None
        return (
            f"one more round at noise multiplier {noise_multiplier:g} would spend "
            f"epsilon={after:.4g} > the run's budget {self.budget.epsilon:g} "
            f"(delta={self.budget.delta:g}; {self.rounds} round(s) spent, "
            f"epsilon={self.epsilon():.4g})"
        )

    def spend(self, noise_multiplier: float) -> None:
        """Record one round at ``noise_multiplier`` (and persist it when :attr:`path` is set).

        Raises
        ------
        PrivacyBudgetExhaustedError
            If the round would exceed the budget (nothing is recorded).
        """
        reason = self.refusal(noise_multiplier)
        if reason is not None:
            raise PrivacyBudgetExhaustedError(reason)
        if self.rounds >= MAX_ACCOUNT_ROUNDS:
            raise PrivacyBudgetExhaustedError(f"the account holds {MAX_ACCOUNT_ROUNDS} rounds")
        self.noise_multipliers.append(_check_z(noise_multiplier))
        if self.path is not None:
            self._save(self.path)

    def describe(self) -> str:
        """One log line: rounds and ``(ε, δ)`` (with the budget when there is one)."""
        eps = self.epsilon()
        text = f"{self.rounds} round(s): (epsilon, delta) = ({eps:.4g}, {self.delta:.3g})"
        if self.budget is not None:
            text += f" of budget epsilon={self.budget.epsilon:g}"
        return text

    # -- persistence ---------------------------------------------------------------------------
    def encode(self) -> bytes:
        """Return the account's file content (versioned JSON; ``inf`` written as ``null``)."""
        zs = [None if math.isinf(z) else z for z in self.noise_multipliers]
        return json.dumps({"version": 1, "noise_multipliers": zs}).encode()

    @staticmethod
    def decode(raw: bytes) -> list[float]:
        """Parse :meth:`encode` output strictly.

        Raises
        ------
        ConfigurationError
            If the file is not such an account (the file is the operator's, not a client's).
        """
        if len(raw) > 32 * MAX_ACCOUNT_ROUNDS:
            raise ConfigurationError("privacy account file is too large")
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ConfigurationError(f"privacy account file is not JSON: {err}") from None
        if not isinstance(doc, dict) or set(doc) != {"version", "noise_multipliers"}:
            raise ConfigurationError("privacy account file has unexpected fields")
        if doc["version"] != 1 or not isinstance(doc["noise_multipliers"], list):
            raise ConfigurationError("privacy account file has an unknown version or shape")
        out: list[float] = []
        for z in doc["noise_multipliers"]:
            out.append(math.inf if z is None else _check_z(z))
        return out

    def _save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(self.encode())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


# -- what a client accepts ---------------------------------------------------------------------
def node_noise_floor(node_config: Mapping[str, object], default: float) -> float:
    """Return the client's noise floor (:data:`NODE_MIN_NOISE_KEY`, else ``default``).

    Raises
    ------
    ConfigurationError
        If the node-config value is not a number >= 0 (the message names the key).
    """
    raw = node_config.get(NODE_MIN_NOISE_KEY, default)
    if isinstance(raw, str):
        try:
            raw = float(raw)
        except ValueError:
            raise ConfigurationError(
                f"node config {NODE_MIN_NOISE_KEY} must be a number, got {raw!r}"
            ) from None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not raw >= 0:
        raise ConfigurationError(f"node config {NODE_MIN_NOISE_KEY} must be >= 0, got {raw!r}")
    return float(raw)


def check_noise_floor(noise_multiplier: float, floor: float, *, what: str) -> None:
    """Refuse a round whose effective noise multiplier is below the client's floor.

    Parameters
    ----------
    noise_multiplier : float
        The ``z`` the round's settings promise.
    floor : float
        The client's :func:`node_noise_floor`.
    what : str
        The family's name for the setting, used in the message.

    Raises
    ------
    ConfigurationError
        If ``noise_multiplier < floor``: the message names both and the node-config key.
    """
    if not noise_multiplier >= floor:
        raise ConfigurationError(
            f"{what} noise multiplier {noise_multiplier:g} is below this client's floor "
            f"{floor:g} (node config {NODE_MIN_NOISE_KEY}); refusing the round"
        )


def node_weight_keys(node_config: Mapping[str, object]) -> frozenset[str]:
    """Metric names this client lets the server use as its weight (``num-examples`` always).

    Raises
    ------
    ConfigurationError
        If :data:`NODE_WEIGHT_KEYS_KEY` is set and not a string.
    """
    raw = node_config.get(NODE_WEIGHT_KEYS_KEY, "")
    if not isinstance(raw, str):
        raise ConfigurationError(f"node config {NODE_WEIGHT_KEYS_KEY} must be a string")
    keys = {k.strip() for k in raw.split(",") if k.strip()}
    return frozenset(keys | {WEIGHT_KEY_ALWAYS_ALLOWED})


def check_weight_key(key: str, node_config: Mapping[str, object]) -> None:
    """Refuse a weight key the client's node config does not allow.

    Raises
    ------
    ConfigurationError
        If ``key`` is neither ``num-examples`` nor listed in :data:`NODE_WEIGHT_KEYS_KEY`.
    """
    allowed = node_weight_keys(node_config)
    if key not in allowed:
        raise ConfigurationError(
            f"the server asks for weight key {key!r}, which this client does not allow "
            f"(node config {NODE_WEIGHT_KEYS_KEY}: {sorted(allowed)}); refusing the round"
        )


def refuse_plaintext_evaluation(
    strategy: str, fraction_evaluate: float, plaintext_evaluation: bool
) -> None:
    """Refuse federated evaluation under a secure strategy unless the user opted in.

    Evaluate replies carry each client's metrics and ``num-examples`` in the clear, which is
    what the secure round hides (with known weights, count words decode as subset sums).

    Parameters
    ----------
    strategy : str
        The strategy's class name (for the message).
    fraction_evaluate : float
        Flower's knob.
    plaintext_evaluation : bool
        The explicit opt-in.

    Raises
    ------
    ConfigurationError
        If ``fraction_evaluate`` is not a fraction, ``plaintext_evaluation`` not a bool, or
        ``fraction_evaluate > 0`` without ``plaintext_evaluation=True``.
    """
    fraction_evaluate = check_fraction("fraction_evaluate", fraction_evaluate)
    check_bool("plaintext_evaluation", plaintext_evaluation)
    if fraction_evaluate > 0 and not plaintext_evaluation:
        raise ConfigurationError(
            f"{strategy}: fraction_evaluate={fraction_evaluate:g} would send every evaluated "
            "client's metrics and num-examples to the server in the clear, which the secure "
            "round hides; evaluate on the server instead (strategy.start(..., evaluate_fn=...)) "
            "and keep fraction_evaluate=0.0, or pass plaintext_evaluation=True to accept the leak"
        )
