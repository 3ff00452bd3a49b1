"""Hot loops: batched AES and numba kernels (hashing, DPF expansion, ring arithmetic).

This is the only package with numba code or per-block AES loops; everything above calls it.
Importing it first keys numba's on-disk cache of every kernel by one digest of this package's
sources (:mod:`flwr_fsl.kernels._cache`), so an edit of one kernel file never leaves stale
machine code in a cached caller in another file.
"""

from pathlib import Path

from flwr_fsl.kernels._cache import install

install(Path(__file__).parent)
