"""Compose, plan and submit GPT training runs on Slurm (no torch here: see launcher/train/ for the training task)."""

__version__ = "0.1.0"  # the one home of the version: pyproject.toml reads it from here
