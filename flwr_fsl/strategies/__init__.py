"""Server-side strategies (Flower Message API), all on one round engine."""

from flwr_fsl.core.engine import PhasedStrategy, RoundState
from flwr_fsl.core.traffic import RoundTraffic
from flwr_fsl.families.secagg.strategy import SecAggFedAvg
from flwr_fsl.families.sesa.strategy import SesaFedAvg
from flwr_fsl.families.sfsl.strategy import SFSLFedSubAvg
from flwr_fsl.families.topk.strategy import FedSubAvg
from flwr_fsl.families.width.strategy import WidthFedAvg
from flwr_fsl.strategies.index import SecureRowFedSubAvg
from flwr_fsl.strategies.secure import SecureFedSubAvg
from flwr_fsl.strategies.two_server import SSASettings, TwoServerAggregation

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
