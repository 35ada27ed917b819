#!/usr/bin/env bash
# The test command: set up (idempotent), bring the local Slurm cluster up, run pytest against it, and
# bring the cluster down again even when tests fail. Extra arguments go to pytest.
#
# The suite runs in $TEST_WORKERS pytest-xdist workers (default 3; 0 runs it in this process): the cluster
# tests mostly wait for Slurm, so they overlap. tests/conftest.py groups the tests that must share a worker
# (--dist loadgroup) and orders the groups (--no-loadscope-reorder); a test that needs the whole cluster
# takes it alone. --durations keeps the slowest tests in view.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh || exit 1
bash slurm/up.sh || exit 1
trap 'bash slurm/down.sh' EXIT
source slurm/env.sh
WORKERS=${TEST_WORKERS:-3}
PARALLEL=()
((WORKERS > 0)) && PARALLEL=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "${PARALLEL[@]}" "$@"
