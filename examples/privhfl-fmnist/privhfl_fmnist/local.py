"""Run PrivHFL on ``flwr_fsl.testing.InProcessGrid`` (no Ray, no SuperLink).

The same ServerApp experiment (:func:`privhfl_fmnist.server_app.run_experiment`) and the same
ClientApp as ``flwr run``, with the nodes called one after the other in this process (messages
still cross the "wire" as Flower's protobuf encoding, so the byte counts are a deployment's).
Every node has the default node config (``partition-id``, ``num-partitions``); its
architecture comes from ``partition-id`` and the run config's ``archs``. The run config is the app's
``[tool.flwr.app.config]`` with ``--run-config`` on top::

    python -m privhfl_fmnist.local --clients 10 --run-config "answering='secure'"
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from flwr.common.config import get_fused_config_from_dir, parse_config_args

from flwr_fsl.testing import InProcessGrid
from privhfl_fmnist.client_app import app as client_app
from privhfl_fmnist.server_app import run_experiment

APP_DIR = Path(__file__).resolve().parents[1]


def app_run_config(overrides: list[str] | None = None) -> dict[str, Any]:
    """Return the app's run config with ``key=value`` overrides, as ``flwr run`` builds it.

    Raises
    ------
    ValueError
        If an override names a key the app's ``[tool.flwr.app.config]`` does not have.
    """
    return dict(get_fused_config_from_dir(APP_DIR, parse_config_args(overrides)))


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run the experiment on an in-process grid."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10, help="SuperNodes (data partitions)")
    parser.add_argument(
        "--run-config", action="append", help="key=value overrides, e.g. \"answering='secure'\""
    )
    parser.add_argument("--verbose", action="store_true", help="show Flower's per-round log")
    args = parser.parse_args(argv)
    if not args.verbose:
        flwr_logger = logging.getLogger("flwr")
        flwr_logger.setLevel(logging.WARNING)
    config = app_run_config(args.run_config)
    run_experiment(InProcessGrid(client_app, args.clients, config), config)


if __name__ == "__main__":
    main()
