#!/usr/bin/env bash
# PostgreSQL and Redis for the test suite and the benchmarks.
#
# Also installs Debian's docker-registry when /usr/bin/docker-registry is missing: the registry
# client's tests start their own registries with it (tests/registry_support.py). Likewise
# Debian's prometheus (and promtool) when /usr/bin/prometheus is missing: the telemetry source
# tests start their own Prometheus (tests/prometheus_support.py). Likewise Debian's chromium
# when /usr/bin/chromium is missing: the browser tests drive it headless through Playwright
# (tests/browser_support.py; Playwright never downloads a browser of its own). The packages'
# postinst does not start a service where policy-rc.d forbids it or PID 1 is not systemd.
#
# Uses the machine's standard servers (PostgreSQL on 127.0.0.1:5432 with trust auth for
# user postgres, Redis on 127.0.0.1:6379) when they answer. Otherwise it installs the
# Debian packages if they are missing and starts throwaway servers on private ports, bound
# to 127.0.0.1 only, with their data in a temporary directory.
#
#   scripts/test-services.sh exec -- CMD [ARG...]  start, run CMD with the environment,
#                                                  stop what was started, exit with CMD's status
#   eval "$(scripts/test-services.sh)"             start and export DATABASE_URL,
#                                                  CELERY_BROKER_URL (and GANTRY_TEST_SERVICES_STATE)
#   source scripts/test-services.sh                the same, into the current shell
#   scripts/test-services.sh stop [STATE_DIR]      stop what `start` started (default:
#                                                  $GANTRY_TEST_SERVICES_STATE); nothing else
#
# Knobs (environment):
#   DATABASE_URL, CELERY_BROKER_URL   already set: used as given, nothing is checked or started
#   GANTRY_TEST_SERVICES              auto (default) | standard | throwaway
#   GANTRY_TEST_PG_HOST/PORT          where the standard PostgreSQL is looked for (127.0.0.1:5432)
#   GANTRY_TEST_REDIS_HOST/PORT       where the standard Redis is looked for (127.0.0.1:6379)
#   GANTRY_TEST_PRIVATE_PG_PORT       first port tried for a throwaway PostgreSQL (55432)
#   GANTRY_TEST_PRIVATE_REDIS_PORT    first port tried for a throwaway Redis (56379)
#   GANTRY_TEST_DB_NAME               database name in DATABASE_URL (gantry)
#   GANTRY_TEST_REDIS_DB              Redis database number in CELERY_BROKER_URL (15)
#   GANTRY_TEST_SERVICES_TOOLS        1 (default) | 0: leave out the registry, Prometheus and
#                                     Chromium checks (only PostgreSQL and Redis, e.g. for a test
#                                     that starts servers of its own to restart them)

if [[ ${BASH_SOURCE[0]} != "$0" ]]; then
    # Sourced: run in a child shell so its strict mode and traps stay out of the caller's.
    if _gantry_test_env=$(bash "${BASH_SOURCE[0]}" start); then
        eval "$_gantry_test_env"
        unset _gantry_test_env
        return 0
    fi
    unset _gantry_test_env
    return 1
fi

set -euo pipefail

PG_HOST=${GANTRY_TEST_PG_HOST:-127.0.0.1}
PG_PORT=${GANTRY_TEST_PG_PORT:-5432}
REDIS_HOST=${GANTRY_TEST_REDIS_HOST:-127.0.0.1}
REDIS_PORT=${GANTRY_TEST_REDIS_PORT:-6379}
PRIVATE_PG_PORT=${GANTRY_TEST_PRIVATE_PG_PORT:-55432}
PRIVATE_REDIS_PORT=${GANTRY_TEST_PRIVATE_REDIS_PORT:-56379}
DB_NAME=${GANTRY_TEST_DB_NAME:-gantry}
REDIS_DB=${GANTRY_TEST_REDIS_DB:-15}
MODE=${GANTRY_TEST_SERVICES:-auto}
TOOLS=${GANTRY_TEST_SERVICES_TOOLS:-1}
STATE_PREFIX=gantry-test-services.
STATE=""

log() { printf 'test-services: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

case $MODE in auto | standard | throwaway) ;; *) die "GANTRY_TEST_SERVICES must be auto, standard or throwaway, not '$MODE'" ;; esac
case $TOOLS in 0 | 1) ;; *) die "GANTRY_TEST_SERVICES_TOOLS must be 0 or 1, not '$TOOLS'" ;; esac
[[ $DB_NAME =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "GANTRY_TEST_DB_NAME '$DB_NAME' is not a plain identifier"

# shellcheck disable=SC2016 # $0 and $1 are the inner shell's arguments
tcp_open() { timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; }

pg_usable() {
    local host=$1 port=$2
    if command -v pg_isready >/dev/null; then
        pg_isready -q -h "$host" -p "$port" -t 3 || return 1
    else
        tcp_open "$host" "$port" || return 1
    fi
    # Accepting connections is not enough: the tests log in as postgres without a password.
    if command -v psql >/dev/null; then
        PGCONNECT_TIMEOUT=3 psql -X -q -w -h "$host" -p "$port" -U postgres -d postgres \
            -Atc 'SELECT 1' >/dev/null 2>&1 || return 1
    fi
}

redis_usable() {
    local host=$1 port=$2 reply
    if command -v redis-cli >/dev/null; then
        reply=$(timeout 3 redis-cli -h "$host" -p "$port" ping 2>/dev/null) || return 1
    else
        # shellcheck disable=SC2016 # $0 and $1 are the inner shell's arguments
        reply=$(timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"; printf "PING\r\n" >&3; IFS= read -r line <&3; printf %s "$line"' \
            "$host" "$port" 2>/dev/null) || return 1
    fi
    [[ ${reply%$'\r'} == *PONG ]]
}

pg_bindir() {
    local dir
    dir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
    if [[ -n $dir && -x $dir/initdb ]]; then
        printf '%s\n' "$dir"
    elif command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        dirname "$(command -v initdb)"
    fi
}

install_packages() {
    (($#)) || return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        die "need $* for the tests: install them (apt-get install $*); PostgreSQL and Redis are not needed if they answer on $PG_HOST:$PG_PORT and $REDIS_HOST:$REDIS_PORT"
    fi
    log "installing $* with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "$@" >&2
}

free_port() {
    local port=$1 last=$(($1 + 20))
    while ((port <= last)); do
        if ! tcp_open 127.0.0.1 "$port"; then
            printf '%s\n' "$port"
            return 0
        fi
        port=$((port + 1))
    done
    die "no free port in $1..$last on 127.0.0.1"
}

# PostgreSQL refuses to run as root: as root, the server runs as the postgres system user.
pg_owner() {
    if [[ $(id -u) -ne 0 ]]; then
        id -un
    elif id postgres >/dev/null 2>&1; then
        printf 'postgres\n'
    else
        id gantry-test >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin gantry-test
        printf 'gantry-test\n'
    fi
}

as_user() {
    local user=$1
    shift
    if [[ $(id -un) == "$user" ]]; then
        "$@"
    else
        runuser -u "$user" -- "$@"
    fi
}

state_dir() {
    if [[ -z $STATE ]]; then
        STATE=$(mktemp -d "${TMPDIR:-/tmp}/${STATE_PREFIX}XXXXXX")
        chmod 755 "$STATE" # the postgres user must reach its data directory inside
        : >"$STATE/state"
    fi
}

record() { printf '%s=%q\n' "$1" "$2" >>"$STATE/state"; }

start_postgres() {
    local bindir owner port
    bindir=$(pg_bindir)
    owner=$(pg_owner)
    port=$(free_port "$PRIVATE_PG_PORT")
    state_dir
    install -d -o "$owner" -m 700 "$STATE/pg"
    log "starting a throwaway PostgreSQL ($bindir) as $owner on 127.0.0.1:$port in $STATE/pg"
    (
        cd "$STATE/pg"
        as_user "$owner" "$bindir/initdb" -D "$STATE/pg/data" -U postgres -A trust -E UTF8 \
            --no-locale --no-sync >"$STATE/pg-initdb.log" 2>&1
    ) || die "initdb failed: $(tail -n 20 "$STATE/pg-initdb.log")"
    record PG_BINDIR "$bindir"
    record PG_OWNER "$owner"
    record PG_DATA "$STATE/pg/data"
    (
        cd "$STATE/pg"
        # Durability is worthless for a throwaway test database; speed is not.
        as_user "$owner" "$bindir/pg_ctl" -D "$STATE/pg/data" -l "$STATE/pg/postgres.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $STATE/pg -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
            start >/dev/null
    ) || die "PostgreSQL did not start: $(tail -n 20 "$STATE/pg/postgres.log" 2>/dev/null)"
    PG_HOST=127.0.0.1
    PG_PORT=$port
    PSQL=$bindir/psql
}

start_redis() {
    local port
    port=$(free_port "$PRIVATE_REDIS_PORT")
    state_dir
    mkdir -p "$STATE/redis"
    log "starting a throwaway Redis on 127.0.0.1:$port in $STATE/redis"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
        --dir "$STATE/redis" --pidfile "$STATE/redis/redis.pid" --logfile "$STATE/redis/redis.log" >/dev/null
    record REDIS_PORT "$port"
    record REDIS_PIDFILE "$STATE/redis/redis.pid"
    local tries=0
    until redis_usable 127.0.0.1 "$port"; do
        ((++tries < 50)) || die "Redis did not start: $(tail -n 20 "$STATE/redis/redis.log" 2>/dev/null)"
        sleep 0.2
    done
    REDIS_HOST=127.0.0.1
    REDIS_PORT=$port
}

ensure_database() {
    local exists
    if ! command -v "$PSQL" >/dev/null; then
        log "no psql client: not checking that database $DB_NAME exists (pytest-django creates its own)"
        return 0
    fi
    exists=$(PGCONNECT_TIMEOUT=5 "$PSQL" -X -w -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -Atc \
        "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")
    if [[ $exists != 1 ]]; then
        # A concurrent run may create it first; what matters is that it exists afterwards.
        "$PSQL" -X -q -w -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres \
            -c "CREATE DATABASE \"$DB_NAME\"" >/dev/null 2>&1 || true
        exists=$("$PSQL" -X -w -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -Atc \
            "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")
        [[ $exists == 1 ]] || die "could not create database $DB_NAME on $PG_HOST:$PG_PORT"
    fi
}

cmd_stop() {
    local state=${1:-${GANTRY_TEST_SERVICES_STATE:-}}
    [[ -n $state ]] || return 0
    if [[ $(basename "$state") != "$STATE_PREFIX"* || ! -f $state/state ]]; then
        log "not a test-services state directory, leaving it alone: $state"
        return 0
    fi
    local PG_BINDIR="" PG_OWNER="" PG_DATA="" REDIS_PORT="" REDIS_PIDFILE="" pid
    # shellcheck disable=SC1091 # written by record() above
    source "$state/state"
    if [[ -n $PG_DATA && -f $PG_DATA/postmaster.pid ]]; then
        log "stopping the throwaway PostgreSQL in $PG_DATA"
        (cd "$state" && as_user "$PG_OWNER" "$PG_BINDIR/pg_ctl" -D "$PG_DATA" -m fast -w -t 60 stop >/dev/null) ||
            log "warning: pg_ctl stop failed for $PG_DATA"
    fi
    if [[ -n $REDIS_PIDFILE && -f $REDIS_PIDFILE ]]; then
        pid=$(<"$REDIS_PIDFILE")
        log "stopping the throwaway Redis on 127.0.0.1:$REDIS_PORT (pid $pid)"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "warning: Redis pid $pid did not stop"
        fi
    fi
    rm -rf -- "$state"
}

# Sets DATABASE_URL and CELERY_BROKER_URL, starting throwaway servers where needed.
start() {
    local need_pg=0 need_redis=0 missing=()
    if [[ -n ${DATABASE_URL:-} ]]; then
        log "PostgreSQL: DATABASE_URL from the environment"
    elif [[ $MODE != throwaway ]] && pg_usable "$PG_HOST" "$PG_PORT"; then
        log "PostgreSQL: the running server on $PG_HOST:$PG_PORT"
    elif [[ $MODE == standard ]]; then
        die "PostgreSQL does not answer on $PG_HOST:$PG_PORT (GANTRY_TEST_SERVICES=standard)"
    else
        [[ $MODE == throwaway ]] || log "PostgreSQL: nothing usable on $PG_HOST:$PG_PORT"
        need_pg=1
        [[ -n $(pg_bindir) ]] || missing+=(postgresql)
    fi
    if [[ -n ${CELERY_BROKER_URL:-} ]]; then
        log "Redis: CELERY_BROKER_URL from the environment"
    elif [[ $MODE != throwaway ]] && redis_usable "$REDIS_HOST" "$REDIS_PORT"; then
        log "Redis: the running server on $REDIS_HOST:$REDIS_PORT"
    elif [[ $MODE == standard ]]; then
        die "Redis does not answer on $REDIS_HOST:$REDIS_PORT (GANTRY_TEST_SERVICES=standard)"
    else
        [[ $MODE == throwaway ]] || log "Redis: nothing usable on $REDIS_HOST:$REDIS_PORT"
        need_redis=1
        command -v redis-server >/dev/null || missing+=(redis-server)
    fi
    if ((TOOLS)); then
        [[ -x /usr/bin/docker-registry ]] || missing+=(docker-registry)
        [[ -x /usr/bin/prometheus ]] || missing+=(prometheus)
        [[ -x /usr/bin/chromium ]] || missing+=(chromium)
    fi
    install_packages "${missing[@]}"

    PSQL=$(command -v psql || printf '%s/psql' "$(pg_bindir)")
    if ((need_pg)); then
        [[ -n $(pg_bindir) ]] || die "PostgreSQL server binaries (initdb, pg_ctl) not found"
        start_postgres
    fi
    if [[ -z ${DATABASE_URL:-} ]]; then
        ensure_database
        DATABASE_URL=postgres://postgres@$PG_HOST:$PG_PORT/$DB_NAME
    fi
    if ((need_redis)); then
        command -v redis-server >/dev/null || die "redis-server not found"
        start_redis
    fi
    if [[ -z ${CELERY_BROKER_URL:-} ]]; then
        CELERY_BROKER_URL=redis://$REDIS_HOST:$REDIS_PORT/$REDIS_DB
    fi
    export DATABASE_URL CELERY_BROKER_URL
    log "DATABASE_URL=$DATABASE_URL"
    log "CELERY_BROKER_URL=$CELERY_BROKER_URL"
    if [[ -n $STATE ]]; then
        export GANTRY_TEST_SERVICES_STATE=$STATE
    fi
}

cmd_start() {
    # A failed start leaves nothing running behind.
    trap 'status=$?; if ((status)); then cmd_stop "$STATE"; fi' EXIT
    start
    printf 'export DATABASE_URL=%q\n' "$DATABASE_URL"
    printf 'export CELERY_BROKER_URL=%q\n' "$CELERY_BROKER_URL"
    if [[ -n $STATE ]]; then
        printf 'export GANTRY_TEST_SERVICES_STATE=%q\n' "$STATE"
        log "started throwaway servers; stop them with: scripts/test-services.sh stop $STATE"
    fi
}

cmd_exec() {
    [[ ${1:-} == -- ]] && shift
    (($#)) || die "usage: $0 exec -- COMMAND [ARG...]"
    trap 'status=$?; cmd_stop "$STATE"; exit "$status"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    start
    local status=0
    "$@" || status=$?
    exit "$status"
}

case ${1:-start} in
start) cmd_start ;;
stop) cmd_stop "${2:-}" ;;
exec)
    shift
    cmd_exec "$@"
    ;;
-h | --help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0" ;;
*) die "unknown command '$1' (start, stop, exec -- CMD...)" ;;
esac
