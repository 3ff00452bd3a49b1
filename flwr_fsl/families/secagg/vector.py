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

**Unit weights.** With ``weighted=False`` (what ``SecAggFedAvg`` uses by default) every client's
weight ``c`` is 1: the weight word of the sum is the number of survivors, which the server knows
anyway, and the result is the plain mean of the survivors' updates. The fixed point is then
sized with a weight bound of 1.

**Distributed DP.** With ``dp`` (:class:`~flwr_fsl.families.secagg.dp.SecAggDP`) a client also
clips its update to L2 norm ``dp.clip_norm``, clips (instead of refusing) its weight and metrics
to their bounds, and :meth:`WeightedVector.add_noise` adds discrete Gaussian noise to every word
before masking (:mod:`flwr_fsl.families.secagg.dp`). :meth:`WeightedVector.decode` then divides
by the survivor count when the weights are units (exact, and known to the server) and by the
noisy weight word otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.families.secagg.dp import (
    NOISE_CLIP_STDS,
    SecAggDP,
    add_noise,
    check_headroom,
    client_sigma,
    sensitivity,
)
from flwr_fsl.submodel.aggregate import apply_count_weighted
from flwr_fsl.submodel.layout import FlatLayout

__all__ = ["WeightedVector", "unattributed"]


def unattributed(survivors: Sequence[int]) -> str:
    """Return the tail of a failure reason for a sum outside its bounds (any survivor)."""
    return (
        f"one of the survivors {sorted(survivors)} sent a masked input not made for this round "
        "(replayed or corrupted); the sum cannot tell which, so nothing is applied"
    )


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
    weighted : bool
        Whether clients weight by a metric (``max_weight`` bounds it) or each counts 1.
    dp : SecAggDP, optional
        Distributed DP settings (module docstring).

    Raises
    ------
    ConfigurationError
        If a setting is out of range or the sum of ``max_clients`` vectors (with their noise)
        could overflow.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    metrics: tuple[str, ...]
    clip: float
    max_weight: float
    max_metric: float
    frac_bits: int
    max_clients: int
    weighted: bool = True
    dp: SecAggDP | None = None

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
        if not isinstance(self.weighted, bool):
            raise ConfigurationError("weighted must be a bool")
        if self.dp is not None and not isinstance(self.dp, SecAggDP):
            raise ConfigurationError("dp must be a SecAggDP or None")
        codec = self.codec  # raises when the sum could overflow
        if self.dp is not None:
            check_headroom(
                math.ceil(codec.max_abs * codec.scale), self.noise_sigma(2), self.max_clients
            )

    @property
    def weight_bound(self) -> float:
        """``W``: the largest weight a client uses (``max_weight``, or 1 for unit weights)."""
        return self.max_weight if self.weighted else 1.0

    @property
    def codec(self) -> FixedPoint:
        """The fixed point every entry uses."""
        w = self.weight_bound
        largest = max(w * max(self.clip, self.max_metric), w)
        return FixedPoint(self.frac_bits, largest, self.max_clients)

    @property
    def sensitivity(self) -> float:
        """``Δ`` of one client's encoded vector in integer units (needs :attr:`dp`).

        Raises
        ------
        ConfigurationError
            If the layout has no ``dp``.
        """
        if self.dp is None:
            raise ConfigurationError("the SecAgg layout has no dp settings")
        return sensitivity(
            self.dp, self.weight_bound, len(self.metrics), self.max_metric, self.frac_bits,
            self.length,
        )  # fmt: skip

    def noise_sigma(self, threshold: int) -> float:
        """Each client's noise std ``z Δ / sqrt(t)`` in integer units (0 without :attr:`dp`)."""
        if self.dp is None:
            return 0.0
        return client_sigma(self.dp, self.sensitivity, threshold)

    def add_noise(
        self, words: NDArray[np.uint64], threshold: int, stream: PRGStream | None = None
    ) -> NDArray[np.uint64]:
        """Return an encoded vector plus this client's share of the DP noise (every word).

        Parameters
        ----------
        words : numpy.ndarray
            The output of :meth:`encode`.
        threshold : int
            The round's ``t`` (SecAgg refuses to decode fewer survivors).
        stream : PRGStream, optional
            The randomness (tests pass a keyed one); fresh ``os.urandom`` by default.

        Returns
        -------
        numpy.ndarray
            ``words`` unchanged without :attr:`dp`; noised words otherwise.
        """
        if self.dp is None:
            return words
        return add_noise(words, self.noise_sigma(threshold), stream)

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

        With :attr:`dp` the update is also clipped to L2 norm ``dp.clip_norm`` and the weight
        and metrics are clipped to their bounds instead of refused; without :attr:`weighted`
        the weight must be 1.

        Raises
        ------
        ClientInputError
            If the trained arrays do not match the layout, or the weight or a metric is not
            finite or out of range (the texts name the key, never a value).
        """
        weight = self._weight(weight)
        parts, clipped = self._update(model, trained, weight)
        parts.append(np.array([weight]))
        parts.append(self._tail(metrics, weight))
        flat = np.concatenate(parts)
        return self.codec.encode(flat, rng), clipped

    def _weight(self, weight: float) -> float:
        """Return the weight as encoded: checked, and clipped to its bound under :attr:`dp`."""
        if not (math.isfinite(weight) and weight > 0):
            raise ClientInputError("the weight must be finite and > 0")
        if not self.weighted and weight != 1.0:
            raise ClientInputError("an unweighted SecAgg vector takes the weight 1")
        if weight > self.weight_bound:
            if self.dp is None:
                raise ClientInputError(
                    f"the weight exceeds max_weight = {self.max_weight:g} (the client is dropped "
                    "from the round; raise SecAggFedAvg(max_weight=...))"
                )
            weight = self.weight_bound
        return weight

    def _update(
        self,
        model: Mapping[str, NDArray[np.generic]],
        trained: Mapping[str, NDArray[np.generic]],
        weight: float,
    ) -> tuple[list[NDArray[np.float64]], int]:
        """``weight · clip(w_i - w)`` per array (L2-clipped too under :attr:`dp`), clip count."""
        parts = []
        clipped = 0
        for name, shape in zip(self.names, self.shapes, strict=True):
            if name not in trained or name not in model:
                raise ClientInputError(f"the reply lacks the array {name!r}")
            new = np.asarray(trained[name])
            if new.shape != shape or np.asarray(model[name]).shape != shape:
                raise ClientInputError(f"array {name!r} does not have the model's shape")
            # One float64 pass each (the same values as casting both first): L = 1M, issue 26.
            delta = np.subtract(new, np.asarray(model[name]), dtype=np.float64).reshape(-1)
            if not np.all(np.isfinite(delta)):
                raise ClientInputError(f"array {name!r} is not finite")
            clipped += int(np.count_nonzero(delta > self.clip))
            clipped += int(np.count_nonzero(delta < -self.clip))
            np.clip(delta, -self.clip, self.clip, out=delta)
            if weight != 1.0:
                delta *= weight
            parts.append(delta)
        if set(trained) - set(self.names):
            raise ClientInputError("the reply has arrays the model does not have")
        if self.dp is not None:
            norm = math.sqrt(sum(float(np.dot(p, p)) for p in parts)) / weight
            if norm > self.dp.clip_norm:
                parts = [p * (self.dp.clip_norm / norm) for p in parts]
        return parts, clipped

    def _tail(self, metrics: Mapping[str, float], weight: float) -> NDArray[np.float64]:
        """``(weight · m_j, weight · has_j)`` per metric (clipped to ``max_metric`` under dp)."""
        tail = []
        for key in self.metrics:
            value = metrics.get(key)
            if value is None:
                tail += [0.0, 0.0]
                continue
            if not math.isfinite(value):
                raise ClientInputError(f"metric {key!r} must be finite with |x| <= max_metric")
            if abs(value) > self.max_metric:
                if self.dp is None:
                    raise ClientInputError(
                        f"metric {key!r} exceeds max_metric = {self.max_metric:g} in absolute "
                        "value (the client is dropped from the round; raise "
                        "SecAggFedAvg(max_metric=...))"
                    )
                value = math.copysign(self.max_metric, value)
            tail += [weight * value, weight]
        return np.asarray(tail, dtype=np.float64)

    def slack(self, count: int, threshold: int = 2) -> float:
        """Largest error of one decoded word of a sum of ``count`` honest vectors (real units).

        Each client's stochastic rounding moves a word by less than one fixed-point unit and,
        with :attr:`dp`, its noise by at most ``ceil(64 σ_c)`` units (the noise is clipped
        there, :func:`~flwr_fsl.families.secagg.dp.add_noise`).
        """
        units = 1.0
        if self.dp is not None:
            units += math.ceil(NOISE_CLIP_STDS * self.noise_sigma(max(int(threshold), 1)))
        return count * units / self.codec.scale

    def check_bounds(self, values: NDArray[np.float64], count: int, threshold: int = 2) -> None:
        """Refuse a decoded sum that ``count`` vectors built as told cannot have.

        An honest client's weight ``c`` is in ``(0, W]`` (``W`` = :attr:`weight_bound`; exactly
        1 with unit weights), each update word in ``[-clip c, clip c]`` and each metric pair
        ``(c m, c has)`` with ``|m| <= max_metric``, ``has`` in ``{0, 1}``. So the sum has a
        total weight ``C`` in ``(0, count W]`` (``count`` with unit weights), every update word
        within ``clip · C``, every metric word within ``max_metric`` times its ``has`` word,
        itself in ``[0, C]`` — each up to :meth:`slack`. A masked input not made for this
        round (a replay from another round, a corrupted vector) unmasks to words uniform in
        ``Z_2^64`` and lands outside these bounds except with a chance of about
        ``(bound / 2^64)`` per word. A client that deviates *within* the bounds is not caught.

        Raises
        ------
        RoundFailedError
            Naming the first bound the sum breaks.
        """
        if count < 1:
            raise RoundFailedError("no vector in the sum")
        eps = self.slack(count, threshold)
        n = self.model_length
        weight = float(values[n])
        if self.weighted:
            top = count * self.weight_bound
            if not -eps <= weight <= top + eps:
                raise RoundFailedError(
                    f"the aggregate is outside its bounds: total weight {weight:.6g} is not in "
                    f"[0, {count} survivors x max_weight {self.weight_bound:g}]"
                )
        elif not abs(weight - count) <= eps:
            raise RoundFailedError(
                f"the aggregate is outside its bounds: total weight {weight:.6g} is not the "
                f"{count} survivors' unit weights"
            )
        reach = max(weight, 0.0) + eps
        update = np.abs(values[:n])
        if n and not float(np.max(update)) <= self.clip * reach + eps:
            raise RoundFailedError(
                f"the aggregate is outside its bounds: an update word {float(np.max(update)):.6g}"
                f" exceeds clipping_range {self.clip:g} x total weight {weight:.6g}"
            )
        tail = values[n + 1 :].reshape(-1, 2)
        has = tail[:, 1]
        if tail.size and not (
            np.all(has >= -eps)
            and np.all(has <= reach)
            and np.all(np.abs(tail[:, 0]) <= self.max_metric * (np.maximum(has, 0.0) + eps) + eps)
        ):
            raise RoundFailedError(
                "the aggregate is outside its bounds: a train metric's words exceed max_metric x "
                "their weight"
            )

    def decode(
        self,
        total: NDArray[np.uint64],
        model: Mapping[str, NDArray[np.generic]],
        count: int | None = None,
        threshold: int = 2,
    ) -> tuple[dict[str, NDArray[np.generic]], dict[str, float], float]:
        """Turn the sum of the survivors' vectors into the new model, metrics and total weight.

        Parameters
        ----------
        total : numpy.ndarray
            The unmasked sum.
        model : Mapping[str, numpy.ndarray]
            The model the round started from.
        count : int, optional
            How many vectors the sum holds (the survivors, known to the server). With unit
            weights it is the divisor (equal to the weight word without :attr:`dp`, and
            noise-free with it); otherwise the decoded weight word is. Given, the sum is
            checked against its bounds first (:meth:`check_bounds`).
        threshold : int
            The round's ``t`` (sizes the noise allowance with :attr:`dp`; 2, the largest
            noise, when unknown).

        Returns
        -------
        tuple
            The new model, the metrics' means and the decoded weight word.

        Raises
        ------
        RoundFailedError
            If the sum is outside its bounds, the total weight is not positive or the result
            is not finite (the round fails and the model stays as it was).
        """
        values = self.codec.decode(total)
        if count is not None:
            self.check_bounds(values, count, threshold)
        total_weight = float(values[self.model_length])
        divisor = float(count) if (count is not None and not self.weighted) else total_weight
        if not (math.isfinite(divisor) and divisor > 0):
            raise RoundFailedError("the aggregated weight is not positive")
        # Every coordinate was updated by every survivor: C = sum c everywhere.
        offsets = tuple(int(x) for x in np.cumsum([0, *[math.prod(s) for s in self.shapes]]))
        new = apply_count_weighted(
            {name: np.asarray(model[name]) for name in self.names},
            FlatLayout(self.names, self.shapes, offsets),
            values[: self.model_length].reshape(-1, 1),
            np.full(self.model_length, divisor),
            finite=True,
        )
        metrics: dict[str, float] = {}
        tail = values[self.model_length + 1 :]
        for j, key in enumerate(self.metrics):
            reported = float(tail[2 * j + 1])
            if reported > 0:
                metrics[key] = float(tail[2 * j]) / reported
        return new, metrics, total_weight
