"""One set of argument checks for every strategy constructor and example run config.

Each function checks one value's type, range and finiteness and returns it normalized
(``float`` for a real, ``int`` for an integer); on a bad value it raises
:class:`~flwr_fsl.core.errors.ConfigurationError` whose message starts with the argument's
name, so the error a user sees before round 1 names what to change. ``bool`` is never taken
for a number (``True`` is an ``int`` in Python), and a string is never converted
(``fraction_train='0.5'`` is refused, not parsed).

:func:`check_sampling` is Flower ``FedAvg``'s sampling knobs at once (used by
:class:`~flwr_fsl.core.engine.PhasedStrategy` and by :class:`~flwr_fsl.experiment.Experiment`
for Flower's own strategies), and :func:`check_federation` refuses, before round 1, a
federation too small for the sampling or for a protocol's minimum (SecAgg's ``t``, SESA's
``K_max + T``). Flower-free: the layers below the engine (privacy, families' settings) use
it too.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection
from typing import Any

from flwr_fsl.core.errors import ConfigurationError

__all__ = [
    "check_bool",
    "check_callable",
    "check_choice",
    "check_federation",
    "check_fraction",
    "check_instance",
    "check_int",
    "check_optional_int",
    "check_real",
    "check_sampling",
    "check_str",
    "check_threshold",
    "sample_size",
]


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: object, low: int | None = None, high: int | None = None) -> int:
    """Return ``value`` as an ``int`` in ``[low, high]`` (either bound may be None).

    Raises
    ------
    ConfigurationError
        If ``value`` is not an integer (a bool, a float such as ``1.5`` or ``2.0``, a string)
        or is out of range; the message names ``name``.
    """
    if not _is_int(value):
        raise ConfigurationError(f"{name} must be an int, got {value!r}")
    out = int(value)  # type: ignore[call-overload]
    if (low is not None and out < low) or (high is not None and out > high):
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise ConfigurationError(f"{name} must be an int in [{lo}, {hi}], got {out}")
    return out


def check_optional_int(
    name: str, value: object, low: int | None = None, high: int | None = None
) -> int | None:
    """Return None, or ``value`` checked by :func:`check_int`."""
    return None if value is None else check_int(name, value, low, high)


def check_real(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``value`` as a finite ``float`` within its bounds.

    Parameters
    ----------
    name : str
        The argument or run-config key (named in the error).
    value : object
        The value to check: an int or a float (not a bool, not a string).
    low, high : float, optional
        Bounds (None: unbounded on that side).
    low_open, high_open : bool
        Exclude the bound itself.

    Returns
    -------
    float
        The value.

    Raises
    ------
    ConfigurationError
        If ``value`` is not a real number, is NaN or infinite, or is out of range.
    """
    if not _is_real(value):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    out = float(value)  # type: ignore[arg-type]
    if not math.isfinite(out):
        raise ConfigurationError(f"{name} must be finite, got {out!r}")
    too_low = low is not None and (out <= low if low_open else out < low)
    too_high = high is not None and (out >= high if high_open else out > high)
    if too_low or too_high:
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        span = f"{'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"
        raise ConfigurationError(f"{name} must be in {span}, got {out!r}")
    return out


def check_fraction(name: str, value: object) -> float:
    """Return a fraction in ``[0, 1]`` (Flower's ``fraction_train`` / ``fraction_evaluate``)."""
    return check_real(name, value, 0.0, 1.0)


def check_threshold(
    name: str, value: object, *, min_count: int, high_open: bool = False
) -> int | float:
    """Return a count-or-fraction threshold: an int ``>= min_count``, or a float fraction.

    A float is a fraction of each round's sampled clients, in ``(0, 1]`` (``(0, 1)`` with
    ``high_open``); an int is a count. SecAgg's ``reconstruction_threshold`` and SESA's
    ``privacy`` take this form.

    Raises
    ------
    ConfigurationError
        If ``value`` is neither, is NaN or out of range.
    """
    if _is_int(value):
        return check_int(name, value, min_count)
    if not _is_real(value):
        raise ConfigurationError(
            f"{name} must be an int >= {min_count} or a fraction, got {value!r}"
        )
    return check_real(name, value, 0.0, 1.0, low_open=True, high_open=high_open)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool (``0``, ``1`` and ``"true"`` are refused)."""
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be true or false (a bool), got {value!r}")
    return value


def check_str(name: str, value: object, *, empty: bool = False) -> str:
    """Return ``value`` if it is a string (non-empty unless ``empty``)."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{name} must be a string, got {value!r}")
    if not empty and not value:
        raise ConfigurationError(f"{name} must be a non-empty string")
    return value


def check_choice(name: str, value: object, choices: Collection[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``."""
    if isinstance(value, bool) or value not in choices:
        raise ConfigurationError(
            f"{name} must be one of {sorted(map(str, choices))}, got {value!r}"
        )
    return value


def check_callable(name: str, value: object, *, optional: bool = True) -> Any:
    """Return ``value`` if it is callable (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not callable(value):
        raise ConfigurationError(f"{name} must be a function{' or None' if optional else ''}")
    return value


def check_instance(
    name: str, value: object, kind: type | tuple[type, ...], *, optional: bool = True
) -> Any:
    """Return ``value`` if it is an instance of ``kind`` (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        names = " or ".join(k.__name__ for k in kinds) + (" or None" if optional else "")
        raise ConfigurationError(f"{name} must be {names}, got {type(value).__name__}")
    return value


def check_sampling(
    fraction_train: object,
    fraction_evaluate: object,
    min_train_nodes: object,
    min_evaluate_nodes: object,
    min_available_nodes: object,
) -> tuple[float, float, int, int, int]:
    """Check Flower ``FedAvg``'s five sampling knobs; return them normalized.

    Raises
    ------
    ConfigurationError
        If a fraction is not a number in ``[0, 1]`` or a minimum not an int ``>= 0``.
    """
    return (
        check_fraction("fraction_train", fraction_train),
        check_fraction("fraction_evaluate", fraction_evaluate),
        check_int("min_train_nodes", min_train_nodes, 0),
        check_int("min_evaluate_nodes", min_evaluate_nodes, 0),
        check_int("min_available_nodes", min_available_nodes, 0),
    )


def sample_size(num_nodes: int, fraction: float, min_nodes: int) -> int:
    """Return how many nodes Flower's ``FedAvg`` samples from ``num_nodes`` (0 if fraction 0)."""
    if fraction == 0.0:
        return 0
    return max(int(num_nodes * fraction), min_nodes)


def check_federation(
    strategy: Any,
    num_nodes: int,
    minimum: Callable[[int], tuple[int, str] | None] | None = None,
) -> None:
    """Refuse, before round 1, a federation of ``num_nodes`` that the strategy cannot use.

    Sampling as Flower's ``FedAvg`` does, a round waits for ``max(min_available_nodes,
    sample size)`` connected nodes; on a federation with fewer it would wait forever.

    Parameters
    ----------
    strategy : object
        Has Flower ``FedAvg``'s ``fraction_train``, ``fraction_evaluate``,
        ``min_train_nodes``, ``min_evaluate_nodes`` and ``min_available_nodes``.
    num_nodes : int
        Nodes in the federation.
    minimum : Callable[[int], tuple[int, str] | None], optional
        Given a round's sample size, the fewest clients the protocol needs in it and the
        setting that decides it (e.g. ``(3, "reconstruction_threshold")``), or None.

    Raises
    ------
    ConfigurationError
        If the sampling needs more nodes than there are, or a round's sample is smaller than
        the protocol's minimum; the message names the setting and the numbers.
    """
    fraction_train, fraction_evaluate, min_train, min_evaluate, min_available = check_sampling(
        strategy.fraction_train,
        strategy.fraction_evaluate,
        strategy.min_train_nodes,
        strategy.min_evaluate_nodes,
        strategy.min_available_nodes,
    )
    if num_nodes < min_available:
        raise ConfigurationError(
            f"min_available_nodes={min_available} but the federation has {num_nodes} nodes: "
            "the run would wait forever for the missing ones"
        )
    for purpose, fraction, low in (
        ("train", fraction_train, min_train),
        ("evaluate", fraction_evaluate, min_evaluate),
    ):
        size = sample_size(num_nodes, fraction, low)
        if size > num_nodes:
            raise ConfigurationError(
                f"min_{purpose}_nodes={low} (fraction_{purpose}={fraction:g}) asks for {size} "
                f"nodes per round but the federation has {num_nodes}: the run would wait forever"
            )
    size = sample_size(num_nodes, fraction_train, min_train)
    need = minimum(size) if (minimum is not None and size > 0) else None
    if need is not None and size < need[0]:
        count, setting = need
        raise ConfigurationError(
            f"{setting} needs at least {count} clients per round, but a round samples {size} "
            f"of {num_nodes} nodes (fraction_train={fraction_train:g}, "
            f"min_train_nodes={min_train}): raise the federation size or lower {setting}"
        )
