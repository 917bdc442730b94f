"""MkDocs hook: the repository's README.md is the site's "Overview" page (generated, not copied,
so there is one text), and links between the README and the pages resolve both on GitHub and
in the site: `docs/NAME.md` from the README, `../README.md` from a page."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
PAGE = "readme.md"


def on_files(files: Files, config: Any, **_: Any) -> Files:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, PAGE, content=text))
    return files


# a link to a file of the repository that is not a page: its path, as text, in the site
_REPO_LINK = re.compile(r"\[([^\]]+)\]\((?:\.\./)?((?:bench|examples|tests|\.ci)/[^)#]*)[^)]*\)")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri == PAGE:  # the README's links into docs/
        markdown = re.sub(r"\]\(docs/", "](", markdown)
    else:
        markdown = markdown.replace("](../README.md", f"]({PAGE}")
    return _REPO_LINK.sub(r"\1 (`\2` in the repository)", markdown)
