"""What a client trains and sends: top-k with error feedback, mega-elements, the sparse codec.

Everything here is numpy; :mod:`flwr_fsl.submodel.codec` is the one module that knows Flower's
record types (it defines the wire format).
"""

from flwr_fsl.submodel.aggregate import AggregationStats, count_weighted_average
from flwr_fsl.submodel.codec import (
    ARRAYS_KEY,
    FORMAT_VERSION,
    HEADER_KEY,
    SubmodelFormatError,
    decode_update,
    encode_update,
    is_submodel_reply,
)
from flwr_fsl.submodel.topk import TopKConfig, sparsify
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate, TensorUpdate

__all__ = [
    "ARRAYS_KEY",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "AggregationStats",
    "Encoding",
    "SubmodelFormatError",
    "SubmodelUpdate",
    "TensorUpdate",
    "TopKConfig",
    "count_weighted_average",
    "decode_update",
    "encode_update",
    "is_submodel_reply",
    "sparsify",
]
