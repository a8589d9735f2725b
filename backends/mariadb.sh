#!/usr/bin/env bash
# Manage the local (Debian-packaged) MariaDB server used by the aiofragno
# test suite.
#
# Usage: backends/mariadb.sh {start|stop|restart|status|wait}
#
#   start    start mariadbd if it is not running (no-op otherwise), wait until
#            "SELECT 1" works over TCP and make sure the database
#            "$MARIADB_TEST_DB" exists
#   stop     graceful shutdown (SIGTERM, waits for the process to exit;
#            SIGKILL only after MARIADB_STOP_TIMEOUT seconds); no-op if stopped
#   restart  stop + start (works when stopped, too); meant to be usable by
#            tests that bounce the server while clients are connected
#   status   exit 0 if the server answers on MARIADB_HOST:MARIADB_PORT, 3 if not
#   wait     wait (up to MARIADB_WAIT_TIMEOUT seconds) until
#            `mariadb -u$MARIADB_USER -h$MARIADB_HOST -e 'select 1'` works
#
# Environment:
#   MARIADB_HOST          host to connect to                 (default 127.0.0.1)
#   MARIADB_PORT          port to connect to                 (default 3306)
#   MARIADB_USER          user to connect as                 (default root)
#   MARIADB_PASSWORD      its password                       (default empty)
#   MARIADB_TEST_DB       database created by "start"        (default test)
#   MARIADB_WAIT_TIMEOUT  seconds for "wait"/"start"         (default 60)
#   MARIADB_STOP_TIMEOUT  seconds to wait for a clean stop   (default 60)
#   MARIADBD              server binary                      (default /usr/sbin/mariadbd)
#
# Exit codes: 0 ok, 1 failure, 2 MariaDB not installed / usage error,
# 3 "status": not answering.
set -euo pipefail

MARIADB_HOST="${MARIADB_HOST:-127.0.0.1}"
MARIADB_PORT="${MARIADB_PORT:-3306}"
MARIADB_USER="${MARIADB_USER:-root}"
MARIADB_PASSWORD="${MARIADB_PASSWORD:-}"
MARIADB_TEST_DB="${MARIADB_TEST_DB:-test}"
MARIADB_WAIT_TIMEOUT="${MARIADB_WAIT_TIMEOUT:-60}"
MARIADB_STOP_TIMEOUT="${MARIADB_STOP_TIMEOUT:-60}"
MARIADBD="${MARIADBD:-/usr/sbin/mariadbd}"
ERROR_LOG="/var/log/mysql/error.log"

log() { printf 'mariadb.sh: %s\n' "$*" >&2; }
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

check_installed() {
    if [[ ! -x "${MARIADBD}" ]] || ! command -v mariadb >/dev/null 2>&1; then
        die 2 "MariaDB is not installed; apt-get install mariadb-server mariadb-client"
    fi
    command -v start-stop-daemon >/dev/null 2>&1 ||
        die 2 "start-stop-daemon not found (it is part of Debian's dpkg package)"
}

# mariadb client over TCP; extra arguments are passed through.
client() {
    MYSQL_PWD="${MARIADB_PASSWORD}" mariadb --protocol=TCP \
        -h "${MARIADB_HOST}" -P "${MARIADB_PORT}" -u "${MARIADB_USER}" \
        --connect-timeout=2 "$@"
}

# True while a mariadbd process (not a zombie) exists.
process_running() {
    start-stop-daemon --status --exec "${MARIADBD}" >/dev/null 2>&1
}

# Try "SELECT 1". Returns 0 on success, 1 if the server does not answer;
# exits with a clear message if it answers but refuses our login.
probe() {
    local out
    if out="$(client -N -e 'select 1' 2>&1)"; then
        return 0
    fi
    if [[ "$out" == *"Access denied"* ]]; then
        die 1 "MariaDB answers on ${MARIADB_HOST}:${MARIADB_PORT} but refuses" \
            "'${MARIADB_USER}' with the given (default: empty) password: ${out}"
    fi
    return 1
}

show_error_log() {
    if [[ -r "${ERROR_LOG}" ]]; then
        log "last lines of ${ERROR_LOG}:"
        tail -n 20 "${ERROR_LOG}" >&2 || true
    fi
}

# wait_ready [started_at]: with started_at (a $SECONDS value), give up early
# when the server process has died after a short grace period.
wait_ready() {
    local started_at="${1:-}"
    local deadline=$((SECONDS + MARIADB_WAIT_TIMEOUT))
    until probe; do
        if ((SECONDS >= deadline)); then
            log "MariaDB did not answer on ${MARIADB_HOST}:${MARIADB_PORT} within ${MARIADB_WAIT_TIMEOUT}s"
            return 1
        fi
        if [[ -n "$started_at" ]] && ((SECONDS - started_at >= 2)) && ! process_running; then
            log "mariadbd exited during startup"
            return 1
        fi
        sleep 0.1
    done
}

ensure_db() {
    client -e "CREATE DATABASE IF NOT EXISTS \`${MARIADB_TEST_DB}\`"
}

do_start() {
    local started_at=""
    if probe; then
        log "already running"
    else
        if ! process_running; then
            # /run is a tmpfs on most machines: recreate the socket/pid dir.
            if id mysql >/dev/null 2>&1; then
                as_root install -d -o mysql -g mysql -m 0755 /run/mysqld
            fi
            local -a args=()
            # mariadbd refuses to run as root unless told which user to be.
            # Debian's config normally says "user = mysql"; add it if missing.
            if [[ ${EUID} -eq 0 ]] && ! "${MARIADBD}" --print-defaults 2>/dev/null | grep -q -- '--user='; then
                args=(-- --user=mysql)
            fi
            log "starting ${MARIADBD}"
            as_root start-stop-daemon --start --oknodo --background --exec "${MARIADBD}" "${args[@]}" 9>&-
            started_at=$SECONDS
        else
            log "mariadbd process exists but does not answer yet; waiting"
        fi
        if ! wait_ready "$started_at"; then
            show_error_log
            exit 1
        fi
    fi
    ensure_db
    log "ready on ${MARIADB_HOST}:${MARIADB_PORT} (database ${MARIADB_TEST_DB})"
}

do_stop() {
    if ! process_running; then
        log "already stopped"
        return 0
    fi
    log "stopping mariadbd"
    # SIGTERM makes mariadbd do a normal shutdown (connections are killed,
    # InnoDB shuts down cleanly). --retry waits until the process is gone.
    if ! as_root start-stop-daemon --stop --oknodo --quiet --exec "${MARIADBD}" \
        --retry="TERM/${MARIADB_STOP_TIMEOUT}/KILL/5"; then
        die 1 "could not stop mariadbd"
    fi
}

do_status() {
    if probe; then
        echo "mariadb: running, answering on ${MARIADB_HOST}:${MARIADB_PORT}"
        return 0
    fi
    if process_running; then
        echo "mariadb: process running, but NOT answering on ${MARIADB_HOST}:${MARIADB_PORT}"
    else
        echo "mariadb: stopped"
    fi
    return 3
}

do_wait() { wait_ready; }

# shellcheck source=backends/_commands.sh
source "$(dirname "${BASH_SOURCE[0]}")/_commands.sh"
check_command "$@"
check_installed
run_command mariadb "$1"
