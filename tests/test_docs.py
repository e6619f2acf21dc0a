"""The documentation: docs/api.md matches the docstrings, and the links between the docs resolve."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")),
         *sorted((ROOT / "examples").glob("*.md"))]


def test_api_docs_up_to_date(capsys):
    """python -m tools api-docs --check: docs/api.md is what the generator writes from linrec's docstrings."""
    pytest.importorskip("triton")  # the reference documents linrec.impl.triton
    from tools import api_docs

    code = api_docs.main(["--check"])
    assert code == 0, "docs/api.md is stale; run python -m tools api-docs\n" + capsys.readouterr().out


def test_api_docs_deterministic():
    pytest.importorskip("triton")
    from tools import api_docs

    text = api_docs.render()
    assert text == api_docs.render()
    assert " at 0x" not in text  # no memory addresses from default values


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    """Every relative link of a markdown page, and every absolute link into this repository's main
    branch, names a file or folder of the repository."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        repository = re.match(r"https://github\.com/linrec/linrec/(?:blob|tree)/main/(.*)", target)
        if repository:  # an absolute link into this repository (the README's, for PyPI)
            target = str(ROOT / repository.group(1))
        elif re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file, _, fragment = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{page.relative_to(ROOT)}: broken link {target}"
        if fragment and path.suffix == ".md":
            assert fragment in anchors(path), f"{page.relative_to(ROOT)}: no heading for {target}"


def anchors(page):
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    headings = re.findall(r"^#+\s+(.*)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_readme_links_are_absolute():
    """The README's links and images are absolute URLs: relative ones break on PyPI."""
    readme = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        assert target.startswith("https://"), target


def test_citation_version_matches_package():
    """CITATION.cff names the version the package reports."""
    namespace = {}
    exec((ROOT / "python" / "linrec" / "_version.py").read_text(encoding="utf-8"), namespace)
    citation = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert re.search(r"^version: ([^\s]+)$", citation, re.M).group(1) == namespace["__version__"]
