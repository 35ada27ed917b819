#!/usr/bin/env bash
# Install everything this project needs on a Debian machine, idempotently:
#   - the Debian packages of a local Slurm cluster (slurmctld, slurmd, slurm-client, slurmdbd, munge,
#     mariadb-server), and those of the tests' SSH site (tests/support/sshd_site.py): openssh-server, and acl to let
#     its user reach the interpreter; and chromium, the browser the web console's tests drive (tests/cluster/
#     test_console.py, through Playwright, which may not download one); and strace, with which
#     scripts/bench_bringup.py counts a rank's file-system calls;
#   - a virtual environment in .venv with the project and its extras for training and tests ([dev,train]), torch
#     pinned exactly first ($TORCH_VERSION, default 2.13.0, whose CPU wheel lies on local disk; the extra's loose
#     torch>=2.9 alone pulls a CUDA build). Its interpreter is $PYTHON if set, else Debian's own python3 (with
#     python3-venv) where it is 3.10 or newer, else python3 on PATH. Debian builds its python3 with LTO and links it
#     statically; a shared-library build such as pyenv's runs the suite's Python (every rank's `import torch`, every
#     CLI call) with 5-11% more CPU (docs/development.md).
# A second run finds everything in place and returns in about a second.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VENV=$ROOT/.venv
APT_PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server openssh-server acl chromium python3-venv
  strace)

fail() { echo "scripts/setup.sh: $*" >&2; exit 1; }
at_least_310() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; }

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "== installing Debian packages: ${missing[*]}"
  sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || fail "need root (or sudo) to install ${missing[*]}"
    sudo=(sudo)
  fi
  # policy-rc.d keeps the packages' own services from starting: slurm/up.sh and the tests run their own
  # daemons. Where the machine has none (a container image usually does), one stands for the install.
  export DEBIAN_FRONTEND=noninteractive
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    "${sudo[@]}" sh -c 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
    trap '"${sudo[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  "${sudo[@]}" apt-get update -q >/dev/null || fail "apt-get update failed"
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || fail "apt-get install ${missing[*]} failed"
fi

if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  at_least_310 /usr/bin/python3 && PYTHON=/usr/bin/python3
fi
at_least_310 "$PYTHON" || fail "$PYTHON must be Python >= 3.10 (set PYTHON=...)"
if [[ ! -x $VENV/bin/python ]]; then
  echo "== creating $VENV"
  "$PYTHON" -m venv "$VENV" || fail "could not create a virtual environment with $PYTHON"
fi

# Reinstall only when the dependency declarations changed.
stamp=$VENV/.setup-stamp
want=$(cat "$ROOT/pyproject.toml" "$0" | sha256sum | cut -d' ' -f1)-$TORCH_VERSION
if [[ $(cat "$stamp" 2>/dev/null) != "$want" ]]; then
  echo "== installing torch==$TORCH_VERSION and the project into $VENV"
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" || fail "pip could not install torch==$TORCH_VERSION"
  "$VENV/bin/pip" install -q -e "$ROOT[dev,train]" || fail "pip could not install the project"
  echo "$want" >"$stamp"
fi
"$VENV/bin/python" -c 'import torch, submitit, hydra, numpy' || fail "the environment in $VENV is broken; remove it and rerun"
echo "== setup done: $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'), slurm $(dpkg-query -W -f='${Version}' slurm-client)"
