"""Small torch models shared by examples, notebooks and benchmarks.

Move weights in and out of Flower records with Flower's own helpers:
``ArrayRecord(model.state_dict())`` and
``model.load_state_dict(arrays.to_torch_state_dict())``.
"""

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
