"""The callable a run's job pickles and every Slurm task runs (launcher/job/task.py).

It lives in the launcher, not in launcher/train/, so that submitting pickles a reference to this torch-free class
instead of importing launcher/train/ (and torch) on the login node. The task imports launcher/train/ when it starts.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from launcher.core import failures, preemption
from launcher.core.events import Fault
from launcher.core.startup import long_lived_imports
from launcher.core.store import CREDENTIALS_FILE
from launcher.job.secret_store import inject, run_credentials, secrets_dir


class NoTorch(RuntimeError):
    """The tasks' Python cannot import torch: the cluster's environment was installed without the ``[train]``
    extra (as a laptop's is). Its message is the whole cause, in the user's words: every node and every try
    would fail the same way, so the attempt ends with what to do and is not retried."""

    short = "no torch"
    fault = Fault.NO_TORCH
    whole_cause = True  # the record's error is the message alone, without the exception's name

    def __init__(self, python: str) -> None:
        super().__init__(f"the tasks' Python {python} has no torch: install 'slurm-gpt-launcher[train]' there "
                         "(cluster.python, or cluster.container.python in a container)")


def training():
    """launcher/train/'s ``run``, imported here on the task; :class:`NoTorch` where this Python has no torch."""
    try:
        with long_lived_imports():
            from launcher.train.task import run  # lazy: keeps torch, omegaconf, numpy out of start-up
    except ModuleNotFoundError as err:
        if err.name != "torch":  # torch there but broken, or another module missing: its own error says more
            raise
        raise NoTorch(sys.executable) from None
    return run


class TrainTask:
    """Train the run in ``run_dir`` on this Slurm task.

    On preemption or an approaching time limit (USR2), every rank saves and the batch script requeues the job
    (launcher/train/interrupt.py), the signal heard from the task's first line (launcher/core/preemption.py,
    launcher/job/task.py). The requeued tasks resume from the run's newest complete checkpoint.

    Before launcher/train/ is imported, the user's secrets (launcher/job/secret_store.py) are injected into this
    process's environment from the store whose path was fixed at submission; only the variables' names are printed.
    """

    def __init__(self, secrets_store: str | None = None) -> None:
        # Resolved on the submitting host ($LAUNCHER_HOME there); a path, never a value.
        self.secrets_store = secrets_store or str(secrets_dir())

    def __call__(self, run_dir: str) -> None:
        names: list[str] = []
        try:
            try:
                names = inject(Path(self.secrets_store))
                captured = run_credentials(Path(self.secrets_store), Path(run_dir))
                if captured.is_file():  # the object store's, as the launch found them (launcher/core/store.py)
                    os.environ[CREDENTIALS_FILE] = str(captured)
                if names:
                    print(f"launcher: injected secrets: {', '.join(names)}", flush=True)
                run = training()
            except BaseException as err:  # before training: launcher/train/task.py records its own failures
                failures.record(Path(run_dir), err, None, names)
                raise
            run(run_dir, secrets=names)
        finally:
            # The work is over (finished, saved for a requeue, or failed): a time-limit signal from now on means
            # nothing. Ignored, not handled: Python puts the default action (death) back while it shuts down, and
            # a rank killed by a late USR2 after the run finished made a completed attempt read as failed.
            signal.signal(preemption.SIGNAL, signal.SIG_IGN)
