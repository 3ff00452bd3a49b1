"""topk-mnist: the model, the data of a partition, training and evaluation.

The MNIST task (:data:`Net`, :func:`load_data`, :func:`train`, :func:`test`, ...) is
:mod:`flwr_fsl.models.mnist_task`, shared with ``examples/secagg-mnist``; re-exported here.
"""

from __future__ import annotations

from flwr_fsl.models import set_torch_threads
from flwr_fsl.models.mnist_task import Net, load_data, load_test_data, test, train

__all__ = ["Net", "load_data", "load_test_data", "test", "train"]

# Clients share few cores in simulation: one torch thread per ClientApp.
set_torch_threads(1)
