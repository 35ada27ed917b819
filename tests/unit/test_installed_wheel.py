"""The wheel a site user installs (``wheel`` in tests/conftest.py): what it holds and what it requires. Installed
and run: tests/cluster/test_installed_wheel.py."""
from __future__ import annotations

import email.parser
import zipfile

from packaging.requirements import Requirement


TOP_LEVEL = {"launcher"}  # nothing with a generic name at the top of site-packages


def test_the_wheel_holds_one_top_level_package_and_the_config_groups(wheel):
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist() if ".dist-info" not in name}
    assert tops == TOP_LEVEL


def test_the_wheel_requires_torch_only_under_the_train_extra(wheel):
    """A laptop that only submits must not download torch: the wheel's metadata asks for it under ``[train]``
    (and ``[dev]``, through ``[train]``), never in the base install."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    requires = [Requirement(line) for line in metadata.get_all("Requires-Dist")]
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"train", "dev", "hf"} <= extras
    (hf,) = [r for r in requires if r.name == "transformers"]  # loading an export, never making one
    assert [extra for extra in sorted(extras | {""}) if hf.marker.evaluate({"extra": extra})] == ["hf"]
    (torch,) = [r for r in requires if r.name == "torch"]
    assert str(torch.specifier) == ">=2.9"
    assert [extra for extra in sorted(extras | {""}) if torch.marker.evaluate({"extra": extra})] == ["train"]
    base = {r.name for r in requires if r.marker is None}
    assert base == {"submitit", "hydra-core", "omegaconf", "pyyaml", "tabulate", "numpy", "tokenizers", "pyarrow",
                    "optuna", "starlette", "uvicorn"}
    (itself,) = [r for r in requires if r.name == metadata["Name"] and r.marker.evaluate({"extra": "dev"})]
    assert "train" in itself.extras
    with zipfile.ZipFile(wheel) as archive:  # the console's page, script and charting library, with its licence
        static = {n.rsplit("/", 1)[1] for n in archive.namelist() if n.startswith("launcher/console/static/")}
    assert static == {"index.html", "console.js", "console.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"}
