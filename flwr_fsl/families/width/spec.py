"""The layer structure of a width-scalable model: :class:`WidthSpec` and :class:`WidthLayer`.

Flower-free. The *layer structure* (:class:`WidthSpec`, one :class:`WidthLayer` per layer) says
which tensors of a torch ``Linear`` / ``Conv2d`` / ``BatchNorm`` state dict are a layer's weight,
bias and per-channel extras (batch-norm scale and shift, running statistics) and how the channel
axes chain (``in_group``: how many input features one channel of the previous layer spans, e.g.
``H * W`` after flattening a conv feature map). :meth:`WidthSpec.layout` turns a client's kept
channels into the platform's :class:`~flwr_fsl.submodel.layout.WidthLayout`, whose element space
is the global model's flat space, so the one count-weighted apply
(:mod:`flwr_fsl.submodel.aggregate`) averages every coordinate over the clients holding it —
FedRolex's and HeteroFL's ``combine`` with its default unweighted mean.

:mod:`flwr_fsl.families.width.rules` (the extraction rules, which re-export these names) says
which channels a client keeps; this module turns them into tensor slices and layouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.families.width.messages import _check_width
from flwr_fsl.submodel.layout import TensorSlice, WidthLayout

__all__ = ["WidthLayer", "WidthSpec"]


# -- layer structure ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WidthLayer:
    """One layer of a width-scalable model and the tensors indexed by its output channels.

    Attributes
    ----------
    name : str
        The layer's name (keys the kept-channel index sets).
    weight : str
        Its weight tensor: ``(out, in)`` linear or ``(out, in, kh, kw)`` conv.
    bias : str or None
        Its bias ``(out,)``.
    extras : tuple[str, ...]
        Other ``(out,)`` tensors indexed by the layer's output channels: batch-norm weight and
        bias (and running statistics where tracked).
    scaled : bool
        Whether the layer's outputs are narrowed (hidden layers). The last layer keeps its
        outputs whole; so may any layer whose width must not change.
    in_group : int
        Input features per output channel of the previous layer (``H * W`` where a conv
        feature map is flattened channel-major into a linear layer; 1 otherwise).
    """

    name: str
    weight: str
    bias: str | None = None
    extras: tuple[str, ...] = ()
    scaled: bool = True
    in_group: int = 1

    @property
    def tensors(self) -> tuple[str, ...]:
        """Every tensor of the layer: weight, bias, extras."""
        return (self.weight, *((self.bias,) if self.bias else ()), *self.extras)


@dataclass(frozen=True)
class WidthSpec:
    """The layer structure of a width-scalable model: layers in forward order, chained.

    Layer ``l``'s input channels are layer ``l-1``'s output channels (each spanning
    ``in_group`` input features); the first layer's inputs are kept whole. Tensors in no layer
    are kept whole.

    Attributes
    ----------
    layers : tuple[WidthLayer, ...]
        The layers.

    Raises
    ------
    ConfigurationError
        If there is no layer, a layer name repeats or a tensor belongs to two layers.
    """

    layers: tuple[WidthLayer, ...]

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        object.__setattr__(self, "layers", layers)
        if not layers or not all(isinstance(layer, WidthLayer) for layer in layers):
            raise ConfigurationError("a width spec needs at least one WidthLayer")
        names = [layer.name for layer in layers]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"layer names must be unique, got {names}")
        tensors = [t for layer in layers for t in layer.tensors]
        if len(set(tensors)) != len(tensors):
            raise ConfigurationError("a tensor belongs to more than one layer")
        for layer in layers:
            _check_width(layer.in_group, f"{layer.name}: in_group")

    @classmethod
    def sequential(cls, arrays: Mapping[str, ArrayLike]) -> WidthSpec:
        """Infer the structure of a plain feed-forward model from its state dict's order.

        Every tensor with two or more axes starts a layer (its weight); each following 1-D
        floating tensor of the layer's output width is its bias (the first) or an extra
        (batch norm); other tensors (integer counters, scalars) are kept whole. A layer's
        ``in_group`` is its input width over the previous layer's output width. Every layer
        is scaled but the last. Works for MLPs and VGG-like CNNs (conv blocks, a flatten,
        linear layers), e.g. :class:`flwr_fsl.models.width.WidthMLP` / ``WidthCNN``.

        Parameters
        ----------
        arrays : Mapping[str, array_like]
            The global model (its tensors in forward order, as ``state_dict()`` lists them).

        Returns
        -------
        WidthSpec
            The layers.

        Raises
        ------
        ConfigurationError
            If there is no weight, a 1-D floating tensor does not match its layer's width, or
            an input width is not a multiple of the previous output width.
        """
        # Per layer: weight name, its shape, then its 1-D tensors (the first is the bias).
        drafts: list[tuple[str, tuple[int, ...], list[str]]] = []
        for name, value in arrays.items():
            shape = tuple(int(d) for d in np.shape(value))
            floating = np.issubdtype(np.asarray(value).dtype, np.floating)
            if len(shape) >= 2:
                drafts.append((name, shape, []))
                continue
            if len(shape) != 1 or not floating:
                continue  # integer counters, scalars: kept whole
            if not drafts:
                raise ConfigurationError(
                    f"{name!r} comes before any weight: not a sequential model"
                )
            weight, wshape, vectors = drafts[-1]
            if shape[0] != wshape[0]:
                raise ConfigurationError(
                    f"{name!r} has {shape[0]} entries, its layer {weight!r} {wshape[0]} "
                    "outputs: not a sequential model"
                )
            vectors.append(name)
        if not drafts:
            raise ConfigurationError("the model has no weight tensor (2 or more axes)")
        layers: list[WidthLayer] = []
        prev_out: int | None = None
        for i, (weight, shape, vectors) in enumerate(drafts):
            group = 1
            if prev_out is not None:
                if shape[1] % prev_out:
                    raise ConfigurationError(
                        f"{weight!r} has {shape[1]} inputs, not a multiple of the previous "
                        f"layer's {prev_out} outputs"
                    )
                group = shape[1] // prev_out
            layers.append(
                WidthLayer(
                    name=weight.removesuffix(".weight"),
                    weight=weight,
                    bias=vectors[0] if vectors else None,
                    extras=tuple(vectors[1:]),
                    scaled=i < len(drafts) - 1,
                    in_group=group,
                )
            )
            prev_out = shape[0]
        return cls(tuple(layers))

    @property
    def scaled_layers(self) -> tuple[WidthLayer, ...]:
        """The layers whose outputs are narrowed."""
        return tuple(layer for layer in self.layers if layer.scaled)

    def widths(self, arrays: Mapping[str, ArrayLike]) -> dict[str, int]:
        """Check the structure against a model; return each scaled layer's global width.

        Raises
        ------
        ConfigurationError
            If a tensor is missing, a weight has fewer than two axes, a bias or extra is not
            ``(out,)``, or a layer's input width is not ``in_group`` times the previous
            layer's output width.
        """
        out: dict[str, int] = {}
        prev: int | None = None
        for layer in self.layers:
            for t in layer.tensors:
                if t not in arrays:
                    raise ConfigurationError(f"layer {layer.name!r}: the model has no tensor {t!r}")
            shape = np.shape(arrays[layer.weight])
            if len(shape) < 2:
                raise ConfigurationError(
                    f"layer {layer.name!r}: weight {layer.weight!r} is {shape}"
                )
            for t in layer.tensors[1:]:
                if np.shape(arrays[t]) != (shape[0],):
                    raise ConfigurationError(
                        f"layer {layer.name!r}: {t!r} has shape {np.shape(arrays[t])}, "
                        f"expected ({shape[0]},)"
                    )
            if prev is not None and shape[1] != prev * layer.in_group:
                raise ConfigurationError(
                    f"layer {layer.name!r}: {shape[1]} inputs != {prev} channels of the previous "
                    f"layer x in_group {layer.in_group}"
                )
            if layer.scaled:
                out[layer.name] = int(shape[0])
            prev = int(shape[0])
        return out

    def slices(
        self, arrays: Mapping[str, ArrayLike], indices: Mapping[str, ArrayLike]
    ) -> dict[str, TensorSlice]:
        """Per tensor, the kept output / input channels of a client's width slice.

        Parameters
        ----------
        arrays : Mapping[str, array_like]
            The global model.
        indices : Mapping[str, array_like]
            Scaled layer name -> its kept output channels (any order; the narrow tensors
            follow it). Every scaled layer must be given, no other.

        Returns
        -------
        dict[str, TensorSlice]
            For :meth:`WidthLayout.of`.

        Raises
        ------
        ConfigurationError
            If the structure does not fit the model or the index sets name other layers.
        """
        self.widths(arrays)
        self._check_names(indices, ValueError)
        out: dict[str, TensorSlice] = {}
        prev: NDArray[np.int64] | None = None
        for layer in self.layers:
            in_idx = None
            if prev is not None:
                g = layer.in_group
                in_idx = (prev[:, None] * g + np.arange(g, dtype=np.int64)).reshape(-1)
            out_idx = None
            if layer.scaled:
                out_idx = np.asarray(indices[layer.name])
                if out_idx.ndim != 1 or not (
                    np.issubdtype(out_idx.dtype, np.integer) or out_idx.size == 0
                ):
                    raise ConfigurationError(
                        f"{layer.name}: kept channels must be a 1-D integer array"
                    )
                out_idx = out_idx.astype(np.int64)
            out[layer.weight] = TensorSlice(out_idx, in_idx)
            if out_idx is not None:
                for t in layer.tensors[1:]:
                    out[t] = TensorSlice(out_idx)
            prev = out_idx
        return out

    def _check_names(self, indices: Mapping[str, ArrayLike], error: type[ValueError]) -> None:
        scaled = [layer.name for layer in self.scaled_layers]
        if set(indices) != set(scaled):
            raise error(
                f"index sets must name exactly the scaled layers {scaled}, got {sorted(indices)}"
            )

    def layout(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: Mapping[str, ArrayLike],
        *,
        from_client: bool = False,
    ) -> WidthLayout:
        """Build the :class:`WidthLayout` of a client's width slice (kept channels per layer).

        Parameters
        ----------
        arrays : Mapping[str, numpy.ndarray]
            The global model.
        indices : Mapping[str, array_like]
            Scaled layer name -> kept output channels (see :meth:`slices`).
        from_client : bool
            The index sets came from a client: a bad one raises
            :class:`~flwr_fsl.core.errors.ClientInputError`.

        Returns
        -------
        WidthLayout
            Its element space is the global model's flat space.

        Raises
        ------
        ValueError or ClientInputError
            If the structure does not fit the model or an index set is invalid.
        """
        error: type[ValueError] = ClientInputError if from_client else ValueError
        self._check_names(indices, error)
        for name in indices:
            idx = np.asarray(indices[name])
            if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
                raise error(f"{name}: kept channels must be a 1-D integer array")
        return WidthLayout.of(arrays, self.slices(arrays, indices), from_client=from_client)
