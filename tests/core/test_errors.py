"""The error taxonomy: one class per outcome, shared by every family."""

from __future__ import annotations

from flwr_fsl.core import errors
from flwr_fsl.crypto.hashing import CuckooInsertionError
from flwr_fsl.families.secagg import protocol as secagg
from flwr_fsl.families.sesa import protocol as sesa


def test_one_too_few_survivors_error_for_every_threshold_protocol() -> None:
    assert secagg.TooFewSurvivorsError is errors.TooFewSurvivorsError
    assert sesa.TooFewSurvivorsError is errors.TooFewSurvivorsError
    assert issubclass(errors.TooFewSurvivorsError, errors.RoundFailedError)


def test_outcomes_keep_their_builtin_bases() -> None:
    # Callers that catch ValueError / RuntimeError keep working.
    assert issubclass(errors.ClientInputError, ValueError)
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.RoundFailedError, RuntimeError)
    assert issubclass(CuckooInsertionError, errors.RoundFailedError)
    assert not issubclass(errors.ClientInputError, errors.RoundFailedError)
