"""The suite's own scheduling rule (tests/conftest.py): a cluster test module that uses the SSH site (``remote_site``,
one sshd port for the whole suite) and groups its tests with an ``xdist_group`` mark names the SSH site's group,
``remote_site``; under another group its tests would run in a second worker that starts a second sshd on that port,
and every test of the site would fail at its set-up."""
from __future__ import annotations

import re

from support.helpers import REPO

MARK = re.compile(r"""xdist_group\(\s*(?:name\s*=\s*)?["']([^"']+)["']""")


def test_every_module_that_uses_the_ssh_site_is_in_its_group():
    wrong = {}
    for path in sorted((REPO / "tests" / "cluster").rglob("test_*.py")):
        text = path.read_text()
        groups = set(MARK.findall(text))
        if "remote_site" in text and groups - {"remote_site"}:
            wrong[path.relative_to(REPO).as_posix()] = sorted(groups)
    assert not wrong, f"group these modules as xdist_group('remote_site'): {wrong}"
