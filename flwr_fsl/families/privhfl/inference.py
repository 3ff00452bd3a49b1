"""Models for secure prediction: public architectures, private weights, a plaintext twin.

PrivHFL's secure querying (:mod:`flwr_fsl.families.privhfl.protocol`) evaluates an answerer's model
on secret-shared queries. The model is split into what every party knows and what only the
answerer knows:

* :class:`Architecture` — the *public* skeleton: the per-query input shape and a tuple of
  layers (:class:`Linear`, :class:`Conv2d`, :class:`ReLU`, :class:`MaxPool2d`,
  :class:`AvgPool2d`, :class:`GlobalAvgPool`, :class:`Flatten`, :class:`Residual`). Shapes are
  inferred and checked once when it is built (:class:`~flwr_fsl.core.errors.ConfigurationError`
  naming the layer otherwise). The server and the querier need it to take part in the
  protocol, so layer types, sizes and the number of comparisons are not secret. The layer
  types and the walk are in :mod:`flwr_fsl.families.privhfl.architecture` (re-exported here).
* :class:`SecureModel` — the architecture plus its weights (float arrays, one
  ``(weight, bias)`` pair per :class:`Linear` / :class:`Conv2d` in traversal order), held by the
  answerer only. :func:`from_torch` converts a plain ``torch.nn`` module (``nn.Sequential`` of
  ``Linear``, ``Conv2d``, ``ReLU``, ``MaxPool2d``, ``AvgPool2d``, ``AdaptiveAvgPool2d(1)``,
  ``Flatten``, ``Identity``/``Dropout``, with eval-mode ``BatchNorm`` folded into the
  preceding linear layer, and residual blocks that expose ``privhfl_residual()``).

Layouts (shared with the secure evaluators): a spatial activation of a batch is ``NHWC``
(channels last) so that a convolution is one matrix product ``patches @ M`` with ``patches``
of shape ``(N*OH*OW, C*kh*kw)`` (window order ``(C, kh, kw)``, torch's weight order) and
``M = weight.reshape(O, -1).T``; :class:`Flatten` reads NHWC back in torch's ``(C, H, W)``
order. Inputs and :func:`plaintext_forward` use torch's ``NCHW``.

:func:`plaintext_forward` evaluates a model in float64 with exactly the steps of the secure
protocol (max pooling as a tree of ``max(a, b) = ReLU(a - b) + b``), and can record the input
of every comparison in protocol order, which is what the querier of PrivHFL's DReLU learns up
to a positive factor. :func:`error_bound` bounds ``|secure - plaintext|`` of every output of the
fixed-point protocol (rounding of weights and inputs, one unit per truncation), and
:func:`comparison_bound` the magnitude of every comparison input, which must stay below the
protocol's ``2^(bound_bits - frac_bits)``.

Everything here is numpy only (``torch`` is imported lazily by :func:`from_torch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError

# The public layer types and the walk live in architecture; re-exported here.
from flwr_fsl.families.privhfl.architecture import (
    Architecture,
    AvgPool2d,
    Conv2d,
    Flatten,
    GlobalAvgPool,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    Residual,
    Shape,
    Visitor,
    walk,
)

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
    "SecureModel",
    "Visitor",
    "comparison_bound",
    "error_bound",
    "from_torch",
    "nhwc_patches",
    "plaintext_forward",
    "pool_windows",
    "walk",
]


# ----------------------------------------------------------------------------- the model


def _float_array(value: object, shape: tuple[int, ...], what: str) -> NDArray[np.float64]:
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu":
        raise ConfigurationError(f"{what} must be a real array, got {type(value).__name__}")
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.shape != shape:
        raise ConfigurationError(f"{what} must have shape {shape}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ConfigurationError(f"{what} holds NaN or inf")
    return arr


@dataclass(frozen=True, eq=False)
class SecureModel:
    """An architecture and its weights (the answerer's private model).

    Parameters
    ----------
    architecture : Architecture
        The public skeleton.
    params : sequence of (weight, bias)
        One pair per :class:`Linear` / :class:`Conv2d` in traversal order, torch's layout:
        ``(out, in)`` or ``(out, in, k, k)``; ``bias`` is ``(out,)`` or ``None`` (must match
        the layer's ``bias`` flag).

    Raises
    ------
    ConfigurationError
        If the number, shape or finiteness of the parameters is wrong.
    """

    architecture: Architecture
    params: tuple[tuple[NDArray[np.float64], NDArray[np.float64] | None], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.architecture, Architecture):
            raise ConfigurationError("architecture must be an Architecture")
        shapes = self.architecture.param_shapes()
        given = tuple(self.params)
        if len(given) != len(shapes):
            raise ConfigurationError(
                f"the architecture has {len(shapes)} parameter layers, got {len(given)} pairs"
            )
        clean = []
        for i, ((w_shape, b_shape), pair) in enumerate(zip(shapes, given, strict=True)):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise ConfigurationError(f"params[{i}] must be a (weight, bias) pair")
            w = _float_array(pair[0], w_shape, f"params[{i}] weight")
            if b_shape is None:
                if pair[1] is not None:
                    raise ConfigurationError(f"params[{i}]: the layer has no bias, got one")
                b = None
            else:
                b = _float_array(pair[1], b_shape, f"params[{i}] bias")
            clean.append((w, b))
        object.__setattr__(self, "params", tuple(clean))

    def max_abs_weight(self) -> float:
        """Largest ``|w|`` over all weights and biases."""
        values = [float(np.max(np.abs(w))) for w, _ in self.params if w.size]
        values += [float(np.max(np.abs(b))) for _, b in self.params if b is not None and b.size]
        return max(values, default=0.0)


def matmul_weight(weight: NDArray[np.float64]) -> NDArray[np.float64]:
    """Return the ``(K, O)`` matrix ``M`` with ``layer(x) = patches(x) @ M`` (torch layout)."""
    return np.ascontiguousarray(weight.reshape(weight.shape[0], -1).T)


# ------------------------------------------------------------------------ layout helpers


def nhwc_patches(x: NDArray[Any], kernel: int, stride: int, padding: int) -> NDArray[Any]:
    """Return the im2col matrix of an ``(N, H, W, C)`` batch.

    Shape ``(N*OH*OW, C*kernel*kernel)``, window order ``(C, kh, kw)`` (torch's weight order),
    zero padding; works on any dtype (shares too).
    """
    if padding:
        x = np.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    win = sliding_window_view(x, (kernel, kernel), axis=(1, 2))[:, ::stride, ::stride]
    n, oh, ow = win.shape[:3]
    return win.reshape(n * oh * ow, -1)


def pool_windows(x: NDArray[Any], kernel: int, stride: int) -> NDArray[Any]:
    """Return the ``kernel*kernel`` window elements of an ``(N, H, W, C)`` batch.

    Stacked first: ``(kernel*kernel, N, OH, OW, C)`` (row-major window order).
    """
    win = sliding_window_view(x, (kernel, kernel), axis=(1, 2))[:, ::stride, ::stride]
    n, oh, ow, c = win.shape[:4]
    return np.ascontiguousarray(np.moveaxis(win.reshape(n, oh, ow, c, kernel * kernel), 4, 0))


def to_nhwc(x: NDArray[Any]) -> NDArray[Any]:
    """``(N, C, H, W) -> (N, H, W, C)``; flat ``(N, F)`` inputs unchanged."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if x.ndim == 4 else x


def flatten_nhwc(x: NDArray[Any]) -> NDArray[Any]:
    """``(N, H, W, C) -> (N, C*H*W)`` in torch's ``(C, H, W)`` order; flat inputs unchanged."""
    if x.ndim == 2:
        return x
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)).reshape(x.shape[0], -1)


def tree_max(
    windows: NDArray[Any],
    relu: Callable[[NDArray[Any]], NDArray[Any]],
    sub: Callable[[NDArray[Any], NDArray[Any]], NDArray[Any]],
    add: Callable[[NDArray[Any], NDArray[Any]], NDArray[Any]],
) -> NDArray[Any]:
    """Max over axis 0 by a tree of ``max(a, b) = relu(a - b) + b`` (one ``relu`` per level).

    Each level pairs elements ``2i`` and ``2i + 1`` of the stack and calls ``relu`` once on
    all differences (a batched comparison); an odd last element passes to the next level.
    ``m`` elements take ``ceil(log2 m)`` levels and ``m - 1`` comparisons.
    """
    w = windows
    while w.shape[0] > 1:
        half = w.shape[0] // 2
        left, right = w[0 : 2 * half : 2], w[1 : 2 * half : 2]
        merged = add(relu(sub(left, right)), right)
        w = np.concatenate([merged, w[2 * half :]]) if w.shape[0] % 2 else merged
    return w[0]


# -------------------------------------------------------------------- plaintext twin


class _Plain:
    """Float64 evaluation following the protocol's steps (layout, tree max)."""

    def __init__(self, model: SecureModel, x: NDArray[np.float64], record: list | None) -> None:
        self.model = model
        self.stack = [to_nhwc(x)]
        self.record = record

    def _relu(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        if self.record is not None:
            self.record.append(v.copy())
        return np.maximum(v, 0.0)

    def linear(self, layer: Linear | Conv2d, index: int, shape_in: Shape, shape_out: Shape) -> None:
        w, b = self.model.params[index]
        x = self.stack[-1]
        n = x.shape[0]
        if isinstance(layer, Conv2d):
            p = nhwc_patches(x, layer.kernel_size, layer.stride, layer.padding)
            y = (p @ matmul_weight(w)).reshape(n, *shape_out)
        else:
            y = x @ matmul_weight(w)
        self.stack[-1] = y + b if b is not None else y

    def relu(self, shape: Shape) -> None:
        self.stack[-1] = self._relu(self.stack[-1])

    def maxpool(self, layer: MaxPool2d, shape_in: Shape, shape_out: Shape) -> None:
        win = pool_windows(self.stack[-1], layer.kernel_size, layer.step)
        self.stack[-1] = tree_max(win, self._relu, np.subtract, np.add)

    def avgpool(self, kernel: int, stride: int, shape_in: Shape, shape_out: Shape) -> None:
        self.stack[-1] = pool_windows(self.stack[-1], kernel, stride).mean(axis=0)

    def flatten(self, shape_in: Shape, shape_out: Shape) -> None:
        self.stack[-1] = flatten_nhwc(self.stack[-1])

    def residual_begin(self, shape: Shape) -> None:
        self.stack.append(self.stack[-1])

    def residual_swap(self, shape: Shape) -> None:
        self.stack[-1], self.stack[-2] = self.stack[-2], self.stack[-1]

    def residual_end(self, shape: Shape) -> None:
        short = self.stack.pop()
        self.stack[-1] = self.stack[-1] + short


def _check_queries(architecture: Architecture, x: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != len(architecture.input_shape) + 1 or arr.shape[1:] != architecture.input_shape:
        raise ConfigurationError(
            f"queries must have shape (N, {', '.join(map(str, architecture.input_shape))}), "
            f"got {arr.shape}"
        )
    if not np.all(np.isfinite(arr)):
        raise ConfigurationError("queries hold NaN or inf")
    return arr


def plaintext_forward(
    model: SecureModel, x: ArrayLike, record: list[NDArray[np.float64]] | None = None
) -> NDArray[np.float64]:
    """Evaluate ``model`` on a batch in float64, step for step as the secure protocol does.

    Parameters
    ----------
    model : SecureModel
        The model.
    x : array_like
        ``(N, *input_shape)`` queries (torch's NCHW for images).
    record : list, optional
        If given, the input of every comparison is appended in protocol order (a ReLU layer's
        pre-activations, each max-pool level's differences), in the protocol's layout.

    Returns
    -------
    numpy.ndarray
        ``(N, num_outputs)`` logits.
    """
    plain = _Plain(model, _check_queries(model.architecture, x), record)
    model.architecture.walk(plain)
    return plain.stack[-1]


# --------------------------------------------------------------------------- error bound


class _Bound:
    """Propagates ``(B, e)``: a bound on ``|value|`` and on ``|secure - plaintext|``."""

    def __init__(self, model: SecureModel, x_abs: float, frac_bits: int) -> None:
        self.model = model
        self.u = 2.0**-frac_bits
        self.stack = [(float(x_abs), self.u)]
        self.comparisons = 0.0

    def linear(self, layer: Linear | Conv2d, index: int, shape_in: Shape, shape_out: Shape) -> None:
        w, b = self.model.params[index]
        m = np.abs(matmul_weight(w))
        fan_in = m.shape[0]
        norm = float(m.sum(axis=0).max())  # max over outputs of sum_k |W[k, o]|
        bias = float(np.max(np.abs(b))) if b is not None else 0.0
        big, err = self.stack[-1]
        u = self.u
        # |X_s W_q - X W| <= e (||W|| + K u/2) + B K u/2; truncation < u; bias rounding <= u/2.
        err_out = (
            err * (norm + fan_in * u / 2)
            + big * fan_in * u / 2
            + u
            + (u / 2 if b is not None else 0)
        )
        self.stack[-1] = (big * norm + bias, err_out)

    def relu(self, shape: Shape) -> None:
        self.comparisons = max(self.comparisons, self.stack[-1][0])

    def maxpool(self, layer: MaxPool2d, shape_in: Shape, shape_out: Shape) -> None:
        self.comparisons = max(self.comparisons, 2 * self.stack[-1][0])

    def avgpool(self, kernel: int, stride: int, shape_in: Shape, shape_out: Shape) -> None:
        big, err = self.stack[-1]
        k2 = kernel * kernel
        w_q = round(1 / (k2 * self.u)) * self.u
        self.stack[-1] = (big, err * k2 * w_q + k2 * big * self.u / 2 + self.u)

    def flatten(self, shape_in: Shape, shape_out: Shape) -> None:
        pass

    def residual_begin(self, shape: Shape) -> None:
        self.stack.append(self.stack[-1])

    def residual_swap(self, shape: Shape) -> None:
        self.stack[-1], self.stack[-2] = self.stack[-2], self.stack[-1]

    def residual_end(self, shape: Shape) -> None:
        b2, e2 = self.stack.pop()
        b1, e1 = self.stack[-1]
        self.stack[-1] = (b1 + b2, e1 + e2)


def error_bound(model: SecureModel, x_abs_max: float, frac_bits: int = 20) -> float:
    """Bound ``|secure - plaintext|`` on every logit of the fixed-point protocol.

    Sources: inputs rounded to ``u = 2^-frac_bits`` (< u), weights and biases rounded to
    nearest (<= u/2 each), one unit per truncation (the SecureML result is the floor or one
    more), the average pool's weight ``round(1/k^2)``; comparisons (ReLU, max) are exact in the
    ring and 1-Lipschitz. The bound excludes the truncation *wrap* (probability
    ``|v| 2^(2 frac_bits - 64)`` per truncated product ``v``, see :mod:`.privhfl`).

    Parameters
    ----------
    model : SecureModel
        The model.
    x_abs_max : float
        A bound on ``|x|`` over the queries.
    frac_bits : int, optional
        Fixed-point fractional bits.

    Returns
    -------
    float
        The bound (in logit units).
    """
    bound = _Bound(model, x_abs_max, frac_bits)
    model.architecture.walk(bound)
    return bound.stack[-1][1]


def comparison_bound(model: SecureModel, x_abs_max: float) -> float:
    """Worst-case ``|input|`` of any comparison (ReLU input or max-pool difference).

    The protocol is correct when this stays below ``2^(bound_bits - frac_bits)``; it is an a
    priori bound from the weights' row norms (often far above what real inputs reach).
    """
    bound = _Bound(model, x_abs_max, 20)
    model.architecture.walk(bound)
    return bound.comparisons


# --------------------------------------------------------------------------- from torch


def from_torch(module: Any, input_shape: Sequence[int]) -> SecureModel:  # noqa: C901, PLR0915
    """Convert a plain ``torch.nn`` module into a :class:`SecureModel`.

    Supported: ``nn.Sequential`` (nested), ``Linear``, ``Conv2d`` (square kernel, equal
    stride and zero padding on both axes, groups 1, dilation 1), ``ReLU``, ``MaxPool2d`` and
    ``AvgPool2d`` (no padding, no ceil mode), ``AdaptiveAvgPool2d(1)`` (with the following
    ``Flatten`` merged), ``Flatten(1)``, ``Identity`` and ``Dropout`` (skipped: inference),
    ``BatchNorm1d``/``BatchNorm2d`` in eval mode (folded into the preceding ``Linear`` /
    ``Conv2d``), and residual blocks: any module with a method ``privhfl_residual()``
    returning ``(body, shortcut)`` (``shortcut`` may be ``None``: identity) computes
    ``body(x) + shortcut(x)``.

    Parameters
    ----------
    module : torch.nn.Module
        The model (evaluated as in ``eval()`` mode).
    input_shape : sequence of int
        One query's shape, ``(C, H, W)`` or ``(F,)``.

    Returns
    -------
    SecureModel
        The architecture with float64 copies of the weights.

    Raises
    ------
    ConfigurationError
        If a module is not supported.
    """
    from torch import nn

    params: list[tuple[NDArray[np.float64], NDArray[np.float64] | None]] = []

    def arr(t: Any) -> NDArray[np.float64]:
        return np.asarray(t.detach().cpu().double().numpy(), dtype=np.float64)

    def pair(v: Any, what: str) -> int:
        if isinstance(v, tuple):
            if len(set(v)) != 1:
                raise ConfigurationError(f"{what} must be the same on both axes, got {v}")
            v = v[0]
        return int(v)

    def convert(mod: Any) -> list[Layer]:  # noqa: C901, PLR0915
        out: list[Layer] = []
        children = list(mod) if isinstance(mod, nn.Sequential) else [mod]
        for child in children:
            residual = getattr(child, "privhfl_residual", None)
            if callable(residual):
                body, short = residual()
                out.append(Residual(tuple(convert(body)), tuple(convert(short)) if short else ()))
            elif isinstance(child, nn.Sequential):
                out.extend(convert(child))
            elif isinstance(child, nn.Linear):
                params.append(
                    (arr(child.weight), arr(child.bias) if child.bias is not None else None)
                )
                out.append(Linear(child.in_features, child.out_features, child.bias is not None))
            elif isinstance(child, nn.Conv2d):
                if child.groups != 1 or pair(child.dilation, "dilation") != 1:
                    raise ConfigurationError("Conv2d with groups or dilation is not supported")
                if child.padding_mode != "zeros" or isinstance(child.padding, str):
                    raise ConfigurationError("Conv2d needs numeric zero padding")
                k = pair(child.kernel_size, "Conv2d kernel_size")
                params.append(
                    (arr(child.weight), arr(child.bias) if child.bias is not None else None)
                )
                out.append(
                    Conv2d(
                        child.in_channels,
                        child.out_channels,
                        k,
                        pair(child.stride, "Conv2d stride"),
                        pair(child.padding, "Conv2d padding"),
                        child.bias is not None,
                    )
                )
            elif isinstance(child, nn.BatchNorm1d | nn.BatchNorm2d):
                if not out or not isinstance(out[-1], Linear | Conv2d):
                    raise ConfigurationError("BatchNorm must follow a Linear or Conv2d to fold")
                if child.running_mean is None or child.running_var is None:
                    raise ConfigurationError("BatchNorm needs running statistics to fold")
                scale = arr(child.running_var) + float(child.eps)
                scale = 1.0 / np.sqrt(scale)
                if child.weight is not None:
                    scale = scale * arr(child.weight)
                shift = -arr(child.running_mean) * scale
                if child.bias is not None:
                    shift = shift + arr(child.bias)
                w, b = params[-1]
                w = w * scale.reshape(-1, *([1] * (w.ndim - 1)))
                b = shift if b is None else b * scale + shift
                params[-1] = (w, b)
                last = out[-1]
                out[-1] = (
                    Linear(last.in_features, last.out_features, True)
                    if isinstance(last, Linear)
                    else Conv2d(
                        last.in_channels, last.out_channels, last.kernel_size, last.stride,
                        last.padding, True,
                    )
                )  # fmt: skip
            elif isinstance(child, nn.ReLU):
                out.append(ReLU())
            elif isinstance(child, nn.MaxPool2d | nn.AvgPool2d):
                if pair(child.padding, "pool padding") != 0 or child.ceil_mode:
                    raise ConfigurationError("pooling with padding or ceil_mode is not supported")
                if isinstance(child, nn.MaxPool2d) and pair(child.dilation, "dilation") != 1:
                    raise ConfigurationError("MaxPool2d with dilation is not supported")
                if isinstance(child, nn.AvgPool2d) and child.divisor_override is not None:
                    raise ConfigurationError("AvgPool2d divisor_override is not supported")
                cls = MaxPool2d if isinstance(child, nn.MaxPool2d) else AvgPool2d
                k = pair(child.kernel_size, "pool kernel_size")
                out.append(cls(k, pair(child.stride, "pool stride") if child.stride else k))
            elif isinstance(child, nn.AdaptiveAvgPool2d):
                if pair(child.output_size, "output_size") != 1:
                    raise ConfigurationError("only AdaptiveAvgPool2d(1) is supported")
                out.append(GlobalAvgPool())
            elif isinstance(child, nn.Flatten):
                if child.start_dim != 1 or child.end_dim != -1:
                    raise ConfigurationError("only Flatten(start_dim=1) is supported")
                if not (out and isinstance(out[-1], GlobalAvgPool)):
                    out.append(Flatten())
            elif isinstance(child, nn.Identity | nn.Dropout):
                continue
            else:
                raise ConfigurationError(f"unsupported module {type(child).__name__}")
        return out

    layers = tuple(convert(module))
    return SecureModel(Architecture(tuple(input_shape), layers), tuple(params))
