"""Sphinx configuration of jobstate's documentation site.

The pages are Markdown (MyST); the API reference is rendered by autodoc from the
docstrings, so Django is set up with the demo project's settings before Sphinx imports
the package (models cannot be imported before ``django.setup()``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from jobstate import __version__  # noqa: E402

project = "django-jobstate"
author = "django-jobstate developers"
copyright = "django-jobstate developers"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: "#some-heading" links resolve to headings down to ### in every page; "{ref}" and
# "{doc}" roles, definition lists and ":::" fences are available to the pages.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]

# autodoc: members in source order, type hints in the description (the signatures stay
# readable on a narrow screen).
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_default_options = {"show-inheritance": True}

html_theme = "furo"
html_title = f"django-jobstate {version}"
html_static_path: list[str] = []


def setup(app: object) -> None:
    """The guides draw state machines as ``mermaid`` blocks and show crontab lines as
    ``cron`` blocks; Pygments knows neither, so both are shown as plain text (the
    diagrams read as text too) instead of failing the build with a highlighting warning."""
    from pygments.lexers.special import TextLexer

    for name in ("mermaid", "cron"):
        app.add_lexer(name, TextLexer)  # type: ignore[attr-defined]
