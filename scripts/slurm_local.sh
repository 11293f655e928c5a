#!/usr/bin/env bash
# A one-node SLURM cluster on localhost, to run the workflow's cluster profile for real
# (tests/test_slurm.py). Debian 12, no systemd, as root:
#   scripts/slurm_local.sh start    # install slurm-wlm + munge if needed, start munged,
#                                   # slurmctld, slurmd; wait until the node is idle
#   scripts/slurm_local.sh stop     # stop the three daemons by PID, remove the slurm.conf written here
#   scripts/slurm_local.sh status   # exit 0 if the node answers, else 1
# A one-node configuration that works without systemd: no cgroups
# (proctrack/linuxproc, task/none), select/cons_tres, no accounting (the profile polls with
# squeue, so MinJobAge keeps finished jobs listed), DefMemPerCPU so jobs do not take all memory.
# Exit codes: 0 ok, 2 usage, 3 cannot run here (not root, no apt-get, install failed),
# 4 an /etc/slurm/slurm.conf not written by this script exists, 5 the node did not come up.
set -euo pipefail

MARK="# written by rspo scripts/slurm_local.sh"
CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
# GPUs the node declares as a generic resource without real devices (gres.conf: AutoDetect=off), so
# that SLURM accepts and schedules GPU-asking jobs (--gpus=N) on a machine without GPUs: the
# workflow's GPU rules run their CPU fallback there (tests/test_slurm.py). SLURM 22.05 drops a GPU
# without a File from the node's count, so each is a stand-in character device (/dev/null's numbers;
# nothing opens it: TaskPlugin=task/none constrains no device).
GPUS=${SLURM_LOCAL_GPUS:-2}
FAKE_GPU=/var/spool/slurmd/rspo-fake-gpu
PIDS=(/run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid)

die() { echo "slurm_local: $2" >&2; exit "$1"; }

node_state() { sinfo -h -o %T 2>/dev/null | head -n1 || true; }

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && [ -x /usr/sbin/munged ]; then
        return 0
    fi
    command -v apt-get >/dev/null || die 3 "slurm-wlm is not installed and apt-get is not available"
    echo "slurm_local: installing slurm-wlm and munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >/tmp/slurm_local_apt.log 2>&1 \
        || { apt-get update -q >>/tmp/slurm_local_apt.log 2>&1 \
             && apt-get install -y -q slurm-wlm munge >>/tmp/slurm_local_apt.log 2>&1; } \
        || die 3 "apt-get install slurm-wlm munge failed (see /tmp/slurm_local_apt.log)"
}

write_conf() {
    if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
        die 4 "$CONF exists and was not written by this script; not touching a real SLURM setup"
    fi
    local cpus mem
    cpus=$(nproc --all)  # every CPU: plain nproc honours OMP_NUM_THREADS (make test sets 1)
    mem=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
    mem=${mem:-2000}
    mkdir -p /etc/slurm
    cat >"$CONF" <<EOF
$MARK
ClusterName=ci
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SlurmdTimeout=60
MinJobAge=600
DefMemPerCPU=1000
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=localhost MaxTime=INFINITE State=UP
EOF
    mkdir -p "$(dirname "$FAKE_GPU")"
    local i
    for i in $(seq 0 $((GPUS - 1))); do
        [ -e "$FAKE_GPU$i" ] || mknod "$FAKE_GPU$i" c 1 3 2>/dev/null || touch "$FAKE_GPU$i"
    done
    cat >"$GRES_CONF" <<EOF
$MARK
AutoDetect=off
NodeName=localhost Name=gpu File=$FAKE_GPU[0-$((GPUS - 1))]
EOF
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    [ "$(id -u)" = 0 ] || die 3 "must run as root (installs packages and starts daemons)"
    install
    write_conf
    for d in /run/munge /var/log/munge /var/lib/munge; do
        mkdir -p "$d"; chown munge:munge "$d"; chmod 0755 "$d"
    done
    mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
    if [ ! -s /etc/munge/munge.key ]; then
        (command -v mungekey >/dev/null && mungekey --create --keyfile=/etc/munge/munge.key) \
            || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
    fi
    alive /run/munge/munged.pid || runuser -u munge -- /usr/sbin/munged
    # -c: start from a clean state (no jobs left from an earlier run).
    alive /run/slurmctld.pid || slurmctld -c
    # Never a second slurmd: it would kill the running one through the shared pidfile.
    alive /run/slurmd.pid || slurmd -N localhost
    for _ in $(seq 1 60); do
        case "$(node_state)" in
            idle|mixed|allocated) echo "slurm_local: node localhost is $(node_state)"; return 0 ;;
        esac
        sleep 0.5
    done
    die 5 "the node did not become idle within 30 s (state: '$(node_state)'; see /var/log/slurm/)"
}

stop() {
    local f pid
    for f in "${PIDS[@]}"; do
        if alive "$f"; then
            pid=$(cat "$f")
            kill "$pid"
            for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
            echo "slurm_local: stopped $(basename "$f" .pid) ($pid)"
        fi
    done
    # Without a controller, a slurm.conf left behind makes every `scontrol show config` wait ~9 s for
    # it, and the SLURM executor plugin runs that probe each time Snakemake starts (any Snakemake,
    # local runs included). start writes the file again.
    if [ -f "$CONF" ] && grep -qF "$MARK" "$CONF"; then
        rm -f "$CONF"
        echo "slurm_local: removed $CONF"
    fi
    if [ -f "$GRES_CONF" ] && grep -qF "$MARK" "$GRES_CONF"; then
        rm -f "$GRES_CONF" "$FAKE_GPU"*
    fi
    return 0
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) [ "$(node_state)" != "" ] && { echo "slurm_local: node is $(node_state)"; exit 0; } || exit 1 ;;
    *) die 2 "usage: $0 start|stop|status" ;;
esac
