#!/usr/bin/env bash
# Stop everything slurm/up.sh started, by pid, and leave nothing running. Harmless on a stopped cluster.
# Usage: slurm/down.sh [--dir DIR]   (or SLURM_LOCAL_DIR)
set -uo pipefail
while (($#)); do
  case $1 in
    --dir)
      [[ -n ${2-} ]] || { echo "slurm/down.sh: --dir needs a directory" >&2; exit 2; }
      export SLURM_LOCAL_DIR=$2; shift 2 ;;
    -h|--help) sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "slurm/down.sh: unknown argument '$1' (allowed: --dir DIR, --help); nothing was stopped" >&2; exit 2 ;;
  esac
done
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export SLURM_CONF=$SLURM_LOCAL_ETC/slurm.conf

[[ -d $SLURM_LOCAL_RUN ]] || { echo "Slurm cluster in $SLURM_LOCAL_DIR is not running."; exit 0; }

# Jobs first, so their tasks end through slurmstepd rather than being orphaned.
if slurm_local_pid_alive "$SLURM_LOCAL_RUN/slurmctld.pid"; then
  jobs=$(squeue -h -o %A 2>/dev/null)
  if [[ -n $jobs ]]; then
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null
    for _ in $(seq 50); do [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break; sleep 0.2; done
  fi
fi

stop() {  # PIDFILE: TERM, wait up to 10 s for the process to be gone (reaped, not a zombie), then KILL
  local pidfile=$1 pid started
  slurm_local_pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  started=$(slurm_local_started "$pid")  # the same process while its pid shows this start time
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 50); do [[ $(slurm_local_started "$pid") == "$started" ]] || break; sleep 0.2; done
  [[ $(slurm_local_started "$pid") != "$started" ]] || kill -KILL "$pid" 2>/dev/null
  rm -f "$pidfile"
}

for pidfile in "$SLURM_LOCAL_RUN"/slurmd-*.pid; do
  [[ $pidfile == *.daemon.pid ]] || stop "$pidfile"
done
for ((i = ${#SLURM_LOCAL_DAEMONS[@]} - 1; i >= 0; i--)); do
  stop "$SLURM_LOCAL_RUN/${SLURM_LOCAL_DAEMONS[i]}.pid"
done
rm -f "$SLURM_LOCAL_RUN"/*.daemon.pid "$SLURM_LOCAL_DIR/settings"
if [[ -w /etc/hosts ]] && grep -q '# slurm-local:' /etc/hosts; then
  name=$(grep -o '^ClusterName=.*' "$SLURM_CONF" 2>/dev/null | cut -d= -f2)
  [[ -z $name ]] || slurm_local_set_hosts "$name"
fi
echo "Slurm cluster in $SLURM_LOCAL_DIR stopped."
