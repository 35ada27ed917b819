"""Submission: a launch from the login node. Checks the cluster for every run of a sweep, makes each run's
directory, freezes the code its tasks will import (freeze, git), and submits it (launch).

Imports composition (the composed runs it is given), the Slurm adapter, ``job.submission``, status's run
index and core/; never the CLI or a command, which print what it returns.
"""
