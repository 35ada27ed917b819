# Settings shared by up.sh, down.sh and env.sh (sourced, not run).
#
# Every piece of state lives under one directory, $SLURM_LOCAL_DIR (default: .slurm/ in the repo),
# and every daemon listens on a port derived from $SLURM_LOCAL_PORT, so this cluster never collides
# with a site Slurm or with a second local cluster started with another directory and port.

SLURM_LOCAL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SLURM_LOCAL_DIR=${SLURM_LOCAL_DIR:-$SLURM_LOCAL_REPO/.slurm}
SLURM_LOCAL_ETC=$SLURM_LOCAL_DIR/etc
SLURM_LOCAL_RUN=$SLURM_LOCAL_DIR/run
SLURM_LOCAL_LOG=$SLURM_LOCAL_DIR/log

# The daemons in start order; down.sh stops them in reverse.
SLURM_LOCAL_DAEMONS=(munged mariadbd slurmdbd slurmctld)

slurm_local_pid_alive() {  # PIDFILE -> success if the process it names is running (a zombie is not)
  local pid
  [[ -s $1 ]] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null \
    && [[ $(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) != Z ]]
}
