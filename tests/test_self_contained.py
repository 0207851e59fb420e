"""The repository is self-contained: it cites no file a user does not have, and every ``docs/...md``
page (and section anchor) it cites exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

# Files outside the repository that earlier versions cited (names split so this file does not match).
OUTSIDE = re.compile("|".join(re.escape(name) for name in (
    "PAPERS" + ".md", "FINDINGS" + ".md", "DESIGN" + ".md", "../" + "shared", "/work/" + "shared")))
DOCS_CITATION = re.compile(r"(?<![\w/.-])docs/(\w[\w./-]*?\.md)(?:#([\w-]+))?")
RELATIVE_LINK = re.compile(r"\]\((?!https?:|#|/)([\w./-]+?\.md)(?:#([\w-]+))?\)")
SKIP_PARTS = {".git", ".venv", "cache", "reports", "__pycache__", "node_modules"}


def tracked_files() -> list[Path]:
    """The repository's tracked files (every file outside build and cache folders without git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True,
                             timeout=30).stdout
        files = [REPO / name for name in out.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        files = [p for p in REPO.rglob("*") if p.is_file() and not SKIP_PARTS & set(p.relative_to(REPO).parts)]
    return [p for p in files if p.is_file()]


def text_files() -> dict[Path, str]:
    texts = {}
    for path in tracked_files():
        try:
            texts[path] = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # images and other binary files
    return texts


def github_anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it.

    >>> github_anchor("A4 Task, agent, reward and data")
    'a4-task-agent-reward-and-data'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a markdown page's headings (headings inside fenced code blocks do not count)."""
    found, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.add(github_anchor(line.lstrip("#")))
    return found


def citations(texts: dict[Path, str]) -> list[tuple[str, Path, str, str | None]]:
    """(where, the page cited, its anchor) of every ``docs/...md`` citation and every relative link
    between docs pages."""
    cited = []
    for path, text in texts.items():
        if path == THIS:  # its docstrings and examples are not citations
            continue
        where = str(path.relative_to(REPO))
        for match in DOCS_CITATION.finditer(text):
            cited.append((where, REPO / "docs" / match.group(1), match.group(1), match.group(2)))
        if path.parent == REPO / "docs" and path.suffix == ".md":
            for match in RELATIVE_LINK.finditer(text):
                cited.append((where, path.parent / match.group(1), match.group(1), match.group(2)))
    return cited


def test_docs_pages_exist():
    for page in ("README.md", "paper_a_copes.md", "paper_b_molora.md", "prior_measurements.md", "suite_design.md"):
        assert (REPO / "docs" / page).is_file(), page


def test_every_cited_docs_page_and_anchor_exists():
    cited = citations(text_files())
    assert cited, "no docs/ citation found: the scan is broken"
    problems = []
    for where, page, name, anchor in cited:
        if not page.is_file():
            problems.append(f"{where}: cites {name}, which does not exist")
        elif anchor and anchor not in anchors(page):
            problems.append(f"{where}: cites {name}#{anchor}; its anchors are {sorted(anchors(page))}")
    assert not problems, "\n".join(problems)


def test_nothing_cites_files_outside_the_repository():
    hits = [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for path, text in text_files().items() if path != THIS for m in OUTSIDE.finditer(text)]
    assert not hits, "files outside the repository are cited (cite docs/ instead):\n" + "\n".join(hits)


def test_the_checks_catch_what_they_should(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n## A2 CoPES\n```\n# not a heading\n```\n")
    assert anchors(page) == {"title", "a2-copes"}
    text = "see docs/paper_a_copes.md#a2-copes and docs/missing.md, not xdocs/a.md; " + "PAPERS" + ".md A4"
    found = [(m.group(1), m.group(2)) for m in DOCS_CITATION.finditer(text)]
    assert found == [("paper_a_copes.md", "a2-copes"), ("missing.md", None)]
    assert OUTSIDE.search(text)


# A markdown link: [text](target) or [text](target#anchor); images and autolinks included.
MARKDOWN_LINK = re.compile(r"\]\(([^()\s]*)\)")
PAGES = ("README.md", "CONTRIBUTING.md")


def markdown_pages() -> list[Path]:
    return [REPO / name for name in PAGES] + sorted((REPO / "docs").glob("*.md"))


def broken_links(page: Path) -> list[str]:
    """Every relative link of ``page`` whose file is missing, or whose ``#anchor`` names no heading of
    the markdown page it points at (a bare ``#anchor`` points at ``page`` itself)."""
    problems, fenced = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for target in MARKDOWN_LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}:{number}: ({target})"
            if not file.exists():
                problems.append(f"{where}: {path} does not exist")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                problems.append(f"{where}: no heading of {file.relative_to(REPO)} has the anchor #{anchor}")
    return problems


def test_every_relative_link_of_the_pages_resolves():
    """README.md, CONTRIBUTING.md and docs/*.md: each relative link names an existing file and, for a
    markdown page, an existing heading anchor."""
    problems = [p for page in markdown_pages() for p in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_readme_anchor_citations_exist():
    """A citation of ``README.md#anchor`` or ``CONTRIBUTING.md#anchor`` anywhere (code docstrings
    included) names a heading that exists."""
    cite = re.compile(r"(?<![\w/.-])(README|CONTRIBUTING)\.md#([\w-]+)")
    problems = [f"{path.relative_to(REPO)}: {m.group(0)}"
                for path, text in text_files().items() if path != THIS and path.parent != REPO / "docs"
                for m in cite.finditer(text) if m.group(2) not in anchors(REPO / f"{m.group(1)}.md")]
    assert not problems, "\n".join(problems)


def test_the_link_check_catches_a_broken_link(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n## Real heading\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/a.md#real-heading) [self](#top) [gone](docs/b.md) [bad](docs/a.md#nope)\n"
                    "```\n[in code](nowhere.md)\n```\n# Top\n[web](https://example.org/x.md)\n")
    problems = broken_links(page)
    assert len(problems) == 2, problems
    assert "docs/b.md does not exist" in problems[0] and "#nope" in problems[1]


def test_every_docs_page_is_reachable():
    """Each docs page is linked from docs/README.md; the pages the README was split into (running, cost,
    results, reproducibility, gpu, sandbox) are linked from the README too."""
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md" and f"]({p.name}" not in index]
    assert not unlisted, f"docs/README.md does not link {unlisted}"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for name in ("running", "cost", "results", "reproducibility", "gpu", "sandbox"):
        assert f"](docs/{name}.md" in readme, name


def test_readme_is_short_and_keeps_its_generated_sections():
    """The README reads in a few screens (issue 35: <= ~150 lines) and, like docs/results.md, keeps the
    markers notebook 99 rewrites between (claims.write_results_pages)."""
    from copes_lib import claims

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 160, len(readme.splitlines())
    for page in ("README.md", claims.RESULTS_PAGE):
        text = (REPO / page).read_text(encoding="utf-8")
        assert claims.README_START in text and claims.README_END in text, page
