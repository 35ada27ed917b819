"""What the commands share, beside them so that launcher/commands/ holds commands only: how a command finds the
runs it acts on (lookup: the run root option, a run by name or prefix, the check before a command changes
runs), how a search is summarised in tables (search_summary), a run's trained model as ``sample``, ``eval`` and
``export`` read it (trained_model), the plots of ``launcher compare --plot``
(scaling_plot, search_plot), and the output's fit to the terminal's width: tables narrowed, notes wrapped (width).
Nothing here prints; the commands do.

Imports: core, dataset, errors, search, status, train.
"""
