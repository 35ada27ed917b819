"""The README a newcomer reads in five minutes, and docs whose links lead somewhere."""
from __future__ import annotations

import re

import pytest

from support.helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_stays_short_and_keeps_its_two_commands_and_the_site_recipe():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "    bash scripts/demo.sh" in text and "    bash scripts/test.sh" in text
    assert "## At your site" in text and "launcher clusters default mysite" in text


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_names_a_file_that_exists(page):
    missing = [target for target in LINK.findall(page.read_text())
               if not target.startswith(("http://", "https://")) and not (page.parent / target).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to {missing}"


def test_every_docs_page_is_in_the_readmes_table():
    table = (REPO / "README.md").read_text()
    unlisted = [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in table]
    assert not unlisted, f"docs pages the README's table does not list: {unlisted}"
