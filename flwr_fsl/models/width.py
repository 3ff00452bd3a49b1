"""Width-scalable models for heterogeneous clients (HeteroFL / FedRolex / SESA).

A model built at ``rate`` has every hidden layer ``ceil(rate * width)`` wide; the input and
the classifier's outputs keep their full size. Its ``state_dict()`` has exactly the keys of
the full model (``rate = 1``), with narrowed shapes, in forward order — so
:meth:`flwr_fsl.families.width.rules.WidthSpec.sequential` reads the layer structure off the full
model and a client's width slice loads into ``Net(rate)`` with ``load_state_dict``.

As in HeteroFL (``models/conv.py``, ``modules.Scaler``):

* **static batch norm**: ``BatchNorm(momentum=None, track_running_stats=False)`` — no
  running statistics are kept or aggregated; a layer normalizes with the statistics of the
  batch it sees (in evaluation too, unless :func:`calibrate_batch_norm` collected them);
* **the scaler**: hidden activations are divided by ``rate`` during training (identity in
  evaluation), so a narrow model's pre-activations have the full model's scale.

Models: :class:`WidthMLP` (784-200-10 by default, SESA's MLP; optional batch norm) and
:class:`WidthCNN` (two 3x3 conv blocks conv -> scaler -> static BN -> ReLU -> 2x2 max-pool,
then a linear classifier over the flattened 7x7 map, for 28x28 inputs). Both train and
evaluate with :func:`flwr_fsl.models.train_one` / :func:`flwr_fsl.models.evaluate`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional as F

from flwr_fsl.core.errors import ConfigurationError

__all__ = ["Scaler", "WidthCNN", "WidthMLP", "calibrate_batch_norm", "scaled_width"]


def scaled_width(width: int, rate: float) -> int:
    """``ceil(rate * width)``: a hidden layer's width in a model built at ``rate``.

    The same number as :func:`flwr_fsl.families.width.rules.local_width` with ``global_rate = 1``.

    Raises
    ------
    ConfigurationError
        If ``width < 1`` or ``rate`` is not in ``(0, 1]``.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigurationError(f"width must be an int >= 1, got {width!r}")
    _check_rate(rate)
    return min(width, max(1, int(np.ceil(width * float(rate)))))


def _check_rate(rate: float) -> float:
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 < rate <= 1.0:
        raise ConfigurationError(f"rate must be a number in (0, 1], got {rate!r}")
    if not math.isfinite(rate):
        raise ConfigurationError(f"rate must be finite, got {rate!r}")
    return float(rate)


class Scaler(nn.Module):
    """Divide by ``rate`` in training mode, identity in evaluation (HeteroFL's ``Scaler``).

    Parameters
    ----------
    rate : float
        The model's rate in ``(0, 1]``.
    """

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = _check_rate(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x / rate`` while training, ``x`` otherwise."""
        return x / self.rate if self.training and self.rate != 1.0 else x

    def extra_repr(self) -> str:
        """Show the rate."""
        return f"rate={self.rate}"


class _Block(nn.Module):
    """One hidden layer: linear or conv, scaler, optional static batch norm, ReLU (+ pool)."""

    def __init__(self, layer: nn.Module, norm: nn.Module | None, rate: float, pool: bool) -> None:
        super().__init__()
        self.layer = layer
        self.scaler = Scaler(rate)
        self.norm = norm if norm is not None else nn.Identity()
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.scaler(self.layer(x))))
        return F.max_pool2d(x, 2) if self.pool else x


def _check_sizes(name: str, values: tuple[int, ...]) -> tuple[int, ...]:
    out = tuple(values)
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in out):
        raise ConfigurationError(f"{name} must be a non-empty tuple of ints >= 1, got {values!r}")
    return out


class WidthMLP(nn.Module):
    """A multilayer perceptron whose hidden layers are scaled by ``rate``.

    State-dict keys: ``blocks.{i}.layer.weight/bias`` (``blocks.{i}.norm.weight/bias`` with
    ``norm=True``), then ``head.weight/bias``.

    Parameters
    ----------
    rate : float
        Width rate in ``(0, 1]``.
    hidden : tuple[int, ...]
        Full-width hidden sizes (default SESA's single layer of 200).
    in_features : int
        Input size (784 for flattened 28x28 images).
    num_classes : int
        Output size.
    norm : bool
        Add static ``BatchNorm1d`` after each hidden layer (HeteroFL style).
    track : bool
        Keep batch-norm running statistics (only for :func:`calibrate_batch_norm`'s copy;
        adds buffers, so the state-dict keys change).

    Raises
    ------
    ValueError
        If a size or the rate is invalid.
    """

    def __init__(
        self,
        rate: float = 1.0,
        hidden: tuple[int, ...] = (200,),
        in_features: int = 784,
        num_classes: int = 10,
        norm: bool = False,
        track: bool = False,
    ) -> None:
        super().__init__()
        self.rate = _check_rate(rate)
        self.full_hidden = _check_sizes("hidden", hidden)
        _check_sizes("in_features / num_classes", (in_features, num_classes))
        self.in_features = in_features
        self.widths = tuple(scaled_width(h, self.rate) for h in self.full_hidden)
        self.config = {"hidden": self.full_hidden, "in_features": in_features,
                       "num_classes": num_classes, "norm": norm}  # fmt: skip
        blocks = []
        prev = in_features
        for width in self.widths:
            bn = nn.BatchNorm1d(width, momentum=None, track_running_stats=track) if norm else None
            blocks.append(_Block(nn.Linear(prev, width), bn, self.rate, pool=False))
            prev = width
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(prev, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` of inputs reshaped to ``(N, in_features)``."""
        x = x.reshape(-1, self.in_features)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class WidthCNN(nn.Module):
    """A small CNN for 28x28 images whose conv channels are scaled by ``rate``.

    Two blocks ``conv3x3 -> scaler -> static BatchNorm2d -> ReLU -> max-pool 2`` (28 -> 14 ->
    7), then ``Linear(c2 * 7 * 7, num_classes)`` over the flattened map (each channel spans
    49 input features of the classifier). About 50k parameters at full width.

    State-dict keys: ``blocks.{i}.layer.weight/bias``, ``blocks.{i}.norm.weight/bias``,
    ``head.weight/bias``.

    Parameters
    ----------
    rate : float
        Width rate in ``(0, 1]``.
    channels : tuple[int, int]
        Full-width output channels of the two conv layers.
    num_classes : int
        Number of classes.
    in_channels : int
        Image channels.
    norm : bool
        Use static batch norm (HeteroFL's default); False: none.
    track : bool
        Keep batch-norm running statistics (see :class:`WidthMLP`).

    Raises
    ------
    ConfigurationError
        If a size or the rate is invalid.
    """

    def __init__(
        self,
        rate: float = 1.0,
        channels: tuple[int, int] = (32, 64),
        num_classes: int = 10,
        in_channels: int = 1,
        norm: bool = True,
        track: bool = False,
    ) -> None:
        super().__init__()
        self.rate = _check_rate(rate)
        full = _check_sizes("channels", channels)
        if len(full) != 2:
            raise ConfigurationError(f"channels must be two conv widths, got {channels!r}")
        _check_sizes("num_classes / in_channels", (num_classes, in_channels))
        self.full_channels = full
        self.in_channels = in_channels
        self.widths = tuple(scaled_width(c, self.rate) for c in full)
        self.config = {"channels": full, "num_classes": num_classes,
                       "in_channels": in_channels, "norm": norm}  # fmt: skip
        blocks = []
        prev = in_channels
        for width in self.widths:
            bn = nn.BatchNorm2d(width, momentum=None, track_running_stats=track) if norm else None
            conv = nn.Conv2d(prev, width, kernel_size=3, padding=1)
            blocks.append(_Block(conv, bn, self.rate, pool=True))
            prev = width
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(prev * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits of images ``(N, 28, 28)``, ``(N, C, 28, 28)`` or ``(N, C*784)``."""
        x = x.reshape(-1, self.in_channels, 28, 28)
        for block in self.blocks:
            x = block(x)
        return self.head(torch.flatten(x, 1))


@torch.no_grad()
def calibrate_batch_norm(
    model: WidthMLP | WidthCNN, x: NDArray, batch_size: int = 500
) -> WidthMLP | WidthCNN:
    """Return a copy of ``model`` whose batch norms use statistics of ``x`` in evaluation.

    HeteroFL's test-time step for static batch norm: one pass over (training) data in
    training mode into a model with tracked running statistics (``momentum=None``: the
    cumulative average over the batches), then evaluation mode. Scalers are identity in the
    pass (as when the server evaluates the global model), so the statistics match evaluation.
    A model without batch norm is returned as an evaluation-mode copy.

    Parameters
    ----------
    model : WidthMLP or WidthCNN
        The model (not modified).
    x : numpy.ndarray
        Inputs to collect statistics on (non-empty).
    batch_size : int
        Batch size of the pass (>= 1).

    Returns
    -------
    WidthMLP or WidthCNN
        A tracked-statistics copy in evaluation mode.

    Raises
    ------
    ConfigurationError
        If ``x`` is empty or ``batch_size < 1``.
    """
    if len(x) == 0 or batch_size < 1:
        raise ConfigurationError("need a non-empty x and batch_size >= 1")
    tracked = type(model)(rate=model.rate, track=True, **model.config)  # type: ignore[arg-type]
    tracked.load_state_dict(model.state_dict(), strict=False)
    tracked.train()
    for module in tracked.modules():
        if isinstance(module, Scaler):
            module.eval()  # identity during the pass
    data = torch.as_tensor(np.array(x, dtype=np.float32, copy=True))
    for start in range(0, len(data), batch_size):
        tracked(data[start : start + batch_size])
    tracked.eval()
    return tracked
