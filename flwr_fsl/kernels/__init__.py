"""Hot loops: batched AES and numba kernels (hashing, DPF expansion, ring arithmetic).

This is the only package with numba code or per-block AES loops; everything above calls it.
"""
