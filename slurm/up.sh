#!/usr/bin/env bash
# Start a real multi-node Slurm cluster on this one machine: munge, MariaDB, slurmdbd (accounting),
# slurmctld and one slurmd per node, each node with its own port and virtual (or real) GPUs as gres.
#
# Usage: slurm/up.sh [--nodes N] [--gpus N] [--cpus N] [--mem MB] [--port BASE] [--name NAME]
#                    [--dir DIR] [--no-accounting] [--min-job-age S] [--strict USERS] [--restart]
# The same settings can come from SLURM_LOCAL_NODES, SLURM_LOCAL_GPUS, SLURM_LOCAL_CPUS,
# SLURM_LOCAL_MEM_MB, SLURM_LOCAL_PORT, SLURM_LOCAL_NAME, SLURM_LOCAL_DIR, SLURM_LOCAL_ACCOUNTING=0,
# SLURM_LOCAL_MIN_JOB_AGE (how long squeue remembers finished jobs, default 300 s), SLURM_LOCAL_STRICT.
# --strict USERS sets the cluster up as a strict site does: accounting enforced (associations, limits, QOS),
# the comma-separated USERS in one account `lab` with QOS `normal` (at most 8 GPUs per user, their default)
# and `big`, and a `debug` partition (MaxNodes=1, MaxTime=10) beside the default one (MaxTime=60).
# Running it on a cluster that is already up with the same settings changes nothing. On one with some
# daemons gone (a node's slurmd died), it repairs: it starts only the missing ones, returns their nodes
# to service, and leaves every job alone. --restart stops the whole cluster first (down.sh: queued and
# running jobs are cancelled) and starts it clean.
set -euo pipefail

die() { echo "slurm/up.sh: $*" >&2; exit 1; }

NODES=${SLURM_LOCAL_NODES:-2}
GPUS=${SLURM_LOCAL_GPUS:-8}
CPUS=${SLURM_LOCAL_CPUS:-}
MEM_MB=${SLURM_LOCAL_MEM_MB:-4096}
PORT=${SLURM_LOCAL_PORT:-16810}
NAME=${SLURM_LOCAL_NAME:-local}
ACCOUNTING=${SLURM_LOCAL_ACCOUNTING:-1}
MIN_JOB_AGE=${SLURM_LOCAL_MIN_JOB_AGE:-300}
STRICT=${SLURM_LOCAL_STRICT:-}
RESTART=0
while (($#)); do
  case $1 in
    --nodes) NODES=${2-}; shift 2 ;;
    --gpus) GPUS=${2-}; shift 2 ;;
    --cpus) CPUS=${2-}; shift 2 ;;
    --mem) MEM_MB=${2-}; shift 2 ;;
    --port) PORT=${2-}; shift 2 ;;
    --name) NAME=${2-}; shift 2 ;;
    --dir) export SLURM_LOCAL_DIR=${2-}; shift 2 ;;
    --no-accounting) ACCOUNTING=0; shift ;;
    --min-job-age) MIN_JOB_AGE=${2-}; shift 2 ;;
    --strict) STRICT=${2-}; shift 2 ;;
    --restart) RESTART=1; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (allowed: --nodes --gpus --cpus --mem --port --name --dir --no-accounting --min-job-age --strict --restart)" ;;
  esac
done

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# ---- validate everything before starting anything ------------------------------------------------
positive() { [[ $2 =~ ^[0-9]+$ ]] && (($2 > 0)) || die "$1 must be a positive integer, got '$2'"; }
positive "--nodes" "$NODES"
[[ -z $CPUS ]] || positive "--cpus" "$CPUS"  # default: the GPU count, set below
positive "--mem" "$MEM_MB"
positive "--port" "$PORT"
positive "--min-job-age" "$MIN_JOB_AGE"
[[ $GPUS =~ ^[0-9]+$ ]] || die "--gpus must be a non-negative integer, got '$GPUS'"
((NODES <= 64)) || die "--nodes must be at most 64 on one machine, got $NODES"
((PORT >= 1024 && PORT + 20 + NODES <= 65535)) || die "--port must be in 1024..$((65535 - 20 - NODES)), got $PORT"
[[ $NAME =~ ^[a-z][a-z0-9]{0,15}$ ]] || die "--name must be lowercase letters and digits (max 16), got '$NAME'"
[[ $ACCOUNTING =~ ^[01]$ ]] || die "SLURM_LOCAL_ACCOUNTING must be 0 or 1, got '$ACCOUNTING'"
if [[ -n $STRICT ]]; then
  ((ACCOUNTING)) || die "--strict needs accounting (drop --no-accounting)"
  for user in ${STRICT//,/ }; do
    id -u "$user" >/dev/null 2>&1 || die "--strict: no such user '$user' (give existing users, comma-separated)"
  done
fi
for tool in munged slurmctld slurmd sinfo scontrol; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed; run scripts/setup.sh first"
done
if ((ACCOUNTING)); then
  for tool in mariadbd mariadb-install-db slurmdbd sacctmgr; do
    command -v "$tool" >/dev/null || die "'$tool' is not installed; run scripts/setup.sh first"
  done
fi

CTLD_PORT=$PORT
DBD_PORT=$((PORT + 1))
DB_PORT=$((PORT + 2))
node_name() { echo "$NAME-node$1"; }
node_port() { echo $((PORT + 20 + $1)); }
NODE_LIST="$NAME-node[1-$NODES]"
CONTROLLER=$(hostname -s)

# Real NVIDIA device files win over virtual ones.
REAL_GPUS=$(compgen -G "/dev/nvidia[0-9]*" | wc -l || true)
if ((REAL_GPUS > 0)); then GPUS=$REAL_GPUS; fi
# As many (virtual) CPUs as GPUs by default: one task per GPU with one CPU each fits any layout.
if [[ -z $CPUS ]]; then CPUS=$((GPUS > 0 ? GPUS : 1)); fi

SETTINGS="name=$NAME nodes=$NODES gpus=$GPUS cpus=$CPUS mem=$MEM_MB port=$PORT accounting=$ACCOUNTING min_job_age=$MIN_JOB_AGE strict=$STRICT"
export SLURM_CONF=$SLURM_LOCAL_ETC/slurm.conf

ready() {
  echo "Slurm cluster '$NAME' is up: $NODES nodes x $GPUS GPUs ($SLURM_LOCAL_DIR)."
  echo "export SLURM_CONF=$SLURM_CONF"
}

# The daemons of this cluster, each as "pidfile-name port": the controller's, then one slurmd per node.
DAEMONS=("munged -")
((ACCOUNTING)) && DAEMONS+=("mariadbd $DB_PORT" "slurmdbd $DBD_PORT")
DAEMONS+=("slurmctld $CTLD_PORT")
for ((n = 1; n <= NODES; n++)); do DAEMONS+=("slurmd-$(node_name "$n") $(node_port "$n")"); done

missing() {  # the daemons (pidfile names) not running, in start order
  local d
  for d in "${DAEMONS[@]}"; do
    slurm_local_pid_alive "$SLURM_LOCAL_RUN/${d% *}.pid" || echo "${d% *}"
  done
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
check_ports() {  # NAMES...: the ports those daemons are to listen on must be free
  local d p
  for d in "${DAEMONS[@]}"; do
    p=${d#* }
    if [[ $p != - && " $* " == *" ${d% *} "* ]] && port_taken "$p"; then
      die "port $p is already in use; pick another base with --port or SLURM_LOCAL_PORT"
    fi
  done
}

# Node names must resolve so that tasks can rendezvous by node name, as on a real cluster; a repair puts
# back the line too (another cluster of the same name may have taken it away when it stopped).
ensure_hosts() {
  local line
  line="127.0.0.1 $(for ((n = 1; n <= NODES; n++)); do printf '%s ' "$(node_name "$n")"; done)# slurm-local:$NAME"
  grep -qxF "$line" /etc/hosts 2>/dev/null && return 0
  if [[ -w /etc/hosts ]]; then
    slurm_local_set_hosts "$NAME" "$line"
  else
    echo "slurm/up.sh: warning: cannot write /etc/hosts; node names $NODE_LIST will not resolve" >&2
  fi
}

MISSING=$(missing | tr '\n' ' ')
NAMES=$(for d in "${DAEMONS[@]}"; do printf '%s ' "${d% *}"; done)
REPAIR=0
if ((RESTART)); then
  "$(dirname "${BASH_SOURCE[0]}")/down.sh" >/dev/null 2>&1 || true
elif [[ -f $SLURM_LOCAL_DIR/settings && $MISSING != "$NAMES" ]]; then
  [[ $(cat "$SLURM_LOCAL_DIR/settings") == "$SETTINGS" ]] \
    || die "a cluster with other settings is running in $SLURM_LOCAL_DIR ($(cat "$SLURM_LOCAL_DIR/settings")); run slurm/down.sh first, or slurm/up.sh --restart"
  if [[ -z $MISSING ]]; then
    ensure_hosts
    ready
    exit 0
  fi
  REPAIR=1  # some daemons are up: start only the missing ones, leaving jobs (and the running daemons) alone
else
  # Nothing is running (or a cluster of unknown settings is): clear stale pid files and start clean.
  "$(dirname "${BASH_SOURCE[0]}")/down.sh" >/dev/null 2>&1 || true
  MISSING=$NAMES
fi
# shellcheck disable=SC2086
check_ports $MISSING

# ---- from here on, a failure stops whatever was started ----------------------------------------
STARTED=0
# A failed start stops what it started; a failed repair leaves the running daemons (and their jobs) be.
on_exit() { if ((!STARTED && !REPAIR)); then "$(dirname "${BASH_SOURCE[0]}")/down.sh" >/dev/null 2>&1 || true; fi; }
trap on_exit EXIT

mkdir -p "$SLURM_LOCAL_ETC" "$SLURM_LOCAL_RUN" "$SLURM_LOCAL_LOG" "$SLURM_LOCAL_DIR/ctld" "$SLURM_LOCAL_DIR/dev"
for ((n = 1; n <= NODES; n++)); do mkdir -p "$SLURM_LOCAL_DIR/spool/$(node_name "$n")"; done
echo "$SETTINGS" >"$SLURM_LOCAL_DIR/settings"

ensure_hosts

# Virtual GPUs are character devices (the nvidia major number), so slurmd counts them cleanly.
if ((REAL_GPUS > 0)); then
  GPU_FILES="/dev/nvidia[0-$((GPUS - 1))]"
elif ((GPUS > 0)); then
  for ((g = 0; g < GPUS; g++)); do
    f=$SLURM_LOCAL_DIR/dev/nvidia$g
    [[ -e $f ]] || mknod "$f" c 195 "$g" 2>/dev/null || : >"$f"
  done
  GPU_FILES="$SLURM_LOCAL_DIR/dev/nvidia[0-$((GPUS - 1))]"
fi

MUNGE_SOCKET=$SLURM_LOCAL_DIR/munge/munge.socket
write_configs() {
  local n gres=""
  ((GPUS > 0)) && gres="Gres=gpu:$GPUS"
  {
    echo "# Written by slurm/up.sh ($SETTINGS). Edit up.sh, not this file."
    echo "ClusterName=$NAME"
    echo "SlurmctldHost=$CONTROLLER(127.0.0.1)"
    echo "SlurmctldPort=$CTLD_PORT"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    # cred_expire also delays a requeued job's restart (default 120 s): short, so preemption tests are quick.
    echo "AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10"
    echo "StateSaveLocation=$SLURM_LOCAL_DIR/ctld"
    echo "SlurmdSpoolDir=$SLURM_LOCAL_DIR/spool/%n"
    echo "SlurmctldPidFile=$SLURM_LOCAL_RUN/slurmctld.daemon.pid"
    echo "SlurmdPidFile=$SLURM_LOCAL_RUN/slurmd-%n.daemon.pid"
    echo "SlurmctldLogFile=$SLURM_LOCAL_LOG/slurmctld.log"
    echo "SlurmdLogFile=$SLURM_LOCAL_LOG/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "MpiDefault=none"
    echo "SchedulerType=sched/backfill"
    # Scheduling passes every 2 s, not 60 (main) and 30 (backfill): a job Slurm requeues itself (a lost node's)
    # becomes eligible after its begin time and then waits for the next pass.
    echo "SchedulerParameters=sched_interval=2,bf_interval=2"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "SlurmdParameters=config_overrides"
    echo "GresTypes=gpu"
    echo "ReturnToService=2"
    echo "SlurmdTimeout=60"
    echo "KillWait=5"
    echo "MinJobAge=$MIN_JOB_AGE"
    echo "JobRequeue=1"
    echo "EnforcePartLimits=ALL"  # refuse, at submit time, jobs the partition can never run
    echo "JobAcctGatherType=jobacct_gather/none"
    if ((ACCOUNTING)); then
      echo "AccountingStorageType=accounting_storage/slurmdbd"
      echo "AccountingStorageHost=127.0.0.1"
      echo "AccountingStoragePort=$DBD_PORT"
      echo "AccountingStoragePass=$MUNGE_SOCKET"  # for slurmdbd this names the munge socket
      echo "AccountingStorageTRES=gres/gpu"
      [[ -z $STRICT ]] || echo "AccountingStorageEnforce=associations,limits,qos"
    fi
    for ((n = 1; n <= NODES; n++)); do
      # Features=virtual_gpus: this cluster's GPUs are CPU processes (`launcher clusters add` reads it).
      echo "NodeName=$(node_name "$n") NodeAddr=127.0.0.1 Port=$(node_port "$n") CPUs=$CPUS RealMemory=$MEM_MB $gres Features=virtual_gpus State=UNKNOWN"
    done
    if [[ -n $STRICT ]]; then
      echo "PartitionName=gpu Nodes=$NODE_LIST Default=YES MaxTime=60 State=UP"
      echo "PartitionName=debug Nodes=$NODE_LIST MaxTime=10 MaxNodes=1 State=UP"
    else
      echo "PartitionName=gpu Nodes=$NODE_LIST Default=YES MaxTime=INFINITE State=UP"
    fi
  } >"$SLURM_LOCAL_ETC/slurm.conf"
  if ((GPUS > 0)); then
    echo "NodeName=$NODE_LIST Name=gpu File=$GPU_FILES" >"$SLURM_LOCAL_ETC/gres.conf"
  else
    : >"$SLURM_LOCAL_ETC/gres.conf"
  fi
  : >"$SLURM_LOCAL_ETC/plugstack.conf"
  if ((ACCOUNTING)); then
    # slurmdbd reads slurmdbd.conf from SLURM_CONF's folder and insists on mode 600.
    (
      umask 077
      cat >"$SLURM_LOCAL_ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$SLURM_LOCAL_LOG/slurmdbd.log
PidFile=$SLURM_LOCAL_RUN/slurmdbd.daemon.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StorageLoc=slurm_acct_db_$NAME
EOF
    )
  fi
}

# start NAME LOG CMD...: run a daemon in the foreground of its own session, remember its pid, and return once that
# process is the daemon (setsid has exec'd it): slurm_local_pid_alive knows a daemon by its name.
start() {
  local name=$1 log=$2 pid _
  shift 2
  setsid "$@" >>"$log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$SLURM_LOCAL_RUN/$name.pid"
  for _ in $(seq 250); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) != "${1##*/}" ]] && kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
}

# wait_for WHAT PIDFILE LOG TEST...: poll TEST until it succeeds; fail naming the log if the daemon dies.
wait_for() {
  local what=$1 pidfile=$2 log=$3 i
  shift 3
  for ((i = 0; i < 300; i++)); do
    if timeout 10 "$@" >/dev/null 2>&1; then return 0; fi
    slurm_local_pid_alive "$pidfile" || die "$what died during start-up; read $log"
    sleep 0.2
  done
  die "$what did not become ready in 60 s; read $log"
}

start_munge() {
  mkdir -p "$SLURM_LOCAL_DIR/munge"
  chmod 711 "$SLURM_LOCAL_DIR/munge"  # clients of every user must reach the socket
  [[ -s $SLURM_LOCAL_DIR/munge/munge.key ]] || mungekey -c -k "$SLURM_LOCAL_DIR/munge/munge.key" >/dev/null
  chmod 400 "$SLURM_LOCAL_DIR/munge/munge.key"
  local log=$SLURM_LOCAL_LOG/munged.log
  start munged "$log" munged -F --force --socket="$MUNGE_SOCKET" --key-file="$SLURM_LOCAL_DIR/munge/munge.key" \
    --pid-file="$SLURM_LOCAL_RUN/munged.daemon.pid" --log-file="$log" --seed-file="$SLURM_LOCAL_DIR/munge/munged.seed"
  wait_for munged "$SLURM_LOCAL_RUN/munged.pid" "$log" test -S "$MUNGE_SOCKET"
}

start_mariadb() {
  local data=$SLURM_LOCAL_DIR/mysql log=$SLURM_LOCAL_LOG/mariadb.log sock=$SLURM_LOCAL_DIR/mysql.sock
  # A temporary directory of this cluster's own: clusters bootstrapped side by side in a shared /tmp lost each
  # other's temporary tables ("Could not remove temporary table '/tmp/#sql-temptable-...'", then "Installation
  # of system tables failed").
  local tmp=$SLURM_LOCAL_DIR/mysql-tmp
  mkdir -p "$tmp"
  if [[ ! -d $data/mysql ]]; then
    mariadb-install-db --datadir="$data" --tmpdir="$tmp" --user=root --auth-root-authentication-method=socket \
      --skip-test-db >>"$log" 2>&1 || die "mariadb-install-db failed; read $log"
  fi
  start mariadbd "$log" mariadbd --no-defaults --datadir="$data" --tmpdir="$tmp" --socket="$sock" --port="$DB_PORT" \
    --bind-address=127.0.0.1 --pid-file="$SLURM_LOCAL_RUN/mariadbd.daemon.pid" --user=root \
    --innodb-buffer-pool-size=64M --skip-name-resolve
  wait_for MariaDB "$SLURM_LOCAL_RUN/mariadbd.pid" "$log" mariadb-admin --socket="$sock" ping
  mariadb --socket="$sock" -u root -e \
    "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1'; GRANT ALL ON *.* TO 'slurm'@'127.0.0.1';" \
    >>"$log" 2>&1 || die "could not create the slurm database user; read $log"
}

start_slurmdbd() {
  local log=$SLURM_LOCAL_LOG/slurmdbd.log
  start slurmdbd "$log" slurmdbd -D
  wait_for slurmdbd "$SLURM_LOCAL_RUN/slurmdbd.pid" "$log" sacctmgr -n list cluster
  # The cluster must be registered before slurmctld starts, or sacct sees no jobs.
  sacctmgr -n list cluster format=cluster | grep -qw "$NAME" \
    || sacctmgr -i add cluster "$NAME" >>"$log" 2>&1 || die "sacctmgr could not register cluster '$NAME'; read $log"
}

# add_site_rules: a strict site's accounts and QOS (--strict), once slurmctld has told slurmdbd its TRES (a limit on
# gres/gpu cannot be set before); adding what exists already changes nothing.
add_site_rules() {
  local log=$SLURM_LOCAL_LOG/slurmdbd.log
  {
    sacctmgr -i add qos big || true
    sacctmgr -i modify qos normal set MaxTRESPerUser=gres/gpu=8
    sacctmgr -i add account lab cluster="$NAME" || true
    sacctmgr -i add user "$STRICT" account=lab cluster="$NAME" qos=normal,big defaultqos=normal || true
    sacctmgr -i modify user where name="$STRICT" cluster="$NAME" set defaultaccount=lab || true
    sacctmgr -n -P show assoc cluster="$NAME" account=lab format=user | grep -q .
  } >>"$log" 2>&1 || die "sacctmgr could not set up the strict site's account and QOS; read $log"
}

start_slurmctld() {
  local log=$SLURM_LOCAL_LOG/slurmctld.log
  start slurmctld "$log" slurmctld -D -i -f "$SLURM_CONF"
  wait_for slurmctld "$SLURM_LOCAL_RUN/slurmctld.pid" "$log" scontrol ping
}

start_slurmds() {  # NODE...: start their slurmd, then give them back to service
  local node
  for node in "$@"; do
    start "slurmd-$node" "$SLURM_LOCAL_LOG/slurmd-$node.log" slurmd -D -N "$node" -f "$SLURM_CONF"
  done
  for node in "$@"; do
    # A node drained by an earlier run, or marked down while its slurmd was gone, stays so; resume it.
    scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
  done
}

nodes_serving() {  # NODE...: each is in service (idle, or running jobs: allocated, mixed, completing)
  local node state
  for node in "$@"; do
    state=$(sinfo -h -n "$node" -o '%T' 2>/dev/null | head -1) || return 1
    [[ $state =~ ^(idle|allocated|mixed|completing)$ ]] || return 1
  done
}

started() { [[ " $MISSING " == *" $1 "* ]]; }  # NAME: whether that daemon is to be started

NODES_STARTED=()
for ((n = 1; n <= NODES; n++)); do
  if started "slurmd-$(node_name "$n")"; then NODES_STARTED+=("$(node_name "$n")"); fi
done
((REPAIR)) || write_configs
if started munged; then start_munge; fi
if ((ACCOUNTING)); then
  if started mariadbd; then start_mariadb; fi
  if started slurmdbd; then start_slurmdbd; fi
fi
if started slurmctld; then
  start_slurmctld
  [[ -z $STRICT ]] || add_site_rules
fi
start_slurmds "${NODES_STARTED[@]}"
for ((i = 0; i < 300; i++)); do
  nodes_serving "${NODES_STARTED[@]}" && break
  for node in "${NODES_STARTED[@]}"; do
    slurm_local_pid_alive "$SLURM_LOCAL_RUN/slurmd-$node.pid" \
      || die "slurmd for $node died during start-up; read $SLURM_LOCAL_LOG/slurmd-$node.log"
  done
  sleep 0.2
done
nodes_serving "${NODES_STARTED[@]}" \
  || die "nodes did not come into service in 60 s ($(sinfo -h -N -o '%N=%T %E' | tr '\n' ' ')); read $SLURM_LOCAL_LOG/slurmctld.log"
STARTED=1
if ((REPAIR)); then echo "Repaired: started $MISSING(running jobs left alone)."; fi
ready
