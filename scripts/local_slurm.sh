#!/usr/bin/env bash
# local_slurm.sh: a private two-node Slurm cluster on this machine, for trying the
# batch scripts in slurm/ and for the tests. Nothing is installed or written outside
# DIR, and it listens on loopback ports chosen free at start: its daemons and the
# jobs' srun steps accept connections from this machine only. Slurm listens on the
# address the host name resolves to, so `start` refuses where that is not a loopback
# one (Debian's /etc/hosts maps the name to 127.0.1.1).
#
# Two nodes: one controller (slurmctld) and two node daemons (slurmd -N NAME), each
# on a port of its own, each node offering all of this machine's CPUs (the two share
# them). A job of --nodes=2 gets both, and each node's slurmd starts that node's
# tasks, as on a real cluster. The nodes are named 127.0.0.2 and 127.0.0.3: a node's
# name must resolve, as a real node's host name does (batch scripts take MASTER_ADDR
# from it), and these resolve to loopback without an /etc/hosts entry; that they are
# not this machine's own name makes Open MPI's mpirun treat them as two nodes and
# start its ranks on each through Slurm.
#
#   bash scripts/local_slurm.sh start DIR   # prints the line to export SLURM_CONF
#   export SLURM_CONF=DIR/slurm.conf
#   sbatch --nodes=2 --ntasks-per-node=1 --gpus-per-node=0 slurm/hello_ranks.sbatch
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

free_ports() {  # ADDRESS COUNT: COUNT different free ports, on one line
    # All bound at once, so that no two are the same.
    python3 -c 'import socket, sys
sockets = [socket.socket() for _ in range(int(sys.argv[2]))]
for s in sockets: s.bind((sys.argv[1], 0))
print(*(s.getsockname()[1] for s in sockets))' "$1" "$2"
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

# Whether a process runs. A daemon that has exited but was never reaped (a container
# whose PID 1 reaps no orphans) still answers kill -0; its state in /proc/PID/stat,
# after the command's closing parenthesis, is then Z.
running() {
    local stat
    kill -0 "$1" 2>/dev/null || return 1
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [[ "${stat:0:1}" != Z ]]
}

stop_daemons() {
    # slurmd and slurmctld first (they talk to munge), then munged; TERM, then KILL.
    # run/slurmd-NODE.pid: one file per node daemon.
    local file pid
    for file in "$DIR"/run/slurmd*.pid "$DIR"/run/{slurmctld,munged}.pid; do
        [[ -f "$file" ]] || continue
        pid="$(cat "$file")"
        kill -TERM "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do running "$pid" || break; sleep 0.1; done
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

# A job step's socket is DIR/NODE/NODE_JOBID.STEPID (up to 40 characters after DIR),
# and a socket's path may have at most 108.
MAX_DIR=68

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
    if [[ ${#DIR} -gt $MAX_DIR ]]; then
        echo "local_slurm.sh: the folder $DIR has ${#DIR} characters; Slurm's job" \
            "sockets in it would pass the 108 a socket's path may have. Use a folder" \
            "of at most $MAX_DIR characters (mktemp -d makes one)" >&2
        exit 1
    fi
    stop  # a cluster left in DIR by an earlier run
    mkdir -p "$DIR"/{state,log,run,munge}
    local host cpus node
    host="$(hostname -s)"
    # nproc counts the cores this process may use, but caps them at OMP_NUM_THREADS
    # (coreutils): a notebook run with OMP_NUM_THREADS=1 would get one-CPU nodes,
    # on which a two-task job never starts.
    cpus="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
    local nodes=(127.0.0.2 127.0.0.3) ports
    # The controller's port, then one for each node.
    read -r -a ports <<<"$(free_ports "$addr" 3)"
    head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
    chmod 400 "$DIR/munge/munge.key"
    cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/local_slurm.sh: two nodes, both on this machine, on loopback.
ClusterName=workshop
SlurmctldHost=$host($addr)
SlurmctldPort=${ports[0]}
SlurmdPort=${ports[1]}
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
# %n: the node's name, so that each slurmd has its own spool folder (DIR/NODE, the
# node's local disk: its jobs' sockets and scripts), pid file and log.
SlurmdSpoolDir=$DIR/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
# Both slurmd listen on $addr (NoInAddrAny), so a node is reached at $addr on a port
# of its own. Each offers all $cpus CPUs: a job of 2 tasks per node fits either.
NodeName=${nodes[0]} NodeAddr=$addr Port=${ports[1]} CPUs=$cpus RealMemory=1000 State=UNKNOWN
NodeName=${nodes[1]} NodeAddr=$addr Port=${ports[2]} CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=${nodes[0]},${nodes[1]} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    munged --force --socket="$DIR/run/munge.socket" --key-file="$DIR/munge/munge.key" \
        --log-file="$DIR/log/munged.log" --pid-file="$DIR/run/munged.pid" \
        --seed-file="$DIR/munge/munged.seed"
    slurmctld -f "$DIR/slurm.conf"
    for node in "${nodes[@]}"; do
        mkdir -p "${DIR:?}/$node"
        slurmd -f "$DIR/slurm.conf" -N "$node"
    done
    # Ready when both nodes are idle: the controller has heard from both slurmd.
    local idle
    for _ in $(seq 100); do
        idle="$(SLURM_CONF="$DIR/slurm.conf" sinfo -h -N -o %T 2>/dev/null |
            grep -cx idle || true)"
        if [[ "$idle" -eq ${#nodes[@]} ]]; then
            echo "export SLURM_CONF=$DIR/slurm.conf"
            return 0
        fi
        sleep 0.2
    done
    echo "local_slurm.sh: the nodes did not become idle in 20 s; see $DIR/log/" >&2
    stop
    exit 1
}

case "$ACTION" in
    start) start ;;
    stop) stop ;;
    stop-daemons) stop_daemons ;;
    *) usage ;;
esac
