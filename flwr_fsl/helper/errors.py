"""Errors of the helper server S1 and of its S0-side connections.

One hierarchy for the whole :mod:`flwr_fsl.helper` package, so a strategy can catch
:class:`HelperError` and fail the round loudly:

* :class:`HelperUnavailableError` — S1 cannot be reached (connection refused, deadline passed,
  process gone). The round must fail and the global model stay unchanged.
* :class:`HelperRequestError` — S1 refused a whole call (malformed request, unknown or finished
  round, wrong state). A *single client's* bad material is never an exception: it is reported
  per client and the round goes on without that client.
* :class:`HelperSessionLostError` — a :class:`HelperRequestError` for a call naming a session S1
  does not hold (S1 restarted, the session expired or was closed): S1 kept nothing of the run.
  A call naming a live session without its secret gets the same answer (gRPC ``NOT_FOUND``), so
  a session id tells its holder nothing, not even whether the session is live.
  It is also a :class:`~flwr_fsl.families.ssa.two_server.SessionLostError`, which S0's
  :meth:`LeadServer.open <flwr_fsl.families.ssa.two_server.LeadServer.open>` recovers from.
* :class:`HelperAuthError` — a :class:`HelperRequestError` for a call S1 refused because it
  lacks the access token S1 requires (gRPC ``UNAUTHENTICATED``; ``PERMISSION_DENIED`` is mapped
  to it too). S1 changed nothing.
* :class:`HelperBudgetExhaustedError` — a :class:`HelperRequestError` for a round S1 refuses
  because it would take the run past a privacy budget (the run's, or S1's own ceiling,
  :mod:`flwr_fsl.helper.accounts`). It is also a
  :class:`~flwr_fsl.core.privacy.PrivacyBudgetExhaustedError`: S0 stops the run.
* :class:`HelperResourceError` — a :class:`HelperRequestError` for a call S1 refused because
  it would take a session or S1 past a resource limit (memory, sessions, calls;
  :mod:`flwr_fsl.helper.quota`; gRPC ``RESOURCE_EXHAUSTED``). S1 changed nothing; the same
  call may succeed once other rounds or sessions have ended.
* :class:`WireFormatError` — bytes that do not parse as the helper wire format
  (:mod:`flwr_fsl.helper.wire`); a decoder error, so a
  :class:`~flwr_fsl.core.errors.ClientInputError`.
  Raised to S1 for a bad request (and turned into a :class:`HelperRequestError` answer) and to
  S0 for a bad response (turned into a :class:`HelperError`: the round fails).

:class:`HelperError` is a :class:`~flwr_fsl.core.errors.RoundFailedError`
(:mod:`flwr_fsl.core.errors`).
"""

from __future__ import annotations

from flwr_fsl.core.errors import RoundFailedError
from flwr_fsl.core.privacy import PrivacyBudgetExhaustedError
from flwr_fsl.core.wireformat import WireFormatError
from flwr_fsl.families.ssa.two_server import SessionLostError

__all__ = [
    "HelperAuthError",
    "HelperBudgetExhaustedError",
    "HelperError",
    "HelperRequestError",
    "HelperResourceError",
    "HelperSessionLostError",
    "HelperUnavailableError",
    "WireFormatError",
]


class HelperError(RoundFailedError):
    """Base class of S0's helper (S1) errors, including S1 internal errors: fail the round."""


class HelperRequestError(HelperError, ValueError):
    """S1 refused a call: malformed or oversized request, unknown round, wrong state."""


class HelperUnavailableError(HelperError, ConnectionError):
    """S1 cannot be reached: connection refused, deadline exceeded or channel closed."""


class HelperSessionLostError(HelperRequestError, SessionLostError):
    """S1 does not hold the call's session (restarted, expired or closed): re-open it."""


class HelperAuthError(HelperRequestError):
    """S1 refused a call for a missing or wrong access token or session secret (nothing changed)."""


class HelperBudgetExhaustedError(HelperRequestError, PrivacyBudgetExhaustedError):
    """S1 refuses a round past the run's privacy budget or its own ceiling: stop the run."""


class HelperResourceError(HelperRequestError):
    """S1 refused a call that would exceed a resource limit (memory, sessions, calls)."""
