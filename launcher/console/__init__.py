"""launcher ui: a local web console over the record the CLI reads (serve.py where it serves, app.py its pages and
API, readers.py what they show, actions.py the buttons; static/ the page and uPlot).

Beside launcher/commands in the layers: both front ends sit on launcher/service/, which stops, resumes and deletes
runs, lists them, describes one and surveys the clusters; the console answers in the same words the commands
print, and imports no command (``launcher ui``, launcher/commands/ui.py, starts it).

Imports: core, errors, forecast, remote, service, slurm, status, views.
"""
