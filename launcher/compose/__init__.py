"""Composition: from what the user typed (overrides, a run file) to validated runs, each with its Plan.

Owns the override grammar and sweeps (overrides), run files (runfile), the schema and conf/'s choices
(schema, catalog), Hydra's compose call (runs), value checks (validate, ranges) and the layout of a config
as a Plan (layout). Imports core/, dataset checks and errors; never the Slurm adapter, submission, a
job's life, status or the commands. Only ``runs`` and ``overrides`` import Hydra.
"""
