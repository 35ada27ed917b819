"""The README a newcomer reads in five minutes, and docs whose links and named paths lead somewhere."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

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


# A path of the repository's as a page or a docstring names it: not part of a longer path (``~/.cache/launcher/``).
REPO_PATH = re.compile(r"(?<![\w./~$-])((?:launcher|scripts|tests|slurm|conf|docs)/[\w/.-]*[\w/])")
SOURCES = [*PAGES, *sorted(REPO.glob("launcher/**/*.py")), *sorted(REPO.glob("scripts/*.py"))]


def prose_of(path: Path) -> str:
    """What a reader reads as text: a page whole; of a module, its docstrings and comments (not its strings, which
    may be keys that look like paths)."""
    if path.suffix != ".py":
        return path.read_text()
    source = path.read_text()
    tree = ast.parse(source)
    docs = [ast.get_docstring(node) or "" for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    comments = [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT]
    return "\n".join(docs + comments)


def named_paths(text: str) -> list:
    """The repository paths ``text`` names: a file (``launcher/train/data.py``) or a folder (``launcher/train/``);
    a name with a placeholder in capitals (``conf/cluster/NAME.yaml``) is a pattern, not a path."""
    return [path for path in REPO_PATH.findall(text) if not re.search(r"[A-Z]{2}", path) and "*" not in path
            and ("." in path.rsplit("/", 1)[-1] or path.endswith("/"))]


def test_the_path_check_sees_a_moved_module_and_passes_over_other_paths():
    text = "see launcher/compose/runs.py and `launcher/train/`, ~/.cache/launcher/runs/, conf/cluster/NAME.yaml"
    assert named_paths(text) == ["launcher/compose/runs.py", "launcher/train/"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_page_or_a_docstring_names_exists(source):
    missing = sorted({path for path in named_paths(prose_of(source)) if not (REPO / path).exists()})
    assert not missing, f"{source.relative_to(REPO)} names {missing}, which do not exist"


LAYOUT_ROW = re.compile(r"^\| `launcher/(\w+)/`[^|]* \| (.*?) \| [^|]* \|$", re.MULTILINE)


def test_every_module_docs_layout_names_in_a_packages_row_exists():
    """A bare name in backticks in a package's row of docs/layout.md (``attempt_log``) is a module of it."""
    missing = []
    for package, owns in LAYOUT_ROW.findall((REPO / "docs" / "layout.md").read_text()):
        for name in re.findall(r"`([a-z_]+)`", owns):
            folder = REPO / "launcher" / package
            if not ((folder / f"{name}.py").exists() or (folder / name).is_dir()):
                missing.append(f"{package}/{name}")
    assert not missing, f"docs/layout.md names modules that do not exist: {missing}"
