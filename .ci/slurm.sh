#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the launcher's end-to-end tests (root, Debian):
#   .ci/slurm.sh start   # installs slurm-wlm and munge if missing, starts munged, slurmctld, slurmd
#   .ci/slurm.sh stop
# The controller and the node daemon run on localhost with this host's CPUs as the node's; the
# config and logs live in $RLJAX_SLURM_DIR (default /tmp/rljax-slurm). Clients find the cluster by
# SLURM_CONF=$RLJAX_SLURM_DIR/slurm.conf (tests/test_launch.py sets it from the same default).
set -euo pipefail
dir="${RLJAX_SLURM_DIR:-/tmp/rljax-slurm}"
node="$(hostname -s)"

stop() {   # each daemon in turn, waiting until it has exited (it holds its port until then)
  for daemon in slurmd slurmctld munged; do
    pid="$(cat "$dir/$daemon.pid" 2>/dev/null || true)"
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || continue
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  rm -f "$dir"/*.pid
}

start() {
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; }
  fi
  stop
  mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
  chmod 700 "$dir/munge"
  munged --force --socket="$dir/munge/munge.socket" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munge/munge.seed"
  cpus="$(nproc)"
  memory="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
  cat > "$dir/slurm.conf" <<EOF
ClusterName=rljax
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SchedulerType=sched/backfill
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE OverSubscribe=YES State=UP
EOF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -c    # a clean state: no jobs of an earlier cluster
  slurmd
  for _ in $(seq 60); do   # until the node takes jobs
    if sinfo -h -N -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
      echo "SLURM up: SLURM_CONF=$SLURM_CONF ($cpus CPUs on $node)"
      return
    fi
    sleep 1
  done
  echo "SLURM did not come up; logs in $dir" >&2
  tail -5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
  exit 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
