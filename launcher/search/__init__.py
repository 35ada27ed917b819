"""Searches: an Optuna study over a run's settings whose trials submit each other, so that nothing runs between them.

``launcher -m search=optuna search.trials=24 search.parallel=4 'train.lr=tag(log, interval(1e-4, 3e-3))'``:

* :mod:`launcher.search.space` reads the sweep overrides as a search space (Hydra's grammar, as its Optuna
  sweeper reads it) and names the points whose composition must succeed before anything is submitted;
* :mod:`launcher.search.study` keeps the study in ``RUN_ROOT/.sweeps/ID/``: its definition and Optuna's journal file;
* :mod:`launcher.search.trials` asks for the trials still owed and tells the study how a trial ended, under one lock;
* :mod:`launcher.search.start` is the launch (check every corner, make the study, submit the first trials);
* :mod:`launcher.search.hook` is the trial's last step: its job's batch script, on the host, reports the trial and
  submits the next ones (launcher/job/recovery.py calls it when the run's outcome is final).

Optuna is imported only here, and only when a search is used.

Imports: compose, core, errors, slurm, submit, train.
"""
