"""SFSL's Flower records: the SecAgg instances its strategy and mod both name.

SFSL runs two SecAgg instances per round under :data:`~flwr_fsl.families.secagg.records.SECAGG_KEY`
(told apart by the record's ``instance`` field): the private set union, then the perturb phase
and the count-weighted rows round.
"""

from __future__ import annotations

__all__ = ["ROWS_INSTANCE", "SFSL_INSTANCES", "UNION_INSTANCE"]

UNION_INSTANCE = "union"
"""The SecAgg instance of the private set union (SFSL step 1)."""
ROWS_INSTANCE = "rows"
"""The SecAgg instance of the perturb phase and the count-weighted rows round (steps 2, 3)."""
SFSL_INSTANCES = (UNION_INSTANCE, ROWS_INSTANCE)
