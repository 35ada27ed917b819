"""The one error type the launcher reports to users.

Every mistake a user can make on the command line (a misspelled key, an
unknown model, a GPU count that cannot be laid out on the cluster's nodes) is
raised as :class:`LaunchError` with a one-line message; the CLI prints it as
``error: <message>`` and exits with status 2, never with a traceback.
"""
from __future__ import annotations

from typing import Iterable


class LaunchError(Exception):
    """A user error, carrying the one-line message shown to the user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or '' if none is close."""
    import difflib  # only for a mistake: not on every command's path

    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
