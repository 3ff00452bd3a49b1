"""The SSA servers' key check on the native checked driver and on its Python fallback (issue 26).

:func:`~flwr_fsl.crypto.dpf.evaluate_batch` with proofs runs in one GIL-free numba call when
OpenSSL loads (:mod:`flwr_fsl.kernels.vdpf_eval`) and on the Python driver otherwise
(``FLWR_FSL_NATIVE_AES=0``). Both must give the same shares and the same key-check digests
(version 2 and version 3) on any number of threads, and both must drop a forgery.
"""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.crypto import dpf
from flwr_fsl.families.ssa import verify
from flwr_fsl.families.ssa.protocol import SSAInputError, SSAServer
from flwr_fsl.families.ssa.verify import new_digest_key, same_digest
from flwr_fsl.kernels.aes import native_aes
from tests.families.ssa import forge
from tests.families.ssa.test_key_check import _forgery, _s1_seed
from tests.families.ssa.test_threads import _uploads
from tests.helper.test_helper import bind, make_params, twin

needs_native = pytest.mark.skipif(
    native_aes(bytes(16)) is None, reason="OpenSSL's libcrypto cannot be loaded natively here"
)
_KEY = new_digest_key()


def _round(params, uploads, threads: int, key: bytes | None):  # type: ignore[no-untyped-def]
    servers = [SSAServer(params, p, threads=threads, digest_key=key) for p in (0, 1)]
    digests = []
    for c, up in enumerate(uploads):
        d0 = servers[0].add_client(c, up.public_part, up.master_seeds[0])
        d1 = servers[1].add_client(c, up.public_part, up.master_seeds[1], expect=d0)
        assert d0 is not None and same_digest(d0, d1)
        digests.append(d0[:32])  # the value check's part draws a fresh seed
    return servers[0].share().tobytes(), servers[1].share().tobytes(), digests


@needs_native
@pytest.mark.parametrize("key", [None, _KEY], ids=["v2", "v3"])
def test_native_and_python_drivers_give_the_same_shares_and_digests(monkeypatch, key) -> None:
    monkeypatch.setattr(verify, "_SEGMENT_POINTS", 40)  # many segments, on several threads
    monkeypatch.setattr(verify, "_KEYED_SEGMENT_POINTS", 40)
    params = make_params(1, weighted=False, epoch=0, verify=True, value_check="off")
    uploads = _uploads(params, 3)
    native = {t: _round(params, uploads, t, key) for t in (1, 2)}
    monkeypatch.setattr(dpf, "_NATIVE_AES", False)
    python = {t: _round(params, uploads, t, key) for t in (1, 2)}
    assert native[1] == native[2] == python[1] == python[2]


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("name", ["two points in a bin", "count 2", "tampered proof word"])
def test_forgeries_are_caught_on_both_drivers(monkeypatch, native: bool, name: str) -> None:
    monkeypatch.setattr(dpf, "_NATIVE_AES", native)
    params = make_params(1, weighted=False, epoch=0, verify=True)
    plan, tamper = _forgery(params, name)
    upload, public = forge.forged_upload(params, plan, 5, twin().public_key(), bind(params), tamper)
    s0 = SSAServer(params, 0, threads=2, digest_key=_KEY)
    s1 = SSAServer(params, 1, threads=2, digest_key=_KEY)
    digest0 = s0.add_client(5, public, upload.master_seed)
    with pytest.raises(SSAInputError, match="key check failed"):
        s1.add_client(5, public, _s1_seed(plan, params, tamper), expect=digest0)
    assert s1.num_clients == 0 and not np.asarray(s1.share()).any()
