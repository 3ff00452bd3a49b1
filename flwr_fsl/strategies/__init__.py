"""Server-side strategies (Flower Message API)."""

from flwr_fsl.strategies.fedsubavg import FedSubAvg
from flwr_fsl.strategies.index import SecureRowFedSubAvg
from flwr_fsl.strategies.secure import SecureFedSubAvg
from flwr_fsl.traffic import RoundTraffic

__all__ = ["FedSubAvg", "RoundTraffic", "SecureFedSubAvg", "SecureRowFedSubAvg"]
