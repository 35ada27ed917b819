"""Stop training at the first step whose loss or gradient norm is not a finite number.

No check of the config can see this coming: whether a learning rate diverges depends on the model, the data
and the schedule together. But once one update carries a NaN or an infinity, every weight is poisoned:
each later step is wasted GPU time, and a checkpoint saved after it is worthless (a resume from it diverges
again). So every step is checked before anything of it, or of a later step, is written (metrics, a checkpoint),
and the attempt ends with the step and the value named, as an error of the run's own: launcher/job/recovery.py
does not retry it, since the same seed, data and settings diverge the same way again.
"""
from __future__ import annotations

import math

import torch

from launcher.core.events import Fault
from launcher.train import host_sync

# The words `runs` shows beside FAILED (the exception's ``short``, recorded by launcher/core/failures.py).
SHORT = {"loss": "loss", "gradient norm": "grad norm"}


class NonFiniteError(RuntimeError):
    """A loss or gradient norm that is NaN or infinite: the run diverged (or its data or model is broken)."""

    fault = Fault.CODE  # the same seed, data and settings diverge the same way again

    def __init__(self, what: str, value: float, step: int) -> None:
        super().__init__(f"{what} is {value} at step {step}: training diverged; lower train.lr, lengthen "
                         "train.warmup_steps or lower train.grad_clip")
        self.short = f"{SHORT[what]} {value}"


class Checks:
    """The finiteness of every step, kept on the device: :meth:`note` marks the first step whose loss (this rank's)
    or gradient norm (the same on every rank) is not finite, without the host waiting for the device; :meth:`read`
    raises :class:`NonFiniteError` for it. The loop reads wherever it reads the device anyway (a metrics row, an
    evaluation, a save: so nothing of a poisoned step is written) and at the interrupt's cadence (a few seconds of
    steps, launcher/train/interrupt.py), so a NaN ends the attempt within that bound, naming the step it came at."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.first = torch.full((3,), math.nan, dtype=torch.float64, device=device)  # its step, loss, grad norm

    def note(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        values = torch.stack([torch.full((), float(step), dtype=torch.float64, device=self.device),
                              loss.detach().double().reshape(()), grad_norm.detach().double().reshape(())])
        new = ~torch.isfinite(values[1:]).all() & torch.isnan(self.first[0])
        self.first = torch.where(new, values, self.first)

    def read(self) -> None:
        step, loss, norm = host_sync.read(self.first)
        if math.isnan(step):
            return
        if not math.isfinite(loss):
            raise NonFiniteError("loss", loss, int(step))
        raise NonFiniteError("gradient norm", norm, int(step))
