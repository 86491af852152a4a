"""mkdocs hooks for the links mkdocs itself does not check: README.md's, and docs pages' links to source files.

- README.md lives outside the site: every relative link in it must name a file or folder of the repository,
  and a `page.md#anchor` link an anchor that mkdocs' table of contents gives one of that page's headings.
- A docs page may link to a file of the repository outside docs/ (`[kernels/abi.py](../kernels/abi.py)`), which
  works where the Markdown is read on its own; that file must exist, and on the site, which does not hold it,
  the link becomes its plain text.

A broken link is a warning, which `mkdocs build --strict` (make docs, CI) turns into a failed build.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from markdown.extensions.toc import slugify

log = logging.getLogger("mkdocs.hooks.readme_links")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PAGE_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")  # not images
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
URL = re.compile(r"[a-z][a-z0-9+.-]*:")  # http:, https:, mailto: ...
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def anchors(page: Path) -> set[str]:
    """The heading ids of a Markdown page (outside code fences), as the toc extension writes them."""
    out, fence = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := HEADING.match(line)):
            text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
            out.add(slugify(text, "-"))
    return out


def broken_links(readme: Path) -> list[str]:
    """Each relative link of ``readme`` whose file, folder or heading anchor does not exist."""
    bad = []
    for target in LINK.findall(readme.read_text(encoding="utf-8")):
        if URL.match(target):
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


def on_page_markdown(markdown, page, config, files, **kwargs):
    """Links that leave docs/ for a file of the repository: checked, then written as their plain text."""
    docs = Path(config.docs_dir).resolve()
    page_dir = (docs / page.file.src_path).parent

    def one(m):
        text, target = m.group(1), m.group(2)
        path = target.partition("#")[0]
        if URL.match(target) or not path:
            return m.group(0)
        where = (page_dir / path).resolve()
        if where == docs or docs in where.parents:
            return m.group(0)  # a docs page or file: mkdocs checks it
        if not where.exists():
            log.warning("Doc file '%s' links to '%s', which is not a file of the repository", page.file.src_path,
                        target)
            return m.group(0)
        return text

    out, last = [], 0
    for fence in FENCE.finditer(markdown):  # code blocks are left alone
        out.append(PAGE_LINK.sub(one, markdown[last:fence.start()]))
        out.append(fence.group(0))
        last = fence.end()
    out.append(PAGE_LINK.sub(one, markdown[last:]))
    return "".join(out)
