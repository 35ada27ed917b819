"""Submission: a launch from the login node. Checks the cluster for every run of a sweep, makes each run's
directory, freezes the code its tasks will import (freeze, git), and submits it (launch).

It is given the composed runs, and the commands print what it returns.

Imports: compose, core, errors, job, slurm.
"""
