#!/usr/bin/env bash
# local_slurm.sh: a private, single-node Slurm cluster on this machine, for trying the
# batch scripts in slurm/ and for the tests. Nothing is installed or written outside
# DIR, and it listens on loopback ports chosen free at start: its daemons and the
# jobs' srun steps accept connections from this machine only. Slurm listens on the
# address the host name resolves to, so `start` refuses where that is not a loopback
# one (Debian's /etc/hosts maps the name to 127.0.1.1).
#
#   bash scripts/local_slurm.sh start DIR   # prints the line to export SLURM_CONF
#   export SLURM_CONF=DIR/slurm.conf
#   sbatch --nodes=1 --ntasks-per-node=2 --gpus-per-node=0 slurm/hello_ranks.sbatch
#   bash scripts/local_slurm.sh stop DIR    # cancels its jobs, stops its daemons
#
# `stop-daemons DIR` stops the daemons alone. A running job's processes outlive
# slurmd by design, so `stop` first cancels every job and kills what is left of them
# (workshop/cluster/slurm_watchdog.py, the same code that stops a notebook's private
# cluster), then stops the daemons.
#
# Needs Slurm's daemons and munge (Debian: slurm-wlm munge; `make setup` installs
# them as root) and root, because slurmd starts the jobs' processes. On a real
# cluster you need none of this: submit to its Slurm.
set -euo pipefail

usage() { echo "usage: $0 start|stop|stop-daemons DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
ACTION="$1"
DIR="$(mkdir -p "$2" && cd "$2" && pwd)"

free_port() {  # ADDRESS
    python3 -c 'import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0))
print(s.getsockname()[1])' "$1"
}

loopback_address() {  # NAME: its address, if it is a loopback one
    # Slurm binds its listening sockets, with NoInAddrAny, to the first address that
    # getaddrinfo gives for the host name (IPv4, AI_ADDRCONFIG). Print that address;
    # fail, printing what the name resolves to, when it is not on loopback.
    python3 -c 'import ipaddress, socket, sys
try:
    found = socket.getaddrinfo(sys.argv[1], None, socket.AF_INET, socket.SOCK_STREAM,
                               0, socket.AI_ADDRCONFIG)
except OSError as e:
    sys.exit(f"no address ({e})")
addresses = [info[4][0] for info in found]
if not ipaddress.ip_address(addresses[0]).is_loopback:
    sys.exit(", ".join(dict.fromkeys(addresses)))
print(addresses[0])' "$1"
}

stop_daemons() {
    # slurmd and slurmctld first (they talk to munge), then munged; TERM, then KILL.
    local name pid
    for name in slurmd slurmctld munged; do
        [[ -f "$DIR/run/$name.pid" ]] || continue
        pid="$(cat "$DIR/run/$name.pid")"
        kill -TERM "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -f "$DIR"/run/*.pid
}

stop() {
    # The watchdog's file imports only the standard library: any python3 runs it.
    local here
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    python3 -I "$here/../workshop/cluster/slurm_watchdog.py" stop "$DIR" "$here/local_slurm.sh"
}

start() {
    local missing=()
    for tool in munged slurmctld slurmd scontrol; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        echo "local_slurm.sh: not found: ${missing[*]}. Install Slurm and munge" \
            "(Debian: apt-get install slurm-wlm munge), e.g. with make setup as" \
            "root" >&2
        exit 1
    fi
    if [[ "$(id -u)" -ne 0 ]]; then
        echo "local_slurm.sh: slurmd starts jobs as their users, so it needs root;" \
            "run as root, or submit to a real cluster's Slurm" >&2
        exit 1
    fi
    # Every daemon and srun listens on the address the host name resolves to, not on
    # all interfaces (CommunicationParameters below): that must be a loopback one.
    local name addr
    name="$(hostname)"
    if ! addr="$(loopback_address "$name" 2>&1)"; then
        echo "local_slurm.sh: this machine's host name $name resolves to $addr," \
            "not a loopback address; the private cluster would listen there, where" \
            "other machines can reach it. Map the name to loopback (a line" \
            "'127.0.1.1 $name' in /etc/hosts, as Debian does), or submit to a real" \
            "cluster's Slurm" >&2
        exit 1
    fi
    stop  # a cluster left in DIR by an earlier run
    mkdir -p "$DIR"/{state,spool,log,run,munge}
    local host cpus
    host="$(hostname -s)"
    cpus="$(nproc)"
    head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
    chmod 400 "$DIR/munge/munge.key"
    cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/local_slurm.sh: one node, this machine, on loopback.
ClusterName=workshop
SlurmctldHost=$host($addr)
SlurmctldPort=$(free_port "$addr")
SlurmdPort=$(free_port "$addr")
# Listen on the host name's address ($addr, loopback), not on 0.0.0.0: slurmctld
# (NoCtldInAddrAny), and slurmd, slurmstepd and srun (NoInAddrAny).
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
AuthInfo=socket=$DIR/run/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName=$host NodeAddr=$addr CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    munged --force --socket="$DIR/run/munge.socket" --key-file="$DIR/munge/munge.key" \
        --log-file="$DIR/log/munged.log" --pid-file="$DIR/run/munged.pid" \
        --seed-file="$DIR/munge/munged.seed"
    slurmctld -f "$DIR/slurm.conf"
    slurmd -f "$DIR/slurm.conf" -N "$host"
    # Ready when the node is idle: the controller has heard from slurmd.
    for _ in $(seq 100); do
        if SLURM_CONF="$DIR/slurm.conf" sinfo -h -o %T 2>/dev/null | grep -qx idle; then
            echo "export SLURM_CONF=$DIR/slurm.conf"
            return 0
        fi
        sleep 0.2
    done
    echo "local_slurm.sh: the node did not become idle in 20 s; see $DIR/log/" >&2
    stop
    exit 1
}

case "$ACTION" in
    start) start ;;
    stop) stop ;;
    stop-daemons) stop_daemons ;;
    *) usage ;;
esac
