"""A run's life inside its Slurm job: what each task runs (entry), the job's script and pickled task submitted and
run on every task (task), how an attempt's end is judged (attempts) and told when the user or Slurm ended it
(endings), the batch script's recovery steps around srun (recovery), the run's code copied once to every node for
the ranks to import (stage) and the tasks' environment unpacked there for them to run (stage_env), whether a failed
attempt is retried and without which nodes (policy, pure), the requeue on Slurm's signal (requeue), resubmission
(submission), and the secrets injected into the tasks (secret_store).

This is the in-job path: it never loads Hydra, composition, submission, the CLI or a command
(tests/unit/test_architecture.py checks what it loads). launcher/train/ is imported by a task when it starts,
and a search's hook by a trial's last step.

Imports: core, errors, search, slurm, train.
"""
