"""Public architectures of PrivHFL's secure models: the layer types and their walk.

An :class:`Architecture` is the *public* skeleton of an answerer's model (the per-query input
shape and a tuple of layers: :class:`Linear`, :class:`Conv2d`, :class:`ReLU`,
:class:`MaxPool2d`, :class:`AvgPool2d`, :class:`GlobalAvgPool`, :class:`Flatten`,
:class:`Residual`); every party of secure querying knows it. Shapes are inferred and checked
once when it is built (:class:`~flwr_fsl.core.errors.ConfigurationError` naming the layer
otherwise). :func:`walk` calls a :class:`Visitor` for every step in protocol order (the secure
evaluators, the plaintext twin and the error bound all follow it). The weights, the plaintext
twin and :func:`~flwr_fsl.families.privhfl.inference.from_torch` are in
:mod:`flwr_fsl.families.privhfl.inference`, which re-exports everything here.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import numpy as np

from flwr_fsl.core.errors import ConfigurationError

__all__ = [
    "Architecture",
    "AvgPool2d",
    "Conv2d",
    "Flatten",
    "GlobalAvgPool",
    "Layer",
    "Linear",
    "MaxPool2d",
    "ReLU",
    "Residual",
    "Shape",
    "Visitor",
    "walk",
]


def _pos_int(value: object, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < low:
        raise ConfigurationError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


# ------------------------------------------------------------------------------------- layers


@dataclass(frozen=True)
class Linear:
    """Fully connected layer ``y = x W^T + b`` on a flat input (after :class:`Flatten`)."""

    in_features: int
    out_features: int
    bias: bool = True

    def __post_init__(self) -> None:
        _pos_int(self.in_features, "Linear in_features")
        _pos_int(self.out_features, "Linear out_features")


@dataclass(frozen=True)
class Conv2d:
    """2-D convolution (square kernel, one stride and zero padding for both axes, groups 1)."""

    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int = 1
    padding: int = 0
    bias: bool = True

    def __post_init__(self) -> None:
        _pos_int(self.in_channels, "Conv2d in_channels")
        _pos_int(self.out_channels, "Conv2d out_channels")
        _pos_int(self.kernel_size, "Conv2d kernel_size")
        _pos_int(self.stride, "Conv2d stride")
        _pos_int(self.padding, "Conv2d padding", 0)


@dataclass(frozen=True)
class ReLU:
    """``max(x, 0)`` elementwise (one secure comparison per value)."""


@dataclass(frozen=True)
class MaxPool2d:
    """Max pooling over ``kernel_size`` squares with ``stride`` (default: the kernel size)."""

    kernel_size: int
    stride: int | None = None

    def __post_init__(self) -> None:
        _pos_int(self.kernel_size, "MaxPool2d kernel_size")
        if self.stride is not None:
            _pos_int(self.stride, "MaxPool2d stride")

    @property
    def step(self) -> int:
        """The stride actually used."""
        return self.kernel_size if self.stride is None else self.stride


@dataclass(frozen=True)
class AvgPool2d:
    """Average pooling over ``kernel_size`` squares with ``stride`` (default: the kernel)."""

    kernel_size: int
    stride: int | None = None

    def __post_init__(self) -> None:
        _pos_int(self.kernel_size, "AvgPool2d kernel_size")
        if self.stride is not None:
            _pos_int(self.stride, "AvgPool2d stride")

    @property
    def step(self) -> int:
        """The stride actually used."""
        return self.kernel_size if self.stride is None else self.stride


@dataclass(frozen=True)
class GlobalAvgPool:
    """Average over all spatial positions: ``(H, W, C) -> (C,)`` (``AdaptiveAvgPool2d(1)``)."""


@dataclass(frozen=True)
class Flatten:
    """``(H, W, C) -> (C*H*W,)`` in torch's ``(C, H, W)`` order; identity on flat inputs."""


@dataclass(frozen=True)
class Residual:
    """``body(x) + shortcut(x)``; an empty shortcut is the identity (a ResNet basic block)."""

    body: tuple[Layer, ...]
    shortcut: tuple[Layer, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", tuple(self.body))
        object.__setattr__(self, "shortcut", tuple(self.shortcut))
        if not self.body:
            raise ConfigurationError("a Residual block needs a non-empty body")


Layer: TypeAlias = (
    Linear | Conv2d | ReLU | MaxPool2d | AvgPool2d | GlobalAvgPool | Flatten | Residual
)
_LAYER_TYPES = (Linear, Conv2d, ReLU, MaxPool2d, AvgPool2d, GlobalAvgPool, Flatten, Residual)

Shape: TypeAlias = tuple[int, ...]
"""A per-query activation shape: ``(H, W, C)`` (spatial, NHWC) or ``(F,)`` (flat)."""


# ---------------------------------------------------------------------------- the walk


class Visitor(Protocol):
    """What :func:`walk` calls, in protocol order, for each step of an architecture."""

    def linear(self, layer: Linear | Conv2d, index: int, shape_in: Shape, shape_out: Shape) -> None:
        """Visit a :class:`Linear` or :class:`Conv2d` (parameter pair ``index``)."""

    def relu(self, shape: Shape) -> None:
        """Visit a :class:`ReLU` on the current value."""

    def maxpool(self, layer: MaxPool2d, shape_in: Shape, shape_out: Shape) -> None:
        """Visit a :class:`MaxPool2d`."""

    def avgpool(self, kernel: int, stride: int, shape_in: Shape, shape_out: Shape) -> None:
        """Visit an :class:`AvgPool2d` or :class:`GlobalAvgPool` (kernel = the whole map)."""

    def flatten(self, shape_in: Shape, shape_out: Shape) -> None:
        """Visit a :class:`Flatten` (or the flattening half of :class:`GlobalAvgPool`)."""

    def residual_begin(self, shape: Shape) -> None:
        """Save the current value (the block's input) for the shortcut."""

    def residual_swap(self, shape: Shape) -> None:
        """Set the body's output aside and continue from the saved input."""

    def residual_end(self, shape: Shape) -> None:
        """Add the shortcut's output to the body's output."""


def _conv_out(size: int, k: int, stride: int, pad: int, where: str) -> int:
    if size + 2 * pad < k:
        raise ConfigurationError(f"{where}: kernel {k} is larger than the input {size} (+ pad)")
    return (size + 2 * pad - k) // stride + 1


def _pool_follows(layers: Sequence[Layer], i: int) -> bool:
    """Whether a :class:`MaxPool2d` follows the ReLU at ``layers[i]`` (it is visited after it).

    ``max(ReLU(a), ReLU(b)) = ReLU(max(a, b))`` (ReLU is monotone), so ``ReLU, MaxPool2d`` is
    evaluated as ``MaxPool2d, ReLU``: ``k^2`` times fewer ReLU comparisons, the same result.
    Every walker (secure parties, the Flower schedule, the plaintext twin, the bounds) sees
    this order.
    """
    return i + 1 < len(layers) and isinstance(layers[i + 1], MaxPool2d)


def _walk(  # noqa: C901, PLR0915
    layers: Sequence[Layer], shape: Shape, visitor: Visitor | None, counter: list[int], where: str
) -> Shape:
    for i, layer in enumerate(layers):
        at = f"{where}[{i}] {type(layer).__name__}"
        if not isinstance(layer, _LAYER_TYPES):
            raise ConfigurationError(f"{at}: not a supported layer ({type(layer).__name__})")
        if isinstance(layer, Linear):
            if shape != (layer.in_features,):
                raise ConfigurationError(f"{at}: expects ({layer.in_features},), got {shape}")
            out: Shape = (layer.out_features,)
            if visitor is not None:
                visitor.linear(layer, counter[0], shape, out)
            counter[0] += 1
        elif isinstance(layer, Conv2d):
            if len(shape) != 3 or shape[2] != layer.in_channels:
                raise ConfigurationError(
                    f"{at}: expects (H, W, {layer.in_channels}) activations, got {shape}"
                )
            k, s, p = layer.kernel_size, layer.stride, layer.padding
            out = (
                _conv_out(shape[0], k, s, p, at),
                _conv_out(shape[1], k, s, p, at),
                layer.out_channels,
            )
            if visitor is not None:
                visitor.linear(layer, counter[0], shape, out)
            counter[0] += 1
        elif isinstance(layer, ReLU):
            out = shape
            if visitor is not None and not _pool_follows(layers, i):
                visitor.relu(shape)
        elif isinstance(layer, MaxPool2d | AvgPool2d):
            if len(shape) != 3:
                raise ConfigurationError(f"{at}: needs (H, W, C) activations, got {shape}")
            k, s = layer.kernel_size, layer.step
            out = (_conv_out(shape[0], k, s, 0, at), _conv_out(shape[1], k, s, 0, at), shape[2])
            if visitor is not None:
                if isinstance(layer, MaxPool2d):
                    visitor.maxpool(layer, shape, out)
                    if i and isinstance(layers[i - 1], ReLU):  # ReLU after pooling: equal, cheaper
                        visitor.relu(out)
                else:
                    visitor.avgpool(k, s, shape, out)
        elif isinstance(layer, GlobalAvgPool):
            if len(shape) != 3 or shape[0] != shape[1]:
                raise ConfigurationError(f"{at}: needs square (H, H, C) activations, got {shape}")
            pooled = (1, 1, shape[2])
            out = (shape[2],)
            if visitor is not None:
                visitor.avgpool(shape[0], shape[0], shape, pooled)
                visitor.flatten(pooled, out)
        elif isinstance(layer, Flatten):
            out = (math.prod(shape),)
            if visitor is not None:
                visitor.flatten(shape, out)
        else:
            if visitor is not None:
                visitor.residual_begin(shape)
            body = _walk(layer.body, shape, visitor, counter, f"{at}.body")
            if visitor is not None:
                visitor.residual_swap(body)
            short = _walk(layer.shortcut, shape, visitor, counter, f"{at}.shortcut")
            if body != short:
                raise ConfigurationError(f"{at}: body gives {body}, shortcut gives {short}")
            if visitor is not None:
                visitor.residual_end(body)
            out = body
        shape = out
    return shape


def _param_layers(layers: Sequence[Layer]) -> Iterator[Linear | Conv2d]:
    for layer in layers:
        if isinstance(layer, Linear | Conv2d):
            yield layer
        elif isinstance(layer, Residual):
            yield from _param_layers(layer.body)
            yield from _param_layers(layer.shortcut)


@dataclass(frozen=True)
class Architecture:
    """The public skeleton of a model: per-query input shape and layers.

    Parameters
    ----------
    input_shape : tuple of int
        One query's shape in torch's order: ``(C, H, W)`` for images or ``(F,)``.
    layers : tuple of Layer
        The layers in order.

    Raises
    ------
    ConfigurationError
        If a layer is unsupported or the shapes do not chain, naming the layer.
    """

    input_shape: tuple[int, ...]
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        dims = tuple(self.input_shape)
        if len(dims) not in (1, 3) or any(
            isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1 for d in dims
        ):
            raise ConfigurationError(f"input_shape must be (C, H, W) or (F,), got {dims!r}")
        object.__setattr__(self, "input_shape", tuple(int(d) for d in dims))
        object.__setattr__(self, "layers", tuple(self.layers))
        out = _walk(self.layers, self.internal_input_shape, None, [0], "layers")
        if len(out) != 1:
            raise ConfigurationError(f"the last layer must give flat logits, got shape {out}")

    @property
    def internal_input_shape(self) -> Shape:
        """The input shape in the protocol's layout: ``(H, W, C)`` or ``(F,)``."""
        s = self.input_shape
        return (s[1], s[2], s[0]) if len(s) == 3 else s

    @property
    def num_outputs(self) -> int:
        """Number of logits per query."""
        return _walk(self.layers, self.internal_input_shape, None, [0], "layers")[0]

    def param_layers(self) -> list[Linear | Conv2d]:
        """Return the :class:`Linear` / :class:`Conv2d` layers in traversal (parameter) order."""
        return list(_param_layers(self.layers))

    def param_shapes(self) -> list[tuple[tuple[int, ...], tuple[int, ...] | None]]:
        """``(weight shape, bias shape or None)`` of each parameter layer, torch's layout."""
        shapes: list[tuple[tuple[int, ...], tuple[int, ...] | None]] = []
        for layer in self.param_layers():
            if isinstance(layer, Linear):
                w: tuple[int, ...] = (layer.out_features, layer.in_features)
                o = layer.out_features
            else:
                k = layer.kernel_size
                w = (layer.out_channels, layer.in_channels, k, k)
                o = layer.out_channels
            shapes.append((w, (o,) if layer.bias else None))
        return shapes

    def walk(self, visitor: Visitor) -> None:
        """Call ``visitor`` for every step, in protocol order."""
        _walk(self.layers, self.internal_input_shape, visitor, [0], "layers")

    def counts(self) -> dict[str, int]:
        """Per query: ``relus`` (secure comparisons), ``macs`` (multiply-adds), ``params``."""
        counter = _Counter()
        self.walk(counter)
        return {"relus": counter.relus, "macs": counter.macs, "params": counter.params}


class _Counter:
    def __init__(self) -> None:
        self.relus = self.macs = self.params = 0

    def linear(self, layer: Linear | Conv2d, index: int, shape_in: Shape, shape_out: Shape) -> None:
        fan_in = (
            shape_in[0] if isinstance(layer, Linear) else layer.in_channels * layer.kernel_size**2
        )
        self.macs += math.prod(shape_out) * fan_in
        self.params += fan_in * shape_out[-1] + (shape_out[-1] if layer.bias else 0)

    def relu(self, shape: Shape) -> None:
        self.relus += math.prod(shape)

    def maxpool(self, layer: MaxPool2d, shape_in: Shape, shape_out: Shape) -> None:
        self.relus += math.prod(shape_out) * (layer.kernel_size**2 - 1)

    def avgpool(self, kernel: int, stride: int, shape_in: Shape, shape_out: Shape) -> None:
        pass

    def flatten(self, shape_in: Shape, shape_out: Shape) -> None:
        pass

    def residual_begin(self, shape: Shape) -> None:
        pass

    def residual_swap(self, shape: Shape) -> None:
        pass

    def residual_end(self, shape: Shape) -> None:
        pass


def walk(architecture: Architecture, visitor: Visitor) -> None:
    """Call ``visitor`` for every step of ``architecture`` (see :class:`Visitor`)."""
    architecture.walk(visitor)
