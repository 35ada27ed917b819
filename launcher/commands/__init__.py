"""The commands, one module each with ``configure(parser)`` and ``main(args)``: the only layer that prints and
the only one (with launcher/cli.py) that may import another command. What the web console does too (stop, resume,
delete, the runs listing, a run's description, the clusters survey) is launcher/service/'s: those commands parse
the flags and print its records. The CLI imports a command's module only when that command runs; torch
(launcher/train/) only inside the commands that need it; ``ui`` serves the console (launcher/console/).

Imports: compose, console, core, dataset, errors, forecast, job, remote, search, service, slurm, status, submit, \
train, views.
"""
