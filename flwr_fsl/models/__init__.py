"""Models shared by examples, notebooks and benchmarks: small torch models, the MovieLens MF task.

The torch models (:mod:`.cnn`, :mod:`.width`, :mod:`.privhfl`, :mod:`.mnist_task`, :mod:`.din` —
the DIN-like CTR model of ``examples/recsys-movielens``) need the
``torch`` extra (``pip install "flwr_fsl[torch]"``); :mod:`.mf` is numpy only. The names below
are loaded on first use, so importing :mod:`flwr_fsl.models.mf` does not import torch.

Move weights in and out of Flower records with Flower's own helpers:
``ArrayRecord(model.state_dict())`` and
``model.load_state_dict(arrays.to_torch_state_dict())``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cnn import MnistCNN, evaluate, set_torch_threads, train_one
    from .width import WidthCNN, WidthMLP, calibrate_batch_norm

__all__ = [
    "MnistCNN",
    "WidthCNN",
    "WidthMLP",
    "calibrate_batch_norm",
    "evaluate",
    "set_torch_threads",
    "train_one",
]

_HOME = {
    "MnistCNN": "cnn",
    "evaluate": "cnn",
    "set_torch_threads": "cnn",
    "train_one": "cnn",
    "WidthCNN": "width",
    "WidthMLP": "width",
    "calibrate_batch_norm": "width",
}


def __getattr__(name: str) -> Any:
    """Load a torch model's module on first use (PEP 562)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value
