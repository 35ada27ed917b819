"""The pre-flight forecast of a composed run: will it fit its GPUs, how fast will it go, how does it scale,
and what to change when it does not fit (``launcher plan``, and the gate every launch passes).

Imports composition (to try the changes it suggests), core/, the Slurm adapter (a partition's GPU type) and
errors; never submission, a job's life, status, the CLI or a command.
"""
