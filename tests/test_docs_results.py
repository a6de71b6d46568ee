"""The docs hold together: every relative link resolves, and the README's findings agree with the
results index, which owns every verdict.

Links: each ``[text](target)`` and ``![alt](target)`` of README.md and docs/**/*.md (outside
code) that is not a URL must name an existing file or folder; an ``#anchor`` into a .md file (or
within the same file) must name one of its headings, slugged as GitHub slugs them. Findings:
README's table of findings repeats rows of docs/results.md's index (finding, verdict, number,
page); each must equal the index row of the same finding, and each verdict is one of the index's
few words.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
INDEX = ROOT / "docs" / "results.md"
PAGES = ROOT / "docs" / "results"
VERDICTS = {"holds", "does not hold", "partly", "inconclusive"}
HEADER = ["finding", "verdict", "number", "page"]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"(`+).*?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text without fenced blocks and inline code, where a link is not a link."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lowercased, every character that is
    not a letter, a digit, a mark, ``-``, ``_`` or a space dropped, spaces made ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = [c for c in text if c in "-_ " or c.isalnum() or unicodedata.category(c)[0] == "M"]
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor of a markdown file, repeats numbered as GitHub numbers them."""
    seen: Counter[str] = Counter()
    found = set()
    for match in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(match.group(2))
        found.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:


def broken(path: Path, target: str) -> str | None:
    """Why a relative link of ``path`` does not resolve, or None."""
    file, _, anchor = target.partition("#")
    dest = (path.parent / file).resolve() if file else path
    if not dest.exists():
        return f"no file {dest}"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"no heading #{anchor} in {dest}"
    return None


def test_slug_follows_github() -> None:
    assert slug("Heads vs head dimension, and calibrating the allocator (Yu et al., 2025, §6.1)") \
        == "heads-vs-head-dimension-and-calibrating-the-allocator-yu-et-al-2025-61"
    assert slug("Does the prior save trials?") == "does-the-prior-save-trials"
    assert slug("`--rope-dim R`: a layout") == "--rope-dim-r-a-layout"


def test_the_docs_have_links() -> None:
    """The extraction finds links (a broken regex would pass the test below)."""
    assert INDEX in DOCS and sum(len(links(p)) for p in DOCS) > 100
    assert any("#" in t for t in links(ROOT / "docs" / "guide" / "data.md"))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    problems = [f"{t}: {why}" for t in links(path) if (why := broken(path, t))]
    assert not problems, f"{path.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    page.write_text("# Title here\n\n[ok](#title-here) [self](a.md#title-here) [gone](b.md) "
                    "[bad](#nowhere) `[code](c.md)`\n")
    assert [t for t in links(page) if broken(page, t)] == ["b.md", "#nowhere"]


# --- the README's findings and the index ----------------------------------------------------


def cells(row: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def findings(path: Path) -> list[dict[str, str]]:
    """The rows of the file's first table headed finding | verdict | number | page, each with
    its page's resolved path (and anchor) under ``target``."""
    lines = path.read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("|")
                 and cells(line) == HEADER)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = dict(zip(HEADER, cells(line), strict=True))
        (target,) = LINK.findall(row["page"])
        file, _, anchor = target.partition("#")
        row["target"] = f"{(path.parent / file).resolve()}#{anchor}"
        rows.append(row)
    return rows


def test_the_index_is_one_row_per_finding() -> None:
    rows = findings(INDEX)
    assert len(rows) >= 13
    assert len({r["finding"] for r in rows}) == len(rows), "a finding is listed twice"
    assert {r["verdict"] for r in rows} <= VERDICTS, "verdicts outside the index's vocabulary"
    linked = {r["target"].split("#")[0] for r in rows}
    pages = {str(p.resolve()) for p in PAGES.glob("*.md")}
    assert linked == pages, "every page has a finding and every finding a page"


def test_pages_are_not_named_as_folders() -> None:
    """One rule: a page is docs/results/NAME.md; the experiments' data are in folders beside
    them, never of a page's name."""
    folders = {p.name for p in PAGES.iterdir() if p.is_dir()}
    assert not folders & {p.stem for p in PAGES.glob("*.md")}


def test_readme_findings_agree_with_the_index() -> None:
    index = {r["finding"]: r for r in findings(INDEX)}
    readme = findings(ROOT / "README.md")
    assert 6 <= len(readme) <= 10
    for row in readme:
        assert row["finding"] in index, f"README's finding is not in the index: {row['finding']}"
        owner = index[row["finding"]]
        for key in ("verdict", "number", "target"):
            assert row[key] == owner[key], (
                f"README says {key} {row[key]!r} for {row['finding']!r}; the index says "
                f"{owner[key]!r}")
