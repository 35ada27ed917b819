"""What both front ends do, below them: ``launcher``'s commands (launcher/commands/) print it for a terminal, the
web console (launcher/console/) answers it to the browser. Stopping, resuming and deleting runs (stop, resume,
delete), the runs listing (runs), a run's description (describe), the clusters survey and the user's jobs in a
cluster's queue (clusters), as functions taking typed arguments and returning typed records (dataclasses), or
raising a one-line LaunchError; a record's words (``line()``, ``lines()``) are the ones both front ends show.
Nothing here prints, parses arguments or knows of either front end.

Imports: compose, core, errors, job, remote, search, slurm, status, submit, views.
"""
