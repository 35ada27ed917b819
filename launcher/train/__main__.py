"""``python -m launcher.train RUN_DIR``: one rank of a run, without submitit (torchrun, tests, debugging).

Rank and world come from torchrun-style variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or Slurm's; with neither, a world of one.
"""
import argparse

from launcher.train.task import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m launcher.train", description=__doc__)
    parser.add_argument("run_dir", help="a run directory made by the launcher (config.yaml, plan.json)")
    run(parser.parse_args().run_dir)


if __name__ == "__main__":
    main()
