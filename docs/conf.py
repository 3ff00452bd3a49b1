"""Sphinx configuration of the flwr_fsl documentation (``make docs``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

project = "flwr_fsl"
author = "flwr_fsl contributors"
copyright = "flwr_fsl contributors"
release = "0.1.0"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
    "numpydoc",
]

# Markdown pages (myst) and the example notebooks, rendered with the outputs stored in them: the
# docs build never runs a notebook (helper runs, data sets and training take minutes).
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]

html_theme = "furo"
html_title = "flwr_fsl"

# The API reference: numpydoc renders the library's numpy-style docstrings.
autodoc_member_order = "bysource"
autodoc_typehints = "none"
autodoc_default_options = {"members": True, "show-inheritance": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False


nitpicky = False
