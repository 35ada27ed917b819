"""Stop training at the first step whose loss or gradient norm is not a finite number.

No check of the config can see this coming: whether a learning rate diverges depends on the model, the data
and the schedule together. But once one update carries a NaN or an infinity, every weight is poisoned:
each later step is wasted GPU time, and a checkpoint saved after it is worthless (a resume from it diverges
again). So every step is checked before its metrics and checkpoint are written, and the attempt ends with
the step and the value named, as an error of the run's own: launcher/job/recovery.py does not retry it, since
the same seed, data and settings diverge the same way again.
"""
from __future__ import annotations

import math

import torch

from launcher.core.events import Fault

# The words `runs` shows beside FAILED (the exception's ``short``, recorded by launcher/core/failures.py).
SHORT = {"loss": "loss", "gradient norm": "grad norm"}


class NonFiniteError(RuntimeError):
    """A loss or gradient norm that is NaN or infinite: the run diverged (or its data or model is broken)."""

    fault = Fault.CODE  # the same seed, data and settings diverge the same way again

    def __init__(self, what: str, value: float, step: int) -> None:
        super().__init__(f"{what} is {value} at step {step}: training diverged; lower train.lr, lengthen "
                         "train.warmup_steps or lower train.grad_clip")
        self.short = f"{SHORT[what]} {value}"


def check_finite(step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
    """Raise NonFiniteError if this step's loss (this rank's) or gradient norm (the same on every rank) is
    not finite. One host sync per step: the price of never saving a poisoned checkpoint."""
    values = torch.stack([loss.detach().float().reshape(()), grad_norm.detach().float().reshape(())])
    if bool(torch.isfinite(values).all()):
        return
    loss_value, norm_value = values.tolist()
    if not math.isfinite(loss_value):
        raise NonFiniteError("loss", loss_value, step)
    raise NonFiniteError("gradient norm", norm_value, step)
