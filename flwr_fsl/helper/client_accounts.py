"""S1's per-client privacy accounts: one per enrolled signing key, across runs, on disk.

:mod:`flwr_fsl.helper.accounts` keeps one account per **run**, so a deviating S0 that starts a
fresh Flower run gets a fresh budget for the same clients. This module closes that with an
account per **client**: every DP round S1 returns a noised share of spends one round at the
round's noise multiplier on the account of each client in it, keyed by the client's enrolled
Ed25519 public key (:mod:`flwr_fsl.crypto.identity`; S0 cannot invent or swap keys, so it
cannot reset a client's account by renaming it). With S1's per-client ceiling
(``flwr-fsl-helper --dp-client-budget-epsilon E``, :attr:`HelperLimits.dp_client_budget
<flwr_fsl.helper.limits.HelperLimits.dp_client_budget>`), S1 refuses — per client, with a
reason, never failing the round — a client whose own account would exceed it, whatever run or
session S0 names; the other clients stay exact.

With a state directory each account is a file ``client-accounts/<sha256 of the key>.json``
(:class:`~flwr_fsl.core.privacy.PrivacyAccount`'s versioned JSON, rewritten atomically after
every round), so a restarted S1 resumes it; without one the accounts live in memory.

**Accounting.** A client's account composes the rounds it took part in (RDP of the Gaussian
mechanism at each round's ``z``, no amplification by sampling): the guarantee S1's noise gives
that client against S0 over all runs on this helper. Under open enrollment the accounts are
kept too, but S0 can then make keys at will: they bind nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from flwr_fsl.core.privacy import PrivacyAccount, PrivacyBudget
from flwr_fsl.helper.accounts import NoiseLedger

__all__ = ["CLIENT_ACCOUNTS_DIR", "ClientAccounts"]

CLIENT_ACCOUNTS_DIR = "client-accounts"
"""Sub-directory of S1's state directory holding one account file per client key."""


class ClientAccounts:
    """S1's privacy accounts, one per client signing key (see the module docstring).

    Parameters
    ----------
    state_dir : Path, optional
        Directory for the account files (created on first use); None keeps them in memory.
    ceiling : PrivacyBudget, optional
        S1's ceiling on every client's account (``--dp-client-budget-epsilon``); None only
        keeps the accounts.
    """

    def __init__(self, state_dir: Path | None = None, ceiling: PrivacyBudget | None = None) -> None:
        self.ledger = NoiseLedger(state_dir, CLIENT_ACCOUNTS_DIR)
        self.state_dir = self.ledger.state_dir
        self.ceiling = ceiling
        self._lock = threading.Lock()

    @staticmethod
    def key(signer: bytes) -> str:
        """Return the account key of a client signing key."""
        return f"client:{bytes(signer).hex()}"

    def path(self, signer: bytes) -> Path | None:
        """Return the file of ``signer``'s account (None without a state directory)."""
        return self.ledger.path(self.key(signer))

    def rounds(self, signer: bytes) -> list[float]:
        """Return the noise multipliers ``signer``'s account has spent, in order."""
        return self.ledger.rounds(self.key(signer))

    def refusal(self, signer: bytes, z: float) -> str | None:
        """Return why one more round at ``z`` would take ``signer`` past S1's ceiling, or None."""
        if self.ceiling is None:
            return None
        with self._lock:
            rounds = self.rounds(signer)
        reason = PrivacyAccount(self.ceiling, noise_multipliers=rounds).refusal(z)
        if reason is None:
            return None
        return (
            f"client key {bytes(signer).hex()[:16]}... refused by S1's per-client ceiling "
            f"(flwr-fsl-helper --dp-client-budget-epsilon): {reason}"
        )

    def spend(self, signers: Iterable[bytes], z: float) -> None:
        """Spend one round at ``z`` on each signer's account (persisted before returning)."""
        with self._lock:
            for signer in signers:
                self.ledger.append(self.key(signer), z)

    def epsilon(self, signer: bytes, delta: float) -> float:
        """``ε`` at ``delta`` that ``signer``'s account has spent (0 before any round)."""
        return self.ledger.epsilon(self.key(signer), delta)
