"""Composition: from what the user typed (overrides, a run file) to validated runs, each with its Plan.

Owns the override grammar and sweeps (overrides), run files (runfile), the schema and conf/'s choices
(schema, catalog), Hydra's compose call (runs), value checks (validate, ranges) and the layout of a config
as a Plan (layout). The Slurm adapter only for what a run asks of Slurm and the checks of a job name;
only ``runs`` and ``overrides`` import Hydra.

Imports: core, dataset, errors, slurm.
"""
