"""DPF evaluation from several threads at once (S1 serves concurrent sessions in gRPC threads).

A ``cryptography`` cipher context shared between threads fails with "Already borrowed" or
mixes batches; the MMO ciphers are therefore per thread. Every thread must get exactly the
serial result.
"""

from __future__ import annotations

import threading

import numpy as np

from flwr_fsl.crypto.dpf import evaluate_batch, generate_keys_batch


def test_concurrent_full_domain_evaluations_equal_the_serial_ones() -> None:
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(4):
        m = 64
        bits = rng.integers(6, 11, size=m)
        alphas = rng.integers(0, 2**62, size=m, dtype=np.uint64) % (2 ** bits.astype(np.uint64))
        betas = rng.integers(0, 2**63, size=(m, 3), dtype=np.uint64)
        batches.append(generate_keys_batch(alphas, betas, bits)[0])
    expected = [evaluate_batch(keys)[0] for keys in batches]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(15):
                got = evaluate_batch(batches[i])[0]
                if not np.array_equal(got, expected[i]):
                    raise AssertionError(f"thread {i}: wrong evaluation")
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
