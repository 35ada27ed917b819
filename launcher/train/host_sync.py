"""Where the host waits for the device. On a GPU the loop only enqueues work, and the host runs ahead (preparing
the next batches) until it reads a value the device computes: ``.item()``, ``.tolist()``, a synchronize. Each such
read waits for everything queued before it, so a read per step would leave the GPU idle while the host catches up.

Every read of the training loop goes through :func:`read` (and a wait for queued work through :func:`wait`), so
that they stay where the loop waits anyway (a metrics row, an evaluation, a save) or every few seconds of steps
(launcher/train/guard.py: ``Checks``), and so that a test on CPU can count them (:data:`reads`).
"""
from __future__ import annotations

from typing import Any

import torch

reads = 0  # the host's reads of device values in this process (a test compares it with the steps trained)


def read(value: torch.Tensor) -> Any:
    """``value``'s numbers on the host, as ``Tensor.tolist`` gives them (a number for a scalar): a host sync."""
    global reads
    reads += 1
    return value.tolist()


def wait(device: torch.device) -> None:
    """Wait until the work queued on ``device`` is done (nothing to wait for on CPU, where work is not queued)."""
    global reads
    if device.type == "cuda":
        reads += 1
        torch.cuda.synchronize(device)
