#!/usr/bin/env bash
# The test command: set up (idempotent), bring the local Slurm cluster up, run pytest against it, and
# bring the cluster down again even when tests fail. Extra arguments go to pytest.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh || exit 1
bash slurm/up.sh || exit 1
trap 'bash slurm/down.sh' EXIT
source slurm/env.sh
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
