"""What a client trains and sends, and how the server averages it: layouts, top-k, the codec.

Everything here is numpy and Flower-free: :mod:`flwr_fsl.submodel.codec` defines the sparse
wire format as a header plus named arrays, and :mod:`flwr_fsl.families.ssa.records` puts them into
Flower records (``encode_update`` / ``decode_update`` live there).
"""

from __future__ import annotations

from flwr_fsl.submodel.aggregate import (
    AggregationStats,
    accumulate,
    accumulate_elements,
    apply_count_weighted,
    count_weighted_average,
    count_weighted_mean,
)
from flwr_fsl.submodel.codec import (
    ARRAYS_KEY,
    FORMAT_VERSION,
    HEADER_KEY,
    SubmodelFormatError,
    decode_dense,
    decode_parts,
    encode_parts,
)
from flwr_fsl.submodel.layout import (
    ElementUpdate,
    FlatLayout,
    Layout,
    RowLayout,
    TensorSlice,
    WidthLayout,
)
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec
from flwr_fsl.submodel.topk import TopKConfig, sparsify
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate, TensorUpdate

__all__ = [
    "ARRAYS_KEY",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "AggregationStats",
    "ElementUpdate",
    "Encoding",
    "FlatLayout",
    "Layout",
    "ModelTables",
    "RowLayout",
    "RowMap",
    "SubmodelFormatError",
    "SubmodelUpdate",
    "TableSpec",
    "TensorSlice",
    "TensorUpdate",
    "TopKConfig",
    "WidthLayout",
    "accumulate",
    "accumulate_elements",
    "apply_count_weighted",
    "count_weighted_average",
    "count_weighted_mean",
    "decode_dense",
    "decode_parts",
    "encode_parts",
    "sparsify",
]
