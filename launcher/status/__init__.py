"""Status: what is known of runs, read from their directories and Slurm, for the status commands.

The run root as an index of runs (records, listing, lookup by name or prefix) is launcher/core/run_index.py,
with the code that writes run records; here is what is read: ``job_state`` each run's Slurm state told in the
run's own words, ``scaling`` the speed and scaling figures of
``launcher compare``.

Imports: core, slurm.
"""
