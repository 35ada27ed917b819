"""The pre-flight forecast of a composed run: will it fit its GPUs, how fast will it go, how does it scale,
and what to change when it does not fit (``launcher plan``, and the gate every launch passes).

It composes the changes it suggests, to try them, and asks the Slurm adapter for a partition's GPU type.

Imports: compose, core, errors, slurm.
"""
