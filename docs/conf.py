"""Sphinx configuration: `make docs` builds this folder into build/docs/ (strict: -W -n).

The pages are Markdown (MyST); the CLI reference is generated from `trtbuild.cli.parser`
(sphinx-argparse) and the API reference from the docstrings of `trtbuild.api`
(autodoc, napoleon for Google-style sections). Nothing is fetched from other sites.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the package from this checkout, installed or not
sys.path.insert(0, str(ROOT / "docs" / "_ext"))  # policy_fields: the schema as a table

from trtbuild import __version__  # noqa: E402

project = "trtbuild"
author = "trtbuild contributors"
copyright = "2026, trtbuild contributors"
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "policy_fields",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_ext"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # `[...](policy.md#every-field)` resolves to a heading's slug

smartquotes = False  # `--no-cache` stays two hyphens, quotes stay as typed
default_role = "literal"  # docstrings write `name` for code, as Markdown does
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"trtbuild {release}"
nitpick_ignore = [
    ("py:class", "Path"),
    ("py:class", "pathlib.Path"),
    ("py:class", "onnx.ModelProto"),
    ("py:class", "Cache"),
    ("py:class", "Report"),
    ("py:class", "collections.abc.Mapping"),  # the standard library: no intersphinx offline
    ("py:class", "Mapping"),
    ("py:class", "PrecisionSummary"),  # internal types a result carries for the renderers
    ("py:class", "Front"),
    ("py:class", "collections.abc.Callable"),
    ("py:class", "collections.abc.Iterable"),
    ("py:class", "Trial"),  # tune's progress callback gets the search's own trial
    ("py:class", "SearchResult"),  # the search behind a TuneResult (what the CLI logs)
    ("py:class", "Backend"),  # Literal aliases (trtbuild.results): their values are in the text
    ("py:class", "Objective"),
]
