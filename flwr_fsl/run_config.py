"""Typed app settings from a Flower run config (``[tool.flwr.app.config]`` keys with dashes).

:func:`settings_from_run_config` builds an app's settings dataclass; :func:`config_value`
reads one key. Both check the value's type (and :func:`config_value` its range and
finiteness) and raise :class:`~flwr_fsl.core.errors.ConfigurationError` naming the key, so an
app refuses a bad run config before round 1 instead of failing inside a client.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

from flwr_fsl.core.checks import check_choice, check_real
from flwr_fsl.core.errors import ConfigurationError

__all__ = ["config_value", "settings_from_run_config"]

T = TypeVar("T")


def settings_from_run_config(cls: type[T], run_config: Mapping[str, Any]) -> T:
    """Build the dataclass ``cls`` from a run config; field ``a_b`` reads key ``a-b``.

    Each field's type is that of its default value; keys the dataclass does not know are
    ignored and missing keys keep the default.

    Parameters
    ----------
    cls : type
        A dataclass whose fields all have defaults of type bool, int, float or str.
    run_config : Mapping[str, Any]
        ``context.run_config``.

    Returns
    -------
    T
        The settings (the dataclass's own ``__post_init__`` checks ranges).

    Raises
    ------
    ConfigurationError
        If a value has the wrong type (e.g. a float for an int, a string for a bool, NaN or
        infinity for a float); the message names the key. (A ``ValueError``, for callers
        that catch that.)
    """
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = field.name.replace("_", "-")
        if key in run_config:
            values[field.name] = _typed(key, run_config[key], field.default)
    try:
        return cls(**values)
    except ConfigurationError as err:
        raise ConfigurationError(f"invalid run config: {err}") from err


def _typed(key: str, raw: Any, default: Any) -> Any:
    """Return ``raw`` as the type of ``default`` (bool, int, float or str), or raise by key."""
    kind = type(default)
    if kind is bool and not isinstance(raw, bool):
        raise ConfigurationError(f"invalid run config: {key} must be true or false, got {raw!r}")
    if kind is int and (
        isinstance(raw, bool | str) or (isinstance(raw, float) and not raw.is_integer())
    ):
        raise ConfigurationError(f"invalid run config: {key} must be an integer, got {raw!r}")
    if kind is float and (isinstance(raw, bool | str) or not isinstance(raw, int | float)):
        raise ConfigurationError(f"invalid run config: {key} must be a float, got {raw!r}")
    if kind is float and not math.isfinite(raw):
        raise ConfigurationError(f"invalid run config: {key} must be finite, got {raw!r}")
    if kind is str and not isinstance(raw, str):
        raise ConfigurationError(f"invalid run config: {key} must be a string, got {raw!r}")
    try:
        return kind(raw)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"invalid run config: {key} must be a {kind.__name__}, got {raw!r}"
        ) from None


def config_value(
    run_config: Mapping[str, Any],
    key: str,
    default: T,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    choices: Collection[Any] | None = None,
) -> T:
    """Return ``run_config[key]`` (``default`` if absent) as ``default``'s type, checked.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        ``context.run_config``.
    key : str
        The dashed key (named in every error).
    default : bool, int, float or str
        The value when the key is absent; its type is the key's type.
    low, high : float, optional
        Bounds of a number (inclusive; ``low_open`` excludes ``low``).
    choices : Collection, optional
        The allowed values of a string.

    Returns
    -------
    T
        The value.

    Raises
    ------
    ConfigurationError
        If the value has the wrong type, is not finite, or is out of range or not a choice.
    """
    value = _typed(key, run_config[key], default) if key in run_config else default
    try:
        if low is not None or high is not None:
            check_real(key, value, low, high, low_open=low_open)
        if choices is not None:
            check_choice(key, value, choices)
    except ConfigurationError as err:
        raise ConfigurationError(f"invalid run config: {err}") from err
    return value
