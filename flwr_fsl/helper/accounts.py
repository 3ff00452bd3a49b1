"""S1's privacy accounts: one per run, on disk, so neither a new session nor a restart resets it.

S1's noise is what protects the clients against S0 (:mod:`flwr_fsl.families.ssa.dp`), so S1
keeps its own account of the rounds it released noised shares in, independent of S0's. The
account belongs to the **run**, not to the session: a DP round's parameters name the run
(:class:`~flwr_fsl.families.ssa.dp.RunScope`: S0 sends the Flower run id and the run's budget),
and every session that names that run — a re-opened session after S1 restarted or expired it, a
second connection, a session S0 closed and opened again under the same id to replay a round —
spends the same account. With a state directory (``flwr-fsl-helper --state-dir``; the in-process
S1 uses a temporary one) each account is a file ``dp-accounts/<sha256 of the run id>.json``
(:class:`~flwr_fsl.core.privacy.PrivacyAccount`'s versioned JSON, rewritten atomically after
every round), so a restarted S1 resumes it; without one the accounts live in memory.

**What S1 refuses.** Before it opens a DP round and again before it returns its noised share,
S1 checks that one more round at the round's noise multiplier stays within the run's budget as
S0 announced it **and** within S1's own ceiling (``--dp-budget-epsilon`` /
``--dp-budget-delta``, :attr:`~flwr_fsl.helper.limits.HelperLimits.dp_budget`); otherwise it
refuses with :class:`~flwr_fsl.helper.errors.HelperBudgetExhaustedError` (S0 then stops the
run). The account is spent when S1 returns its share (``FinishRound``): that is when S1's noise
is released; an aborted round spends nothing.

**Limits of the binding.** Clients check that a DP round names their own Flower run
(:meth:`~flwr_fsl.families.ssa.mod_base.ProtocolMod.check_privacy`), and their sealed material
is bound to the SHA-256 of the round's parameters, run included: S0 cannot move a client's
material into another run's account, and replaying it spends the run's account until S1
refuses. A DP round without a run (a Flower-free caller) is accounted under its session id.
A deviating S0 that also controls the SuperLink can start a new Flower run, which has a fresh
account at both servers: a budget is per run. S1's per-client accounts close that
(:mod:`flwr_fsl.helper.client_accounts`, ``--dp-client-budget-epsilon``): each enrolled client's
account spans every run, so a fresh run is no fresh budget for the same clients. An announced
budget is S0's word; S1's ceiling is the operator's.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from flwr_fsl.core.privacy import DEFAULT_DELTA, PrivacyAccount, PrivacyBudget
from flwr_fsl.families.ssa.protocol import SSAParams
from flwr_fsl.helper.errors import HelperBudgetExhaustedError

__all__ = ["ACCOUNTS_DIR", "NoiseLedger", "RunAccounts"]

ACCOUNTS_DIR = "dp-accounts"
"""Sub-directory of S1's state directory holding one account file per run."""


class NoiseLedger:
    """Noise multipliers spent per account key, in files under one directory or in memory.

    The storage both of S1's account kinds use (per run, :class:`RunAccounts`; per client key,
    :class:`~flwr_fsl.helper.client_accounts.ClientAccounts`). Not locked: callers hold their
    own lock around a check and its spend.

    Parameters
    ----------
    state_dir : Path, optional
        S1's state directory; None keeps the accounts in memory.
    subdir : str
        Sub-directory of ``state_dir`` holding one file per key (its SHA-256).
    """

    def __init__(self, state_dir: Path | None, subdir: str) -> None:
        self.state_dir = None if state_dir is None else Path(state_dir)
        self.subdir = subdir
        self._memory: dict[str, list[float]] = {}

    def path(self, key: str) -> Path | None:
        """Return the file of account ``key`` (None without a state directory)."""
        if self.state_dir is None:
            return None
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        return self.state_dir / self.subdir / f"{name}.json"

    def rounds(self, key: str) -> list[float]:
        """Return the noise multipliers account ``key`` has spent, in order."""
        path = self.path(key)
        if path is None:
            return list(self._memory.get(key, []))
        return PrivacyAccount(path=path).noise_multipliers if path.exists() else []

    def append(self, key: str, z: float) -> list[float]:
        """Spend one round at ``z`` on account ``key`` (persisted); return its rounds."""
        path = self.path(key)
        if path is None:
            self._memory.setdefault(key, []).append(z)
            return list(self._memory[key])
        account = PrivacyAccount(path=path)
        account.spend(z)
        return account.noise_multipliers

    def epsilon(self, key: str, delta: float = DEFAULT_DELTA) -> float:
        """``ε`` at ``delta`` that account ``key`` has spent (0 before any round)."""
        rounds = self.rounds(key)
        return PrivacyAccount(delta=delta, noise_multipliers=rounds).epsilon() if rounds else 0.0


class RunAccounts:
    """S1's privacy accounts, one per run (see the module docstring); thread-safe.

    Parameters
    ----------
    state_dir : Path, optional
        Directory for the account files (created on first use); None keeps them in memory.
    ceiling : PrivacyBudget, optional
        S1's own ceiling on every run (``--dp-budget-epsilon`` / ``--dp-budget-delta``).
    """

    def __init__(self, state_dir: Path | None = None, ceiling: PrivacyBudget | None = None) -> None:
        self.ledger = NoiseLedger(state_dir, ACCOUNTS_DIR)
        self.state_dir = self.ledger.state_dir
        self.ceiling = ceiling
        self._lock = threading.Lock()

    @staticmethod
    def key(params: SSAParams, session_id: bytes) -> str:
        """Return the account a round spends: its run id, else (no run named) its session."""
        if params.run is not None:
            return f"run:{params.run.run_id}"
        return f"session:{session_id.hex()}"

    def path(self, key: str) -> Path | None:
        """Return the file of account ``key`` (None without a state directory)."""
        return self.ledger.path(key)

    def rounds(self, key: str) -> list[float]:
        """Return the noise multipliers account ``key`` has spent, in order."""
        return self.ledger.rounds(key)

    def _budgets(self, params: SSAParams) -> list[tuple[PrivacyBudget, str]]:
        out = []
        if params.run is not None and params.run.budget is not None:
            out.append((params.run.budget, "the run's budget"))
        if self.ceiling is not None:
            out.append((self.ceiling, "S1's ceiling (flwr-fsl-helper --dp-budget-epsilon)"))
        return out

    def _refusal(self, params: SSAParams, key: str, z: float) -> str | None:
        rounds = self.rounds(key)
        for budget, what in self._budgets(params):
            reason = PrivacyAccount(budget, noise_multipliers=list(rounds)).refusal(z)
            if reason is not None:
                return f"round {params.round_id} refused by {what}: {reason}"
        return None

    def check(self, params: SSAParams, session_id: bytes, z: float) -> None:
        """Refuse a round that would take its run past a budget (nothing is spent).

        Raises
        ------
        HelperBudgetExhaustedError
            If one more round at ``z`` exceeds the run's announced budget or S1's ceiling.
        """
        with self._lock:
            reason = self._refusal(params, self.key(params, session_id), z)
        if reason is not None:
            raise HelperBudgetExhaustedError(reason)

    def spend(self, params: SSAParams, session_id: bytes, z: float) -> PrivacyAccount:
        """Spend one round at ``z`` on the round's run (persisted before returning).

        Returns
        -------
        PrivacyAccount
            The run's account after the round (for the log line), with the tightest budget.

        Raises
        ------
        HelperBudgetExhaustedError
            If the round would exceed a budget (nothing is spent).
        """
        key = self.key(params, session_id)
        with self._lock:
            reason = self._refusal(params, key, z)
            if reason is not None:
                raise HelperBudgetExhaustedError(reason)
            rounds = self.ledger.append(key, z)
        budgets = self._budgets(params)
        if not budgets:
            delta = params.dp.delta if params.dp is not None else DEFAULT_DELTA
            return PrivacyAccount(delta=delta, noise_multipliers=rounds)
        tight = min(budgets, key=lambda b: (b[0].epsilon, b[0].delta))[0]
        return PrivacyAccount(tight, noise_multipliers=rounds)

    def epsilon(self, key: str, delta: float = DEFAULT_DELTA) -> float:
        """``ε`` at ``delta`` that account ``key`` has spent (``inf`` after a ``z = 0`` round)."""
        return self.ledger.epsilon(key, delta)
