"""The documentation stays true to the code: docs/cli.md is what the parser generates, the generator walks
every command a parser has, the README stays a short guide, relative links in README and docs/ lead
to files and headings that exist, and every results plot is shown by its page."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from benchmarks.cli_reference import REGENERATE, commands, load_parser, reference

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 25_000  # bytes: a guide read in ten minutes; reference material lives in docs/
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def test_cli_reference_is_current():
    committed = (ROOT / "docs" / "cli.md").read_text()
    assert committed == reference(load_parser()), f"docs/cli.md is stale: regenerate it with `.venv/bin/{REGENERATE}`"


def _toy_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy", description="a toy CLI")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run | it", aliases=["go"])
    run.add_argument("target", nargs="+")
    run.add_argument("-o", "--output", required=True, help="where it goes")
    run.add_argument("--budget", type=float, default=10.0, help="seconds (default: %(default)s)")
    run.add_argument("--fresh", action="store_true", help="start over")
    nested = sub.add_parser("data", help="data commands").add_subparsers(dest="data_command", required=True)
    nested.add_parser("show", help="show the data", epilog="example: toy data show")
    return parser


def test_reference_walks_nested_and_aliased_commands():
    parser = _toy_parser()
    names = [c.name for c in commands(parser)]
    assert names == ["toy", "toy run", "toy data", "toy data show"]
    page = reference(parser)
    for heading in ("## toy run", "## toy data", "## toy data show"):
        assert f"\n{heading}\n" in page
    assert "Also: `go`." in page
    assert "| `-o, --output OUTPUT` (required) | where it goes |  |" in page
    assert "| `--budget BUDGET` | seconds (default: 10.0) | `10` |" in page
    assert "| `--fresh` | start over |  |" in page
    assert "| `target [target ...]` |" in page
    assert "run \\| it" in page  # a pipe in help text would split the table row
    assert "example: toy data show" in page


def test_readme_is_a_short_guide():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} B, over {README_LIMIT} B: move reference material to docs/"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _missing_links(results: bool) -> list[str]:
    """Relative links of README and docs/*.md whose file (or heading, for a link with #anchor) does not
    exist: those into docs/results/ when `results`, the others otherwise."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        for target, anchor in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve() if target else page
            if path.is_relative_to(ROOT / "docs" / "results") != results:
                continue
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
                missing.append(f"{page.relative_to(ROOT)} → {target}{'#' + anchor if anchor else ''}")
    return missing


def test_relative_links_resolve():
    missing = _missing_links(results=False)
    assert not missing, "links to missing files: " + "; ".join(missing)


def test_links_into_results_pages_resolve():
    if not (ROOT / "docs" / "results").is_dir():
        pytest.skip("docs/results/ (the generated results pages) is not in this checkout")
    missing = _missing_links(results=True)
    assert not missing, "links to missing results pages: " + "; ".join(missing)


def test_every_results_plot_is_shown_by_its_page():
    """A plot in docs/results is embedded by the page of the same name, or, without one, by a page beside it."""
    if not (ROOT / "docs" / "results").is_dir():
        pytest.skip("docs/results/ (the generated results pages) is not in this checkout")
    unshown = []
    for plot in sorted((ROOT / "docs" / "results").rglob("*.png")):
        same = plot.with_suffix(".md")
        pages = [same] if same.exists() else sorted(plot.parent.glob("*.md"))
        if not any(f"]({plot.name})" in page.read_text() for page in pages):
            unshown.append(str(plot.relative_to(ROOT)))
    assert not unshown, "plots no page shows: " + ", ".join(unshown)
