"""Submission: a launch from the login node. Every check that can refuse it, for a launch, a dry run and a plan
alike (checks); then each run's directory, the code its tasks will import frozen (freeze, git), and the run
submitted (submitter).

It is given the composed runs, and the commands print what it returns.

Imports: compose, core, errors, forecast, job, slurm, status.
"""
