"""The Slurm adapter: every Slurm command the launcher runs, and every Slurm answer it reads.

``client`` runs sinfo, squeue, sacct, scontrol, scancel and sbatch (with timeouts, one-line errors);
``output`` parses their answers; ``batch`` turns a run into sbatch parameters and the batch script; ``fit``
says whether a request can ever run on a partition; ``probes`` asks what the batch script's recovery steps need
to know of their job and its nodes, through one client.

Imports: core, errors.
"""
