"""Compose, plan and submit GPT training runs on Slurm (no torch here: see train/ for the training task)."""
