"""Run a Flower app's ServerApp and ClientApp on ``InProcessGrid`` (no Ray, no SuperLink).

The app's own ``[tool.flwr.app.components]`` (ServerApp and ClientApp) and
``[tool.flwr.app.config]`` run config, as ``flwr run`` reads them, with the nodes called one after
the other in this process: messages still cross the "wire" as Flower's protobuf encoding, so the
byte counts are a deployment's. Every node has the default node config (``partition-id``,
``num-partitions``); ``--run-config`` overrides go on top of the app's config::

    python -m flwr_fsl.testing.local examples/secagg-mnist --run-config "num-server-rounds=3"

The app's folder goes first on ``sys.path``, so its package needs no installation.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.config import get_fused_config_from_dir, get_project_config, parse_config_args
from flwr.serverapp import ServerApp

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.testing.grid import InProcessGrid

__all__ = ["app_components", "app_run_config", "main", "run_app"]


def app_run_config(app_dir: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Return the app's run config with ``key=value`` overrides, as ``flwr run`` builds it.

    Parameters
    ----------
    app_dir : str | Path
        The app's folder (the one holding its ``pyproject.toml``).
    overrides : list[str], optional
        ``--run-config`` strings, e.g. ``["num-server-rounds=3 dataset='fashion'"]``.

    Raises
    ------
    ValueError
        If an override names a key the app's ``[tool.flwr.app.config]`` does not have.
    """
    return dict(get_fused_config_from_dir(Path(app_dir), parse_config_args(overrides)))


def _load(reference: str, app_dir: Path) -> Any:
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"{app_dir}: component {reference!r} is not 'module:attribute'")
    if str(app_dir) not in sys.path:
        sys.path.insert(0, str(app_dir))
    return getattr(importlib.import_module(module_name), attribute)


def app_components(app_dir: str | Path) -> tuple[ServerApp, ClientApp]:
    """Import the app's ServerApp and ClientApp named in ``[tool.flwr.app.components]``.

    Raises
    ------
    ValueError
        If the ``pyproject.toml`` is not a valid Flower app's (Flower's check: e.g. no
        components).
    ConfigurationError
        If a component is not ``module:attribute`` or they are not a ServerApp and a ClientApp.
    """
    folder = Path(app_dir).resolve()
    components = get_project_config(folder)["tool"]["flwr"]["app"]["components"]
    server = _load(str(components["serverapp"]), folder)
    client = _load(str(components["clientapp"]), folder)
    if not isinstance(server, ServerApp) or not isinstance(client, ClientApp):
        raise ConfigurationError(f"{folder}: the components are not a ServerApp and a ClientApp")
    return server, client


def run_app(app_dir: str | Path, num_nodes: int, run_config: Mapping[str, Any]) -> None:
    """Run the app's ServerApp against ``num_nodes`` copies of its ClientApp in this process."""
    server, client = app_components(app_dir)
    config = dict(run_config)
    grid = InProcessGrid(client, num_nodes, config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    server(grid, context)


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and run the app on an in-process grid."""
    parser = argparse.ArgumentParser(
        prog="python -m flwr_fsl.testing.local", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("app_dir", type=Path, help="the app's folder (with its pyproject.toml)")
    parser.add_argument("--clients", type=int, default=10, help="SuperNodes (data partitions)")
    parser.add_argument(
        "--run-config", action="append", help='key=value overrides, e.g. "num-server-rounds=3"'
    )
    parser.add_argument("--verbose", action="store_true", help="show Flower's per-round log")
    args = parser.parse_args(argv)
    if not args.verbose:
        flwr_logger = logging.getLogger("flwr")
        flwr_logger.setLevel(logging.WARNING)
        # FedAvg's note that client-side evaluation is off (several apps' default) is expected.
        flwr_logger.addFilter(lambda r: "fraction_evaluate is set to 0.0" not in r.getMessage())
    config = app_run_config(args.app_dir, args.run_config)
    if args.verbose and "log-level" in config:  # the examples' key (flwr_fsl.experiment.logs)
        config["log-level"] = "info"
    run_app(args.app_dir, args.clients, config)


if __name__ == "__main__":
    main()
