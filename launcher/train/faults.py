"""Faults on purpose, for fault drills and the tests of the recovery loop: ``LAUNCHER_FAULT`` in the
environment of the submitting shell (sbatch passes it on to every task).

    LAUNCHER_FAULT=raise@5          every rank raises an error of the code's own at step 5
    LAUNCHER_FAULT=raise@5:1        only rank 1 does
    LAUNCHER_FAULT=preflight:NODE   the device check fails on node NODE (launcher/train/preflight.py)
    LAUNCHER_FAULT=stuck:NODE       the device check on node NODE never returns (a hung GPU or driver)
    LAUNCHER_FAULT=pace@0.1         every step takes 0.1 s longer (a run of known length, for time limits)

Unset (always, outside drills), nothing here does anything.
"""
from __future__ import annotations

import os
import time
from typing import Optional

from launcher.core.events import Fault

VARIABLE = "LAUNCHER_FAULT"


class InjectedFault(RuntimeError):
    """The error a drill asked for: an error of the code's own, which recovery must not retry."""

    fault = Fault.CODE


def _spec() -> str:
    return os.environ.get(VARIABLE, "")


def at_step(step: int, rank: int) -> None:
    """Raise the drill's error when training reaches ``step`` on a chosen rank, or slow every step."""
    kind, _, where = _spec().partition("@")
    if kind == "pace" and where:
        time.sleep(float(where))
    if kind != "raise" or not where:
        return
    at, _, only = where.partition(":")
    if int(at) == step and (not only or int(only) == rank):
        raise InjectedFault(f"fault injected by {VARIABLE}={_spec()} at step {step}")


def failing_node(kind: str = "preflight") -> Optional[str]:
    """The node whose preflight must fail (``stuck``: never return), if a drill says so."""
    said, _, node = _spec().partition(":")
    return node if said == kind and node else None
