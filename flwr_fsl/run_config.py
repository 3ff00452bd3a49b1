"""Typed app settings from a Flower run config (``[tool.flwr.app.config]`` keys with dashes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

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
    ValueError
        If a value has the wrong type (e.g. a float for an int, a string for a bool).
    """
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = field.name.replace("_", "-")
        if key not in run_config:
            continue
        default: Any = field.default
        raw, kind = run_config[key], type(default)
        if kind is bool and not isinstance(raw, bool):
            raise ValueError(f"invalid run config: {key} must be true or false, got {raw!r}")
        if kind is int and (isinstance(raw, bool) or (isinstance(raw, float) and raw % 1)):
            raise ValueError(f"invalid run config: {key} must be an integer, got {raw!r}")
        try:
            values[field.name] = kind(raw)
        except (TypeError, ValueError):
            raise ValueError(
                f"invalid run config: {key} must be a {kind.__name__}, got {raw!r}"
            ) from None
    return cls(**values)
