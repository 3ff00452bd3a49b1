"""One error taxonomy for the whole package: drop this client, fail this round, bad configuration.

Every exception ``flwr_fsl`` raises on purpose derives from :class:`FSLError` and from exactly
one of three kinds, which tell a server what to do with it:

* :class:`ClientInputError` — bytes or material that came from *one* client are malformed,
  oversized, stale or do not verify (every decoder's error derives from it: sparse codec, DPF
  keys, sealed boxes, SSA uploads, helper wire messages). The server drops that client from
  the round with the error text as the logged reason; the other clients' result is exact.
* :class:`RoundFailedError` — the round cannot produce a correct result (the second server is
  unreachable or answers inconsistently, too few clients remain). The round fails loudly and
  the global model stays unchanged; the run goes on.
* :class:`ConfigurationError` — a setting is invalid. Raised once, before round 1, naming the
  bad key.

One run-level outcome sits beside them: :class:`RunFailedError`, raised by a strategy's
``start`` after its last round when no round aggregated anything (every round failed or no
client ever answered), so a run that trained nothing ends failed instead of "completed".

Strategies and the helper server catch :class:`ClientInputError` (and the round kind at the
round boundary) and nothing broader, so a bug is never mistaken for a bad client. The concrete
classes keep :class:`ValueError` / :class:`ConnectionError` as second bases where they always
had them, so existing ``except ValueError`` code keeps working.
"""

from __future__ import annotations

__all__ = [
    "ClientInputError",
    "ConfigurationError",
    "FSLError",
    "RoundFailedError",
    "RunFailedError",
    "TooFewSurvivorsError",
]


class FSLError(Exception):
    """Base class of every error ``flwr_fsl`` raises on purpose."""


class ClientInputError(FSLError, ValueError):
    """One client's input is bad: drop that client from the round, keep the others exact."""


class RoundFailedError(FSLError, RuntimeError):
    """The round cannot complete correctly: fail it and leave the global model unchanged."""


class ConfigurationError(FSLError, ValueError):
    """A setting is invalid; raised before round 1 with the offending key in the message."""


class TooFewSurvivorsError(RoundFailedError):
    """Too few clients are left for the protocol's threshold: nothing can (or may) be decoded.

    One class for every threshold protocol (SecAgg's ``t``, SESA's ``K_max + T``); the message
    says which threshold and how many survived.
    """


class RunFailedError(FSLError, RuntimeError):
    """No round of the run aggregated anything: the run ends failed, not "completed".

    Raised by :meth:`flwr_fsl.core.engine.PhasedStrategy.start` after its last round (the
    final results are logged first). A ServerApp that lets it propagate ends non-zero.

    Parameters
    ----------
    message : str
        Why (the rounds and their failures).
    result : Any
        The :class:`~flwr.serverapp.strategy.Result` the run produced (the initial model and
        whatever metrics were collected), for callers that want to report it.
    """

    def __init__(self, message: str, result: object = None) -> None:
        super().__init__(message)
        self.result = result
