"""Status: what is known of runs, read from their directories and Slurm, for the status commands.

``index`` is the run root as an index of runs (records, listing, lookup by name or prefix), ``job_state``
each run's Slurm state told in the run's own words, ``scaling`` the speed and scaling figures of
``launcher compare``.

Imports: core, slurm.
"""
