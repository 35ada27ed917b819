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

# PIDFILE -> success if the process it names is running (a zombie is not) and is the daemon the file is named
# after (slurmd-NODE.pid: a slurmd), so that a pid freed and handed to another process (pids wrap at 32768 on many
# machines, in minutes on a busy one) is not taken for the daemon, kept alive or signalled by down.sh.
slurm_local_pid_alive() {
  local pid fields name
  [[ -s $1 ]] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null || return 1
  fields=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null) && [[ ${fields%% *} != Z ]] || return 1
  name=$(basename "$1")
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "${name%%[-.]*}" ]]
}

slurm_local_started() {  # PID -> its start time (clock ticks after boot: field 22 of /proc/PID/stat), or nothing
  { sed 's/.*) //' "/proc/$1/stat" 2>/dev/null || true; } | cut -d' ' -f20
}

# slurm_local_set_hosts NAME [LINE]: drop the /etc/hosts line of cluster NAME and, given LINE, put LINE in its
# place. Clusters started and stopped side by side (the test suite's) edit the one file: each edit holds a lock, so
# none reads a file half-written by another or loses another's line, and the new file replaces the old by a rename,
# so a rank resolving a node name meanwhile never reads an empty one. Where /etc/hosts is a bind mount (a
# container's), which a rename cannot replace, it is rewritten in place.
slurm_local_set_hosts() {
  local name=$1 line=${2:-} new=/etc/hosts.slurm-local.$$
  (
    flock 9
    { grep -v "# slurm-local:$name\$" /etc/hosts || true; [[ -z $line ]] || echo "$line"; } >"$new"
    chmod --reference=/etc/hosts "$new"
    mv -f "$new" /etc/hosts 2>/dev/null || { cat "$new" >/etc/hosts; rm -f "$new"; }
  ) 9>>/tmp/slurm-local-hosts.lock
}
