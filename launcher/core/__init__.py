"""The contract the launcher and the training tasks share (docs/design-contract.md): the config's typed shape
(config), the run's Plan as plan.json holds it (plan), a run directory's files (rundir, damage, privacy), the run's
record of events as types (events, failures) and read as attempts (attempt_log), the rows of metrics.jsonl as types
(metrics), each completed run's forecast beside what it measured (measured), the run root as an index of runs, its
records written and read (run_index), checkpoints' layout and size (checkpoints), heartbeats and the node-local
folder they live in (nodelocal), the preemption signal and Slurm's KillWait (preemption), a user's request that a
job save and stop (stop_request), the dataset layout, the GPU table (gpus), and how a process imports torch
(startup).

launcher/train/ imports only this package from the launcher, so it imports only itself, the standard library,
omegaconf and yaml: never torch, Hydra, submitit or another launcher package.

Imports: none.
"""
