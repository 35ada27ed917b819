"""The commands, one module each with ``configure(parser)`` and ``main(args)``: the only layer that prints and
the only one (with launcher/cli.py) that may import another command. The CLI imports a command's module
only when that command runs; torch (launcher/train/) only inside the commands that need it.

Imports: compose, core, dataset, errors, forecast, job, remote, search, service, slurm, status, submit, train, views.
"""
