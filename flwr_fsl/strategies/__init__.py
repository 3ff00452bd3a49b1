"""Server-side strategies (Flower Message API), all on one round engine."""

from flwr_fsl.core.engine import PhasedStrategy, RoundState
from flwr_fsl.core.traffic import RoundTraffic
from flwr_fsl.families.secagg.strategy import SecAggFedAvg
from flwr_fsl.families.sesa.strategy import SesaFedAvg
from flwr_fsl.families.sfsl.strategy import SFSLFedSubAvg
from flwr_fsl.families.ssa.aggregation_strategy import SSASettings, TwoServerAggregation
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.strategy import SecureFedSubAvg
from flwr_fsl.families.topk.strategy import FedSubAvg
from flwr_fsl.families.width.strategy import WidthFedAvg

__all__ = [
    "FedSubAvg",
    "PhasedStrategy",
    "RoundState",
    "RoundTraffic",
    "SFSLFedSubAvg",
    "SSASettings",
    "SecAggFedAvg",
    "SecureFedSubAvg",
    "SecureRowFedSubAvg",
    "SesaFedAvg",
    "TwoServerAggregation",
    "WidthFedAvg",
]
