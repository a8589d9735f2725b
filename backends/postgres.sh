#!/usr/bin/env bash
# Manage the local (Debian-packaged) PostgreSQL server used by the aiofragno
# test suite.
#
# Usage: backends/postgres.sh {start|stop|restart|status|wait}
#
#   start    start the cluster if it is not running (no-op otherwise), wait
#            until it accepts TCP connections, check that trust auth over TCP
#            works and make sure the database "$PG_TEST_DB" exists
#   stop     fast shutdown (rolls back open transactions, disconnects
#            clients); no-op if already stopped
#   restart  stop + start (works when stopped, too)
#   status   exit 0 if the server answers on PGHOST:PGPORT, 3 if not
#   wait     wait (up to PG_WAIT_TIMEOUT seconds) until the server accepts
#            TCP connections on PGHOST:PGPORT
#
# Environment:
#   PGHOST           host to connect to            (default 127.0.0.1)
#   PGPORT           port to connect to            (default 5432)
#   PGUSER           superuser to connect as       (default postgres)
#   PG_TEST_DB       database created by "start"   (default test)
#   PG_WAIT_TIMEOUT  seconds for "wait"/"start"    (default 60)
#   PG_VERSION       cluster version               (default: newest in /etc/postgresql)
#   PG_CLUSTER       cluster name                  (default main)
#
# Exit codes: 0 ok, 1 failure, 2 PostgreSQL not installed / no cluster /
# usage error, 3 "status": not running.
set -euo pipefail

PGHOST="${PGHOST:-127.0.0.1}"
PGPORT="${PGPORT:-5432}"
PGUSER="${PGUSER:-postgres}"
PG_TEST_DB="${PG_TEST_DB:-test}"
PG_WAIT_TIMEOUT="${PG_WAIT_TIMEOUT:-60}"
PG_CLUSTER="${PG_CLUSTER:-main}"
export PGHOST PGPORT PGUSER
# Never prompt for a password: trust auth is expected.
unset PGPASSWORD || true
export PGCONNECT_TIMEOUT="${PGCONNECT_TIMEOUT:-3}"

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() {
    local code="$1"
    shift
    log "ERROR: $*"
    exit "$code"
}

usage() {
    echo "usage: $0 {start|stop|restart|status|wait}" >&2
    exit 2
}

# Run a command as root (directly when we are root, via sudo otherwise).
as_root() {
    if [[ ${EUID} -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        "$@"
    fi
}

find_cluster() {
    if ! command -v pg_ctlcluster >/dev/null 2>&1 || [[ ! -d /etc/postgresql ]]; then
        die 2 "PostgreSQL is not installed; apt-get install postgresql"
    fi
    if [[ -z "${PG_VERSION:-}" ]]; then
        # Newest version that has our cluster configured.
        PG_VERSION="$(
            for d in /etc/postgresql/*/"${PG_CLUSTER}"; do
                [[ -d "$d" ]] && basename "$(dirname "$d")"
            done | sort -V | tail -n 1
        )"
    fi
    if [[ -z "${PG_VERSION}" || ! -d "/etc/postgresql/${PG_VERSION}/${PG_CLUSTER}" ]]; then
        die 2 "PostgreSQL is installed but no cluster '${PG_CLUSTER}' exists in /etc/postgresql" \
            "(create one with: pg_createcluster <version> ${PG_CLUSTER})"
    fi
    for tool in pg_isready psql createdb; do
        command -v "$tool" >/dev/null 2>&1 ||
            die 2 "PostgreSQL client tool '$tool' not found; apt-get install postgresql-client"
    done
}

ctl() {
    # fd 9 (our lock) is closed so that the postmaster does not inherit it.
    as_root pg_ctlcluster --skip-systemctl-redirect "$@" "${PG_VERSION}" "${PG_CLUSTER}" 9>&-
}

# True if the cluster's postmaster is running (whatever it listens on).
cluster_running() {
    # pg_ctlcluster status: 0 running, 3 not running, 4 no/invalid data dir.
    local rc=0
    as_root pg_ctlcluster --skip-systemctl-redirect "${PG_VERSION}" "${PG_CLUSTER}" status \
        >/dev/null 2>&1 || rc=$?
    [[ $rc -eq 0 ]]
}

answering() {
    pg_isready -q -h "${PGHOST}" -p "${PGPORT}" -t 2
}

cluster_port() {
    pg_lsclusters -h 2>/dev/null | awk -v v="${PG_VERSION}" -v c="${PG_CLUSTER}" \
        '$1 == v && $2 == c { print $3 }'
}

do_wait() {
    local deadline=$((SECONDS + PG_WAIT_TIMEOUT))
    until answering; do
        if ((SECONDS >= deadline)); then
            log "PostgreSQL did not accept connections on ${PGHOST}:${PGPORT} within ${PG_WAIT_TIMEOUT}s"
            pg_isready -h "${PGHOST}" -p "${PGPORT}" -t 1 >&2 || true
            return 1
        fi
        sleep 0.2
    done
}

check_tcp_auth() {
    local out
    if ! out="$(psql -X -w -h "${PGHOST}" -p "${PGPORT}" -U "${PGUSER}" -d postgres \
        -Atc 'select 1' 2>&1)"; then
        log "cannot log in as '${PGUSER}' over TCP at ${PGHOST}:${PGPORT} without a password:"
        printf '  %s\n' "$out" >&2
        if [[ "$out" != *password* && "$out" != *pg_hba.conf* ]]; then
            die 1 "connection check failed (see above)"
        fi
        die 1 "the tests need trust auth over TCP. Add this line near the top of" \
            "/etc/postgresql/${PG_VERSION}/${PG_CLUSTER}/pg_hba.conf and run '$0 restart':" \
            $'\n  host all all 127.0.0.1/32 trust'
    fi
}

ensure_db() {
    local exists
    exists="$(psql -X -w -h "${PGHOST}" -p "${PGPORT}" -U "${PGUSER}" -d postgres -Atc \
        "select 1 from pg_database where datname = '${PG_TEST_DB}'")"
    if [[ "$exists" != "1" ]]; then
        log "creating database ${PG_TEST_DB}"
        createdb -w -h "${PGHOST}" -p "${PGPORT}" -U "${PGUSER}" "${PG_TEST_DB}"
    fi
}

do_start() {
    if cluster_running; then
        log "cluster ${PG_VERSION}/${PG_CLUSTER} already running"
    else
        log "starting cluster ${PG_VERSION}/${PG_CLUSTER}"
        # pg_ctlcluster creates /var/run/postgresql itself and waits for startup.
        if ! ctl start; then
            log "pg_ctlcluster start failed; last lines of the server log:"
            tail -n 20 "/var/log/postgresql/postgresql-${PG_VERSION}-${PG_CLUSTER}.log" >&2 || true
            exit 1
        fi
    fi
    if ! do_wait; then
        local port
        port="$(cluster_port)"
        if [[ -n "$port" && "$port" != "${PGPORT}" ]]; then
            log "note: cluster ${PG_VERSION}/${PG_CLUSTER} is configured for port ${port}, not ${PGPORT}"
        fi
        exit 1
    fi
    check_tcp_auth
    ensure_db
    log "ready on ${PGHOST}:${PGPORT} (database ${PG_TEST_DB})"
}

do_stop() {
    if ! cluster_running; then
        log "cluster ${PG_VERSION}/${PG_CLUSTER} already stopped"
        return 0
    fi
    log "stopping cluster ${PG_VERSION}/${PG_CLUSTER}"
    # -m fast: roll back open transactions and disconnect clients, clean shutdown.
    # pg_ctlcluster waits until the postmaster is gone; exit 2 = was not running.
    local rc=0
    ctl -m fast stop || rc=$?
    if [[ $rc -ne 0 && $rc -ne 2 ]]; then
        die 1 "pg_ctlcluster stop failed (exit $rc)"
    fi
}

do_status() {
    if answering; then
        echo "postgresql ${PG_VERSION}/${PG_CLUSTER}: running, accepting connections on ${PGHOST}:${PGPORT}"
        return 0
    fi
    if cluster_running; then
        echo "postgresql ${PG_VERSION}/${PG_CLUSTER}: running, but NOT accepting connections on ${PGHOST}:${PGPORT}"
    else
        echo "postgresql ${PG_VERSION}/${PG_CLUSTER}: stopped"
    fi
    return 3
}

# shellcheck source=backends/_commands.sh
source "$(dirname "${BASH_SOURCE[0]}")/_commands.sh"
check_command "$@"
find_cluster
run_command postgres "$1"
