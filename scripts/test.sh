#!/usr/bin/env bash
# The test command: set up (idempotent), bring the local Slurm cluster up, run pytest against it, and
# bring the cluster down again even when tests fail. Extra arguments go to pytest.
#
# The suite runs in $TEST_WORKERS pytest-xdist workers (default 5; 0 runs it in this process): the cluster tests
# mostly wait for Slurm, so they overlap. tests/conftest.py hands out the groups of tests that must share a worker
# and the long ones first; a test that needs a whole cluster has one of its own. --durations keeps the slowest in
# view. The tiers, their times and the CI budget: docs/development.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/setup.sh || exit 1
bash slurm/up.sh || exit 1
trap 'bash slurm/down.sh' EXIT
source slurm/env.sh
# Where PYTHONDONTWRITEBYTECODE is set (this project's CI image), no process writes the checkout's bytecode, and
# each of the suite's ~600 CLI processes compiled the modules it imports again (20-50 ms of CPU each): compile them once.
.venv/bin/python -m compileall -q launcher >/dev/null
WORKERS=${TEST_WORKERS:-5}
PARALLEL=()
((WORKERS > 0)) && PARALLEL=(-n "$WORKERS" --dist loadgroup)
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 "${PARALLEL[@]}" "$@"
