"""Niu's private set union, moved to :mod:`flwr_fsl.crypto.psu` (re-exported here unchanged).

The PSU core is shared: SFSL sums the clients' vectors with SecAgg, and Cui's basic protocol
(:mod:`flwr_fsl.families.ssa.union`) has the two SSA servers sum additive shares of them.
"""

from flwr_fsl.crypto.psu import (
    MAX_DOMAIN,
    MAX_FILTER,
    TAG_BLOOM,
    PSUParams,
    UnionReport,
    client_vector,
    reconstruct_union,
    union_report,
)

__all__ = [
    "MAX_DOMAIN",
    "MAX_FILTER",
    "TAG_BLOOM",
    "PSUParams",
    "UnionReport",
    "client_vector",
    "reconstruct_union",
    "union_report",
]
