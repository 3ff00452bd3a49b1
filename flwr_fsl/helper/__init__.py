"""The helper server S1 of the two-server protocols (Cui et al. 2023): service, gRPC, CLI, twin.

S0 is the Flower ServerApp; S1 is this non-colluding second server. Clients seal S1's material
to S1's pinned X25519 key (:mod:`flwr_fsl.crypto.sealing`), S0 relays it through a
:class:`HelperConnection` — :class:`HelperClient` (gRPC, to a ``flwr-fsl-helper`` process) or
:class:`InProcessHelper` (simulation; same bytes through the same
:class:`~flwr_fsl.helper.service.HelperService`).

**Threat model.** Two non-colluding servers; anyone on the network may call S1. S0 relays but
cannot read or alter S1's material (HPKE AEAD bound to session, round, round parameters,
purpose and parties, plus a hash of the public part); S1 learns only public parameters,
pseudorandom key material, the client ids of a round and its own additive share of the
aggregate. Each S0 connection is one session (an id and a secret S1 draws), so one helper
process serves many runs; ``flwr-fsl-helper`` requires an access token by default, and a session
answers only to its secret. See :mod:`flwr_fsl.helper.service` and
:mod:`flwr_fsl.helper.server`.
"""

from flwr_fsl.helper.connection import (
    HelperClient,
    HelperConnection,
    HelperHealth,
    HelperShare,
    InProcessHelper,
    verify_helper,
)
from flwr_fsl.helper.errors import (
    HelperAuthError,
    HelperError,
    HelperRequestError,
    HelperResourceError,
    HelperSessionLostError,
    HelperUnavailableError,
    WireFormatError,
)
from flwr_fsl.helper.limits import HelperLimits
from flwr_fsl.helper.server import start_server
from flwr_fsl.helper.service import HelperService
from flwr_fsl.helper.setup import (
    connect_helper,
    describe_helper,
    helper_settings,
    secure_helper,
)
from flwr_fsl.pinning import default_key_file, pinned_fingerprint

__all__ = [
    "HelperAuthError",
    "HelperClient",
    "HelperConnection",
    "HelperError",
    "HelperHealth",
    "HelperLimits",
    "HelperRequestError",
    "HelperResourceError",
    "HelperService",
    "HelperSessionLostError",
    "HelperShare",
    "HelperUnavailableError",
    "InProcessHelper",
    "WireFormatError",
    "connect_helper",
    "default_key_file",
    "describe_helper",
    "helper_settings",
    "pinned_fingerprint",
    "secure_helper",
    "start_server",
    "verify_helper",
]
