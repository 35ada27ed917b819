"""``python -m launcher.train RUN_DIR``: one rank of a run, without submitit (torchrun, tests, debugging).

Rank and world come from torchrun-style variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or Slurm's; with neither, a world of one.
"""
import argparse

from launcher.core.startup import long_lived_imports


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m launcher.train", description=__doc__)
    parser.add_argument("run_dir", help="a run directory made by the launcher (config.yaml, plan.json)")
    args = parser.parse_args()
    with long_lived_imports():
        from launcher.train.task import run  # lazy: ``--help`` answers without importing torch
    run(args.run_dir)


if __name__ == "__main__":
    main()
