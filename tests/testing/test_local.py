"""``python -m flwr_fsl.testing.local``: an app's components and run config on InProcessGrid."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.testing.local import app_components, app_run_config, main

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{package}"
version = "1.0.0"

[tool.flwr.app]
publisher = "flwr-fsl"

[tool.flwr.app.components]
serverapp = "{package}.server_app:app"
clientapp = "{package}.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 2
label = "default"
"""

SERVER_APP = """\
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    nodes = sorted(grid.get_node_ids())
    for _ in range(int(context.run_config["num-server-rounds"])):
        messages = [Message(RecordDict({"arrays": ArrayRecord()}), n, "train") for n in nodes]
        replies = list(grid.send_and_receive(messages))
        parts = sorted(int(r.content["m"]["partition"]) for r in replies)
        print(f"label={context.run_config['label']} partitions={parts}")
"""

CLIENT_APP = """\
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    metrics = MetricRecord({"partition": int(context.node_config["partition-id"])})
    return Message(RecordDict({"m": metrics}), reply_to=msg)
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Iterator[Path]:
    package = "local_toy_app"
    (tmp_path / "pyproject.toml").write_text(PYPROJECT.format(package=package))
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "server_app.py").write_text(textwrap.dedent(SERVER_APP))
    (tmp_path / package / "client_app.py").write_text(textwrap.dedent(CLIENT_APP))
    yield tmp_path
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_run_config_is_the_apps_with_overrides(app_dir: Path) -> None:
    assert app_run_config(app_dir) == {"num-server-rounds": 2, "label": "default"}
    assert app_run_config(app_dir, ["num-server-rounds=1 label='x'"]) == {
        "num-server-rounds": 1,
        "label": "x",
    }
    with pytest.raises(ValueError):
        app_run_config(app_dir, ["no-such-key=1"])


def test_main_runs_the_apps_server_against_its_clients(
    app_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([str(app_dir), "--clients", "3", "--run-config", "label='override'"])
    out = capsys.readouterr().out.splitlines()
    assert out == ["label=override partitions=[0, 1, 2]"] * 2


def test_components_must_be_a_server_app_and_a_client_app(app_dir: Path) -> None:
    pyproject = app_dir / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("server_app:app", "server_app:main"))
    with pytest.raises(ConfigurationError, match="not a ServerApp and a ClientApp"):
        app_components(app_dir)
    pyproject.write_text(pyproject.read_text().replace("server_app:main", "server_app"))
    with pytest.raises((ConfigurationError, ValueError)):
        app_components(app_dir)
