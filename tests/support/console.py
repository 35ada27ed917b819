"""The web console as the tests use it: ``launcher ui`` started as a user starts it, and the system's Chromium
driven by Playwright (which downloads no browser here: Debian's chromium is launched by its path)."""
from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from pathlib import Path

from support.helpers import REPO

CHROMIUM = Path("/usr/bin/chromium")


@contextlib.contextmanager
def serving(env: dict, *flags: str):
    """``launcher ui FLAGS`` with ``env``; yields the URL it printed (with its token)."""
    server = subprocess.Popen([sys.executable, "-m", "launcher", "ui", *flags], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = server.stdout.readline()
        url = re.search(r"http://\S+", line)
        assert url, line + (server.stdout.read() if server.poll() is not None else "")
        yield url.group(0)
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextlib.contextmanager
def chromium():
    """A headless Chromium (``--no-sandbox``: the suite runs as root)."""
    from playwright.sync_api import sync_playwright  # lazy: only the console's tests drive a browser

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def base_of(url: str) -> str:
    """The console's address without its token."""
    return url.split("/?", 1)[0]
