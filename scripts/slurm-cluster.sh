#!/usr/bin/env bash
# A private Slurm 22.05 test cluster on this machine (Debian 12 packages), for the Slurm
# backend's tests and benchmark, and for developers who want a Slurm cluster locally.
#
#   scripts/slurm-cluster.sh up              start whatever is not running (idempotent; a
#                                            no-op in well under a second when all is up),
#                                            then print the environment for clients
#   scripts/slurm-cluster.sh down [DAEMON…]  stop everything this script started, or only
#                                            the named daemons: munged mariadbd slurmdbd
#                                            slurmctld slurmd slurmrestd (`up` restarts them)
#   scripts/slurm-cluster.sh down --purge    stop everything and delete the cluster's state
#                                            (job records, accounting database, keys)
#   scripts/slurm-cluster.sh status          one line per daemon; exit 1 unless all run
#   scripts/slurm-cluster.sh env             print the environment (a fresh JWT each time)
#
# `eval "$(scripts/slurm-cluster.sh up)"` exports SLURM_CONF, GANTRY_SLURM_REST_URL,
# GANTRY_SLURM_REST_USER, GANTRY_SLURM_TOKEN (a JWT for that user: the backend reads the
# token from the variable whose *name* is in the cluster settings) and GANTRY_SLURM_JOB_DIR.
#
# What runs, every TCP port on 127.0.0.1 only (checked at the end of `up`):
#   munged           private key and socket
#   mariadbd         a private instance (own datadir, socket and port): the machine's MariaDB
#                    on 3306, if any, is never touched
#   slurmdbd         accounting (sacct, sacctmgr); 22.05 has no bind-address option, so an
#                    LD_PRELOAD shim turns its bind(0.0.0.0) into bind(127.0.0.1)
#   slurmctld        with JWT as alternative auth, job comments stored in accounting,
#                    associations/limits/QOS enforced
#   slurmd x2        gpu-node1 and gpu-node2 (`slurmd -N`), each with 8 fake GPUs of one
#                    type: symlinks to /dev/null with AutoDetect=off
#   slurmrestd       REST API v0.0.38 with JWT auth (SLURM_JWT=daemon) on a loopback TCP
#                    port, running as an unprivileged user (it refuses root)
#
# Topology (topology/tree, so `scontrol show topology` answers): each node under a leaf
# switch of its own (leaf1, leaf2), both leaves under one spine switch.
#
# Partitions: gpu (default) runs jobs; parked (State=DOWN) queues jobs and never starts
# them, for benchmarks that need many live jobs.
#
# Missing Debian packages are installed with apt-get (never slurm-wlm-emulator: installing
# it switches the daemons to front-end mode).
#
# Knobs (environment):
#   GANTRY_SLURM_DIR=/tmp/gantry-slurm   everything lives here (configs, state, logs, jobs)
#   GANTRY_SLURM_PORT_BASE=27400         mariadb +6, slurmctld +17, slurmd +18, slurmdbd +19,
#                                        slurmrestd +20, gpu-node1.. +21..
#   GANTRY_SLURM_GPU_TYPE=a100           GRES type of the fake GPUs (jobs ask gpu:a100:N)
#   GANTRY_SLURM_INSTALL=1               0: fail instead of installing missing packages
set -euo pipefail

DIR=${GANTRY_SLURM_DIR:-/tmp/gantry-slurm}
PB=${GANTRY_SLURM_PORT_BASE:-27400}
GPU_TYPE=${GANTRY_SLURM_GPU_TYPE:-a100}
INSTALL=${GANTRY_SLURM_INSTALL:-1}
NODES=2
NODE_NAMES=()
for ((i = 1; i <= NODES; i++)); do NODE_NAMES+=("gpu-node$i"); done
GPUS=8
CPUS=16          # advertised per node (config_overrides): more than this machine has
MEM_MB=64000
CLUSTER=gantrytest
REST_USER=slurmrest
DB_PORT=$((PB + 6)) CTLD_PORT=$((PB + 17)) SLURMD_PORT=$((PB + 18)) DBD_PORT=$((PB + 19))
REST_PORT=$((PB + 20)) NODE_PORT0=$((PB + 21))
HOST=$(hostname -s)
LIB=/usr/lib/x86_64-linux-gnu/slurm-wlm
export SLURM_CONF=$DIR/etc/slurm.conf
# A JWT in the environment makes the Slurm clients authenticate with it instead of munge.
unset SLURM_JWT

log() { printf 'slurm-cluster: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# --- processes -----------------------------------------------------------------------------

pidfile_of() {
    case $1 in
    munged) echo "$DIR/munge/munged.pid" ;;
    mariadbd) echo "$DIR/mariadb/mariadbd.pid" ;;
    slurmdbd) echo "$DIR/run/slurmdbd.pid" ;;
    slurmctld) echo "$DIR/run/slurmctld.pid" ;;
    slurmrestd) echo "$DIR/run/slurmrestd.pid" ;;
    gpu-node*) echo "$DIR/run/slurmd-$1.pid" ;;
    *) die "unknown daemon $1" ;;
    esac
}

# The pid in the daemon's pid file, if that process is alive and is the daemon (a stale pid
# file whose pid was reused by another program does not count).
daemon_pid() {
    local file pid comm
    file=$(pidfile_of "$1")
    [[ -s $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    case $1 in
    gpu-node*) [[ $comm == slurmd ]] ;;
    *) [[ $comm == "$1" ]] ;;
    esac && printf '%s\n' "$pid"
}

running() { daemon_pid "$1" >/dev/null; }


wait_for() { # wait_for SECONDS COMMAND...
    local end=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < end)) || return 1
        sleep 0.2
    done
}

# shellcheck disable=SC2016 # $0 is the inner shell's argument
tcp_open() { timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"' "$1" 2>/dev/null; }

# SIGTERM, then SIGKILL after the grace period (slurmd ignores SIGTERM while it is stuck
# registering with a stopped slurmctld).
stop_daemons() { # stop_daemons GRACE NAME...
    local grace=$1 name pid pids=() end
    shift
    for name in "$@"; do
        if pid=$(daemon_pid "$name"); then
            kill "$pid" 2>/dev/null && pids+=("$pid") && log "stopping $name (pid $pid)"
        fi
        rm -f "$(pidfile_of "$name")"
    done
    ((${#pids[@]})) || return 0
    end=$((SECONDS + grace))
    while ((SECONDS < end)); do
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && sleep 0.1 && continue 2
        done
        return 0
    done
    for pid in "${pids[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            log "pid $pid ignored SIGTERM for ${grace}s: SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
    done
}

# --- packages ------------------------------------------------------------------------------

install_packages() {
    local need=()
    command -v slurmctld >/dev/null || need+=(slurmctld)
    command -v slurmd >/dev/null || need+=(slurmd)
    command -v sbatch >/dev/null || need+=(slurm-client)
    command -v slurmrestd >/dev/null || need+=(slurmrestd)
    command -v slurmdbd >/dev/null || need+=(slurmdbd)
    command -v munged >/dev/null || need+=(munge)
    command -v mariadbd >/dev/null || need+=(mariadb-server)
    [[ -e $LIB/auth_jwt.so ]] || need+=(slurm-wlm-jwt-plugin)
    [[ -e $LIB/accounting_storage_mysql.so ]] || need+=(slurm-wlm-mysql-plugin)
    command -v gcc >/dev/null || need+=(gcc libc6-dev)
    command -v python3 >/dev/null || need+=(python3)
    ((${#need[@]})) || return 0
    [[ $INSTALL == 1 ]] || die "missing packages: ${need[*]} (apt-get install them, or set GANTRY_SLURM_INSTALL=1)"
    command -v apt-get >/dev/null || die "missing packages and no apt-get: ${need[*]}"
    log "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The packages' own services (munge, slurmctld, slurmd, …) are not used; with
    # policy-rc.d (as in containers) the postinst scripts do not start them either.
    apt-get install -y -q --no-install-recommends "${need[@]}" >"$DIR/log/apt.log" 2>&1 || {
        apt-get update -q >>"$DIR/log/apt.log" 2>&1
        apt-get install -y -q --no-install-recommends "${need[@]}" >>"$DIR/log/apt.log" 2>&1 ||
            die "apt-get install failed: $(tail -n 5 "$DIR/log/apt.log")"
    }
}

# --- configuration -------------------------------------------------------------------------

render_slurm_conf() {
    cat <<EOF
# Written by scripts/slurm-cluster.sh; edits are overwritten by the next \`up\`.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.sock
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$DIR/etc/jwt_hs256.key
# slurmctld, slurmd and srun bind the resolved address (127.0.0.1), never 0.0.0.0
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
TopologyPlugin=topology/tree
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# for connections to slurmdbd the MUNGE socket is taken from AccountingStoragePass
AccountingStoragePass=$DIR/munge/munge.sock
AccountingStorageTRES=gres/gpu,gres/gpu:$GPU_TYPE
AccountingStorageEnforce=associations,limits,qos
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
# finished jobs stay visible to squeue and REST /jobs for 5 minutes
MinJobAge=300
MaxJobCount=20000
# a job is killed as soon as its time limit passes, 2 s after SIGTERM
OverTimeLimit=0
KillWait=2
MessageTimeout=5
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
SlurmdParameters=config_overrides
NodeName=gpu-node[1-$NODES] NodeHostname=gpu-node[1-$NODES] NodeAddr=127.0.0.1 Port=[$NODE_PORT0-$((NODE_PORT0 + NODES - 1))] CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPU_TYPE:$GPUS State=UNKNOWN
PartitionName=gpu Nodes=gpu-node[1-$NODES] Default=YES MaxTime=INFINITE State=UP
# queues jobs and never starts them: benchmarks submit and sync "held" jobs here
PartitionName=parked Nodes=gpu-node[1-$NODES] MaxTime=INFINITE State=DOWN
EOF
}

render_gres_conf() {
    cat <<EOF
AutoDetect=off
NodeName=gpu-node[1-$NODES] Name=gpu Type=$GPU_TYPE File=$DIR/fakedev/nvidia[0-$((GPUS - 1))]
EOF
}

render_topology_conf() {
    local i
    echo "# Written by scripts/slurm-cluster.sh; edits are overwritten by the next \`up\`."
    for ((i = 1; i <= NODES; i++)); do echo "SwitchName=leaf$i Nodes=gpu-node$i"; done
    echo "SwitchName=spine Switches=leaf[1-$NODES]"
}

render_slurmdbd_conf() {
    cat <<EOF
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.sock
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$DIR/etc/jwt_hs256.key
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$DIR/log/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(<"$DIR/etc/db.password")
StorageLoc=slurm_acct_db
EOF
}

# Writes a config file only when its content changed; returns 0 if it changed.
write_if_changed() { # write_if_changed FILE MODE (content on stdin)
    local tmp
    tmp=$(mktemp "$1.XXXXXX")
    cat >"$tmp"
    chmod "$2" "$tmp"
    if [[ -f $1 ]] && cmp -s "$tmp" "$1"; then
        rm -f "$tmp"
        return 1
    fi
    mv -f "$tmp" "$1"
}

write_configs() {
    local changed=0 i
    mkdir -p "$DIR"/{etc,state,log,run,spool,jobs,fakedev,shim}
    # Jobs submitted through slurmrestd run as $REST_USER and write their output here.
    chmod 1777 "$DIR/jobs"
    # gres/gpu in 22.05 drops GPUs without File= and wants character devices: symlinks to
    # /dev/null pass both checks, and jobs get CUDA_VISIBLE_DEVICES like on real GPUs.
    for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$DIR/fakedev/nvidia$i"; done
    [[ -s $DIR/etc/jwt_hs256.key ]] || (umask 077 && head -c 32 /dev/urandom >"$DIR/etc/jwt_hs256.key")
    [[ -s $DIR/etc/db.password ]] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DIR/etc/db.password")
    render_slurm_conf | write_if_changed "$DIR/etc/slurm.conf" 644 && changed=1
    render_gres_conf | write_if_changed "$DIR/etc/gres.conf" 644 && changed=1
    render_topology_conf | write_if_changed "$DIR/etc/topology.conf" 644 && changed=1
    render_slurmdbd_conf | write_if_changed "$DIR/etc/slurmdbd.conf" 600 && changed=1
    return $((1 - changed))
}

# --- daemons -------------------------------------------------------------------------------

start_munge() {
    running munged && return 0
    mkdir -p "$DIR/munge"
    [[ -s $DIR/munge/munge.key ]] || mungekey -c -k "$DIR/munge/munge.key"
    chown -R munge:munge "$DIR/munge"
    chmod 755 "$DIR/munge" # munged insists on these modes
    chmod 600 "$DIR/munge/munge.key"
    rm -f "$DIR/munge/munge.sock"
    runuser -u munge -- munged --socket="$DIR/munge/munge.sock" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
    wait_for 10 munge -S "$DIR/munge/munge.sock" -n || die "munged did not start ($DIR/munge/munged.log)"
}

start_mariadb() {
    local d=$DIR/mariadb fresh=0
    running mariadbd && return 0
    mkdir -p "$d"
    if [[ ! -d $d/data/mysql ]]; then
        fresh=1
        mariadb-install-db --no-defaults --user=root --datadir="$d/data" --skip-test-db \
            --auth-root-authentication-method=normal >"$DIR/log/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed ($DIR/log/mariadb-install.log)"
    fi
    # --no-defaults: nothing from /etc/mysql (the machine's own server) applies here.
    setsid mariadbd --no-defaults --user=root --datadir="$d/data" --socket="$d/mariadbd.sock" \
        --port="$DB_PORT" --bind-address=127.0.0.1 --pid-file="$d/mariadbd.pid" \
        --skip-name-resolve --innodb-buffer-pool-size=64M --log-error="$DIR/log/mariadb.err" \
        </dev/null >/dev/null 2>&1 &
    wait_for 30 mariadb-admin --no-defaults --socket="$d/mariadbd.sock" ping ||
        die "mariadbd did not start ($DIR/log/mariadb.err)"
    wait_for 10 running mariadbd || die "mariadbd wrote no pid file"
    if ((fresh)); then
        local pw
        pw=$(<"$DIR/etc/db.password")
        mariadb --no-defaults --socket="$d/mariadbd.sock" -e "
            CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
            CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pw';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
    fi
}

build_bind_shim() {
    [[ -s $DIR/shim/bind_loopback.so ]] && return 0
    cat >"$DIR/shim/bind_loopback.c" <<'EOF'
/* LD_PRELOAD shim: bind(0.0.0.0 | ::) becomes bind(127.0.0.1 | ::1). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static int (*real_bind)(int, const struct sockaddr *, socklen_t);
  if (!real_bind) real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
  if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in a; memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (struct sockaddr *)&a, sizeof a);
    }
  } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a; memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      a.sin6_addr = in6addr_loopback;
      return real_bind(fd, (struct sockaddr *)&a, sizeof a);
    }
  }
  return real_bind(fd, addr, len);
}
EOF
    gcc -shared -fPIC -O2 -o "$DIR/shim/bind_loopback.so" "$DIR/shim/bind_loopback.c" -ldl
}

start_slurmdbd() {
    if ! running slurmdbd; then
        build_bind_shim
        LD_PRELOAD=$DIR/shim/bind_loopback.so slurmdbd
        wait_for 30 tcp_open "$DBD_PORT" || die "slurmdbd did not start ($DIR/log/slurmdbd.log)"
    fi
    if [[ ! -e $DIR/state/.accounts ]]; then
        # -i: no prompt; "already exists" is fine.
        sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
        sacctmgr -i add account research Description=test Organization=test >/dev/null 2>&1 || true
        sacctmgr -i add user "root,$REST_USER" account=research >/dev/null 2>&1 || true
        sacctmgr -n -P show assoc where user="$REST_USER" format=account | grep -qx research ||
            die "could not create the accounting associations"
        touch "$DIR/state/.accounts"
    fi
}

nodes_ready() { # every node responds and is not down, drained or invalid
    local states
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
    [[ $(wc -l <<<"$states") -eq $NODES ]] || return 1
    ! grep -Eq ' (down|drain|drng|drained|inval|fail|unk|boot|futr|npc|maint|resv|plnd)\*?$|\*$' <<<"$states"
}

start_slurmctld_and_nodes() {
    local node
    # -i: start even if some saved state cannot be read
    running slurmctld || slurmctld -i
    for node in "${NODE_NAMES[@]}"; do
        mkdir -p "$DIR/spool/$node"
        running "$node" || slurmd -N "$node"
    done
    wait_for 30 bash -c 'timeout 3 scontrol ping | grep -q UP' || die "slurmctld did not start ($DIR/log/slurmctld.log)"
    if ! wait_for 20 nodes_ready; then
        # A node drained by an earlier bad registration stays drained: resume it once.
        scontrol update nodename="gpu-node[1-$NODES]" state=resume >/dev/null 2>&1 || true
        wait_for 20 nodes_ready || {
            sinfo -N -l >&2 || true
            die "nodes are not ready ($DIR/log)"
        }
    fi
}

start_slurmrestd() {
    if running slurmrestd; then
        # Alive is not enough: one that does not answer on its port is started again (every
        # REST test would fail against it), and so is one whose working directory was
        # deleted (a checkout removed since it started): it fails every job submit on
        # getcwd and stops answering.
        local cwd
        cwd=$(readlink "/proc/$(daemon_pid slurmrestd)/cwd" 2>/dev/null || true)
        if [[ $cwd != *" (deleted)" ]] && wait_for 5 tcp_open "$REST_PORT"; then
            return 0
        fi
        log "slurmrestd does not listen on $REST_PORT or its directory is gone: restarting it"
        stop_daemons 10 slurmrestd
    fi
    id "$REST_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$REST_USER"
    # slurmrestd refuses root: -u drops privileges after it opened its socket. SLURM_JWT=daemon
    # makes it talk to slurmctld with JWT, which rest_auth/jwt needs.
    # From / : a directory of its own that no checkout's removal takes away.
    (cd / && SLURM_JWT=daemon exec setsid slurmrestd -u "$REST_USER" -g "$REST_USER" \
        -s openapi/v0.0.38,openapi/dbv0.0.38 -a rest_auth/jwt "127.0.0.1:$REST_PORT" \
        </dev/null >>"$DIR/log/slurmrestd.log" 2>&1) &
    echo $! >"$(pidfile_of slurmrestd)"
    wait_for 15 tcp_open "$REST_PORT" || die "slurmrestd did not start ($DIR/log/slurmrestd.log)"
}

check_loopback_only() {
    python3 - "$DB_PORT" "$CTLD_PORT" "$SLURMD_PORT" "$DBD_PORT" "$REST_PORT" \
        $(seq "$NODE_PORT0" $((NODE_PORT0 + NODES - 1))) <<'EOF'
import sys
ours = {int(p) for p in sys.argv[1:]}
bad = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        fields = row.split()
        if fields[3] != "0A":  # LISTEN
            continue
        address, port = fields[1].split(":")
        loopback = address in ("0100007F", "00000000000000000000000001000000")
        if int(port, 16) in ours and not loopback:
            bad.append(f"{table}: port {int(port, 16)} on {address}")
if bad:
    sys.exit("listening beyond loopback: " + "; ".join(bad))
EOF
}

print_env() {
    local token
    token=$(scontrol token username="$REST_USER" lifespan=86400 2>/dev/null | sed -n 's/^SLURM_JWT=//p')
    [[ -n $token ]] || die "scontrol token failed"
    printf 'export SLURM_CONF=%q\n' "$SLURM_CONF"
    printf 'export GANTRY_SLURM_REST_URL=%q\n' "http://127.0.0.1:$REST_PORT"
    printf 'export GANTRY_SLURM_REST_USER=%q\n' "$REST_USER"
    printf 'export GANTRY_SLURM_TOKEN=%q\n' "$token"
    printf 'export GANTRY_SLURM_JOB_DIR=%q\n' "$DIR/jobs"
    printf 'export GANTRY_SLURM_GPU_TYPE=%q\n' "$GPU_TYPE"
}

# --- commands ------------------------------------------------------------------------------

cmd_up() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (it starts daemons as other users)"
    local t0=$SECONDS first=0
    [[ -f $DIR/etc/slurm.conf ]] || first=1
    mkdir -p "$DIR/log"
    install_packages
    if write_configs && ((!first)); then
        log "configuration changed: restarting the daemons"
        stop_daemons 15 slurmrestd "${NODE_NAMES[@]}" slurmctld slurmdbd
    fi
    if ((first)); then
        local port
        for port in "$DB_PORT" "$CTLD_PORT" "$SLURMD_PORT" "$DBD_PORT" "$REST_PORT" $(seq "$NODE_PORT0" $((NODE_PORT0 + NODES - 1))); do
            tcp_open "$port" && die "port $port on 127.0.0.1 is taken (set GANTRY_SLURM_PORT_BASE)"
        done
    fi
    getent hosts "$HOST" | grep -q '^127\.' || log "warning: $HOST does not resolve to 127.x; srun may fail"
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurmctld_and_nodes
    start_slurmrestd
    check_loopback_only || die "a daemon listens beyond 127.0.0.1"
    ((SECONDS - t0 < 2)) || log "up in $((SECONDS - t0)) s ($DIR)"
    print_env
}

cmd_down() {
    local purge=0 names=() name
    for name in "$@"; do
        case $name in
        --purge) purge=1 ;;
        slurmd) names+=("${NODE_NAMES[@]}") ;;
        munged | mariadbd | slurmdbd | slurmctld | slurmrestd | gpu-node*) names+=("$name") ;;
        *) die "unknown daemon '$name' (munged mariadbd slurmdbd slurmctld slurmd slurmrestd)" ;;
        esac
    done
    [[ -d $DIR ]] || return 0
    if ((${#names[@]})); then
        # slurmctld saves the jobs' state as it stops: killed, it would lose running jobs.
        stop_daemons 30 "${names[@]}"
        return 0
    fi
    stop_daemons 10 slurmrestd "${NODE_NAMES[@]}"
    stop_daemons 30 slurmctld
    stop_daemons 10 slurmdbd
    stop_daemons 30 mariadbd munged
    if ((purge)); then
        log "deleting $DIR"
        rm -rf -- "$DIR"
    fi
}

cmd_status() {
    local name ok=0 pid
    for name in munged mariadbd slurmdbd slurmctld "${NODE_NAMES[@]}" slurmrestd; do
        if pid=$(daemon_pid "$name"); then
            printf '%-11s running (pid %s)\n' "$name" "$pid"
        else
            printf '%-11s stopped\n' "$name"
            ok=1
        fi
    done
    if running slurmctld; then sinfo -N -p gpu -o '%N %t %G' 2>/dev/null || true; fi
    return $ok
}

cmd_env() {
    running slurmctld || die "the cluster is not up (scripts/slurm-cluster.sh up)"
    print_env
}

case ${1:-} in
up) cmd_up ;;
down)
    shift
    cmd_down "$@"
    ;;
status) cmd_status ;;
env) cmd_env ;;
-h | --help | help | "") sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" ;;
*) die "unknown command '$1' (up, down [DAEMON…|--purge], status, env)" ;;
esac
