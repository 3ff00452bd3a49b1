"""What a client trains and sends, and how the server averages it: layouts, top-k, the codec.

Everything here is numpy. :mod:`flwr_fsl.submodel.codec` is the one module that knows
Flower's record types (it defines the wire format); its names are re-exported here but
imported on first use, so ``flwr_fsl.protocols`` can use the layouts and the count-weighted
apply without loading Flower.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flwr_fsl.submodel.aggregate import (
    AggregationStats,
    accumulate,
    accumulate_elements,
    apply_count_weighted,
    count_weighted_average,
    count_weighted_mean,
)
from flwr_fsl.submodel.layout import (
    ElementUpdate,
    FlatLayout,
    Layout,
    RowLayout,
    TensorSlice,
    WidthLayout,
)
from flwr_fsl.submodel.topk import TopKConfig, sparsify
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate, TensorUpdate

if TYPE_CHECKING:
    from flwr_fsl.submodel.codec import (
        ARRAYS_KEY,
        FORMAT_VERSION,
        HEADER_KEY,
        SubmodelFormatError,
        decode_update,
        encode_update,
        is_submodel_reply,
    )

_CODEC_NAMES = frozenset(
    {
        "ARRAYS_KEY",
        "FORMAT_VERSION",
        "HEADER_KEY",
        "SubmodelFormatError",
        "decode_update",
        "encode_update",
        "is_submodel_reply",
    }
)


def __getattr__(name: str) -> Any:
    """Load the Flower-bound codec names on first use (PEP 562)."""
    if name in _CODEC_NAMES:
        from flwr_fsl.submodel import codec

        return getattr(codec, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ARRAYS_KEY",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "AggregationStats",
    "ElementUpdate",
    "Encoding",
    "FlatLayout",
    "Layout",
    "RowLayout",
    "SubmodelFormatError",
    "SubmodelUpdate",
    "TensorSlice",
    "TensorUpdate",
    "TopKConfig",
    "WidthLayout",
    "accumulate",
    "accumulate_elements",
    "apply_count_weighted",
    "count_weighted_average",
    "count_weighted_mean",
    "decode_update",
    "encode_update",
    "is_submodel_reply",
    "sparsify",
]
