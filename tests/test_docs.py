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
    """Every relative link of a markdown page names a file or folder of the repository."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)}: broken link {target}"


def test_readme_images_are_absolute():
    """Images in the README load from absolute URLs: relative ones break on PyPI."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme):
        assert target.startswith("https://"), target


def test_citation_version_matches_package():
    """CITATION.cff names the version the package reports."""
    namespace = {}
    exec((ROOT / "python" / "linrec" / "_version.py").read_text(encoding="utf-8"), namespace)
    citation = (ROOT / "CITATION.cff").read_text(encoding="utf-8")
    assert re.search(r"^version: ([^\s]+)$", citation, re.M).group(1) == namespace["__version__"]
