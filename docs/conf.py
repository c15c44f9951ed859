"""Sphinx configuration: Markdown pages through MyST, the default (alabaster) theme.

Built in CI with warnings as errors (`python -m sphinx -W --keep-going -b html docs OUT`), so a
broken cross-reference or heading anchor fails the build. Not MkDocs: it depends on PyPI's
filesystem-events package `watchdog`, which installs over this project's import package.
"""

project = "agent-watchdog"
author = "agent-watchdog contributors"
copyright = "agent-watchdog contributors"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# `[text](page.md#a-heading)` links resolve to heading anchors (GitHub's slugs), down to ####.
myst_heading_anchors = 4
# Pages show code blocks as written; an untagged block is plain text, never guessed as Python.
highlight_language = "none"
# Links to other sites are not checked while building (no network in CI); relative links between
# pages are, and a missing one is an error under -W.
html_theme = "alabaster"
html_title = "agent-watchdog"
html_static_path: list[str] = []
