"""launcher ui: a local web console over the record the CLI reads (serve.py starts it, app.py its pages and API,
readers.py what they show, actions.py the buttons, which run the commands themselves; static/ the page and uPlot).

Above launcher/commands in the layers: its buttons are ``launcher stop``, ``resume`` and ``delete``.

Imports: commands, core, errors, forecast, remote, slurm, status, views.
"""
