"""mkdocs hook: README.md lives outside the site, so mkdocs does not check its links; this hook does.

Every relative link in README.md must name a file or folder of the repository, and a `page.md#anchor` link an
anchor that mkdocs' table of contents gives one of that page's headings. A broken one is a warning, which
`mkdocs build --strict` (make docs, CI) turns into a failed build.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from markdown.extensions.toc import slugify

log = logging.getLogger("mkdocs.hooks.readme_links")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def anchors(page: Path) -> set[str]:
    """The heading ids of a Markdown page (outside code fences), as the toc extension writes them."""
    out, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := HEADING.match(line)):
            text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
            out.add(slugify(text, "-"))
    return out


def broken_links(readme: Path) -> list[str]:
    """Each relative link of ``readme`` whose file, folder or heading anchor does not exist."""
    bad = []
    for target in LINK.findall(readme.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        where = (readme.parent / path) if path else readme
        if not where.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            bad.append(f"{target} (no heading with anchor #{anchor} in {path or readme.name})")
    return bad


def on_pre_build(config, **kwargs):
    readme = Path(config.config_file_path).parent / "README.md"
    for bad in broken_links(readme):
        log.warning("README.md links to %s", bad)
