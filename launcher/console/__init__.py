"""launcher ui: a local web console over the record the CLI reads (serve.py starts it, app.py its pages and API,
readers.py what they show, actions.py the buttons; static/ the page and uPlot).

Above launcher/commands in the layers; what it shows and does goes through launcher/service/, as ``launcher runs``,
``describe``, ``clusters``, ``stop``, ``resume`` and ``delete`` do.

Imports: core, errors, forecast, remote, service, slurm, status, views.
"""
