"""What a SecAgg client masks: its weighted update, its weight and weighted metrics, in Z_2^64.

FedAvg's result is ``w + sum_i c_i (w_i - w) / sum_i c_i``: every term a client contributes is a
sum over clients, so the whole of it can go through secure aggregation and no weight ``c_i``
(``num-examples``) ever travels in the clear. One client's vector is, in fixed point
(:class:`~flwr_fsl.crypto.fixedpoint.FixedPoint`, stochastic rounding, overflow bound
checked)::

    [ c * clip(w_i - w)  for every array, flattened in ``names`` order ]
    [ c ]
    [ c * metric_j, c * has_j ]  for every metric name j

so the server decodes ``sum c (w_i - w)``, ``sum c`` and, per metric, ``sum c m_j / sum c has_j``
(the weighted mean over the clients that reported it), and applies ``w + S / C`` with the one
count-weighted apply (:func:`~flwr_fsl.submodel.aggregate.apply_count_weighted`, ``C = sum c``
for every coordinate; integer arrays rounded to nearest): exactly what Flower's ``FedAvg``
computes from the same replies, up to ``clients * 2**-frac_bits`` per coordinate before the
division. ``clip`` bounds ``|w_i - w|`` per coordinate (Flower's SecAgg+ ``clipping_range``);
an update inside it is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.submodel.aggregate import apply_count_weighted
from flwr_fsl.submodel.layout import FlatLayout

__all__ = ["WeightedVector"]


@dataclass(frozen=True)
class WeightedVector:
    """The layout and fixed point of one round's SecAgg vectors (both ends build the same).

    Parameters
    ----------
    names : tuple of str
        The model's arrays, in vector order.
    shapes : tuple of tuple of int
        Their shapes.
    metrics : tuple of str
        Train metrics averaged inside the vector (weighted by the client's weight).
    clip : float
        Largest ``|w_i - w|`` per coordinate.
    max_weight : float
        Largest client weight.
    max_metric : float
        Largest ``|metric|``.
    frac_bits : int
        Fixed-point fractional bits.
    max_clients : int
        Most clients summed (sizes the overflow bound).

    Raises
    ------
    ConfigurationError
        If a setting is out of range or the sum of ``max_clients`` vectors could overflow.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    metrics: tuple[str, ...]
    clip: float
    max_weight: float
    max_metric: float
    frac_bits: int
    max_clients: int

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shapes) or len(set(self.names)) != len(self.names):
            raise ConfigurationError("SecAgg layout: one distinct name per array shape")
        if len(set(self.metrics)) != len(self.metrics):
            raise ConfigurationError("SecAgg layout: metric names repeat")
        for name, value in (
            ("clipping_range", self.clip),
            ("max_weight", self.max_weight),
            ("max_metric", self.max_metric),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{name} must be finite and > 0, got {value!r}")
        largest = max(self.max_weight * max(self.clip, self.max_metric), self.max_weight)
        FixedPoint(self.frac_bits, largest, self.max_clients)  # raises when it could overflow

    @property
    def codec(self) -> FixedPoint:
        """The fixed point every entry uses."""
        largest = max(self.max_weight * max(self.clip, self.max_metric), self.max_weight)
        return FixedPoint(self.frac_bits, largest, self.max_clients)

    @property
    def model_length(self) -> int:
        """Coordinates of the model."""
        return sum(math.prod(s) for s in self.shapes)

    @property
    def length(self) -> int:
        """Ring words of one vector."""
        return self.model_length + 1 + 2 * len(self.metrics)

    def encode(
        self,
        model: Mapping[str, NDArray[np.generic]],
        trained: Mapping[str, NDArray[np.generic]],
        weight: float,
        metrics: Mapping[str, float],
        rng: np.random.Generator | None = None,
    ) -> tuple[NDArray[np.uint64], int]:
        """Return a client's vector and how many coordinates were clipped.

        Raises
        ------
        ClientInputError
            If the trained arrays do not match the layout, or the weight or a metric is not
            finite or out of range (the texts name the key, never a value).
        """
        if not (math.isfinite(weight) and 0 < weight <= self.max_weight):
            raise ClientInputError("the weight must be finite, > 0 and at most max_weight")
        parts = []
        clipped = 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            if name not in trained or name not in model:
                raise ClientInputError(f"the reply lacks the array {name!r}")
            new = np.asarray(trained[name])
            if new.shape != shape or np.asarray(model[name]).shape != shape:
                raise ClientInputError(f"array {name!r} does not have the model's shape")
            delta = new.astype(np.float64).reshape(-1) - np.asarray(model[name]).astype(
                np.float64
            ).reshape(-1)
            if not np.all(np.isfinite(delta)):
                raise ClientInputError(f"array {name!r} is not finite")
            clipped += int(np.count_nonzero(np.abs(delta) > self.clip))
            parts.append(np.clip(delta, -self.clip, self.clip) * weight)
        if set(trained) - set(self.names):
            raise ClientInputError("the reply has arrays the model does not have")
        parts.append(np.array([weight]))
        tail = []
        for key in self.metrics:
            value = metrics.get(key)
            if value is None:
                tail += [0.0, 0.0]
                continue
            if not (math.isfinite(value) and abs(value) <= self.max_metric):
                raise ClientInputError(f"metric {key!r} must be finite with |x| <= max_metric")
            tail += [weight * value, weight]
        parts.append(np.asarray(tail, dtype=np.float64))
        flat = np.concatenate(parts)
        return self.codec.encode(flat, rng), clipped

    def decode(
        self, total: NDArray[np.uint64], model: Mapping[str, NDArray[np.generic]]
    ) -> tuple[dict[str, NDArray[np.generic]], dict[str, float], float]:
        """Turn the sum of the survivors' vectors into the new model, metrics and total weight.

        Raises
        ------
        RoundFailedError
            If the total weight is not positive or the result is not finite (the round fails
            and the model stays as it was).
        """
        values = self.codec.decode(total)
        total_weight = float(values[self.model_length])
        if not (math.isfinite(total_weight) and total_weight > 0):
            raise RoundFailedError("the aggregated weight is not positive")
        # Every coordinate was updated by every survivor: C = sum c everywhere.
        offsets = tuple(int(x) for x in np.cumsum([0, *[math.prod(s) for s in self.shapes]]))
        new = apply_count_weighted(
            {name: np.asarray(model[name]) for name in self.names},
            FlatLayout(self.names, self.shapes, offsets),
            values[: self.model_length].reshape(-1, 1),
            np.full(self.model_length, total_weight),
            finite=True,
        )
        metrics: dict[str, float] = {}
        tail = values[self.model_length + 1 :]
        for j, key in enumerate(self.metrics):
            reported = float(tail[2 * j + 1])
            if reported > 0:
                metrics[key] = float(tail[2 * j]) / reported
        return new, metrics, total_weight
