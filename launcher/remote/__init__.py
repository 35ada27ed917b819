"""Clusters reached over SSH: the system's OpenSSH client with one ControlMaster per cluster (ssh.py), the
launcher's own code shipped once per content hash (ship.py), and on the cluster's side the same launcher run
with the cluster's interpreter (agent.py), its answers read back as JSON.

The commands import it.

Imports: compose, core, dataset, errors, job, slurm, status, submit.
"""
