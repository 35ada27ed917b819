"""What a launch will ask git and Slurm, asked in threads before composing, so that they answer while Hydra
composes (a submission's two round trips off its critical path; launcher/submit/submitter.py then finds the
answers waiting: launcher/submit/freeze.py's source_state, launcher/slurm/client.py's partitions and site rules).
"""
from __future__ import annotations

from typing import List

from omegaconf import OmegaConf

from launcher.compose.catalog import beside, default_choices, option_path
from launcher.slurm.client import for_conf, slurm_conf_for
from launcher.submit.freeze import prefetch_source_state


def prefetch(overrides: List[str], source: bool = True) -> None:
    """Ask git (``source``: a submission freezes the code; a dry run does not) and Slurm what a launch will ask
    them, in threads, before composing: they answer while Hydra composes. Slurm is asked about the cluster the
    overrides name (``cluster=NAME``, else conf/'s default), its slurm.conf read from its file (in whichever config
    layer); should the composed run go elsewhere, the answer is not used."""
    if source:
        prefetch_source_state()
    named = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "cluster"]
    name = named[0] if named else default_choices()["cluster"]
    path = option_path("cluster", name) if isinstance(name, str) and "/" not in name else None
    if len(named) > 1 or path is None:
        return  # a sweep over clusters, or one the composition will refuse
    try:
        loaded = OmegaConf.load(path)
        slurm_conf, ssh = OmegaConf.select(loaded, "slurm_conf"), OmegaConf.select(loaded, "ssh")
    except Exception:  # noqa: BLE001 (a file the composition will say is wrong: nothing to ask)
        return
    if ssh is None and (slurm_conf is None or isinstance(slurm_conf, str)):  # a remote cluster is asked there
        for_conf(slurm_conf_for(name, beside(slurm_conf, path) if slurm_conf else None)).prefetch()
