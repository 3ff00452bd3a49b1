"""Client-side Flower mods: wrap an unchanged ``@app.train`` function."""

from flwr_fsl.core.state import StateSlot
from flwr_fsl.families.secagg.mod import secagg_mod
from flwr_fsl.families.sesa.mod import sesa_mod
from flwr_fsl.families.sfsl.mod import PerturbedRows
from flwr_fsl.families.ssa.index_mod import PrivateRows
from flwr_fsl.families.ssa.mixed_mod import PrivateTables
from flwr_fsl.families.ssa.mod import ssa_mod
from flwr_fsl.families.ssa.mod_base import ProtocolMod, SSARound
from flwr_fsl.families.topk.mod import topk_mod
from flwr_fsl.families.width.mod import width_mod

__all__ = [
    "PerturbedRows",
    "PrivateRows",
    "PrivateTables",
    "ProtocolMod",
    "SSARound",
    "StateSlot",
    "secagg_mod",
    "sesa_mod",
    "ssa_mod",
    "topk_mod",
    "width_mod",
]
