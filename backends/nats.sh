#!/usr/bin/env bash
# Manage the local NATS server (with JetStream) that the outbox relay tests
# publish to.
#
# Usage: backends/nats.sh {start|stop|restart|status|wait}
#
#   start    start nats-server with JetStream if nothing answers (no-op
#            otherwise) and wait until it does
#   stop     SIGTERM (SIGKILL after NATS_STOP_TIMEOUT seconds) to the server
#            "start" ran (its pid file); no-op if stopped
#   restart  stop + start
#   status   exit 0 if a NATS server with JetStream answers on
#            NATS_HOST:NATS_PORT, 3 if not
#   wait     wait (up to NATS_WAIT_TIMEOUT seconds) until it answers
#
# Environment:
#   NATS_HOST          address to listen on / connect to   (default 127.0.0.1)
#   NATS_PORT          port                                (default 4222)
#   NATS_STORE_DIR     JetStream's storage directory       (default /var/lib/nats-server)
#   NATS_LOG           log file                            (default /var/log/nats-server.log)
#   NATS_WAIT_TIMEOUT  seconds for "wait"/"start"          (default 30)
#   NATS_STOP_TIMEOUT  seconds to wait for a clean stop    (default 10)
#   NATS_SERVER        server binary                       (default /usr/sbin/nats-server)
#   NATS_PIDFILE       the pid of the server "start" ran   (default $TMPDIR/aiofragno-nats-PORT.pid)
#
# Exit codes: 0 ok, 1 failure, 2 nats-server not installed / usage error,
# 3 "status": not answering.
set -euo pipefail

NATS_HOST="${NATS_HOST:-127.0.0.1}"
NATS_PORT="${NATS_PORT:-4222}"
NATS_STORE_DIR="${NATS_STORE_DIR:-/var/lib/nats-server}"
NATS_LOG="${NATS_LOG:-/var/log/nats-server.log}"
NATS_WAIT_TIMEOUT="${NATS_WAIT_TIMEOUT:-30}"
NATS_STOP_TIMEOUT="${NATS_STOP_TIMEOUT:-10}"
NATS_SERVER="${NATS_SERVER:-/usr/sbin/nats-server}"
NATS_PIDFILE="${NATS_PIDFILE:-${TMPDIR:-/tmp}/aiofragno-nats-${NATS_PORT}.pid}"

log() { printf 'nats.sh: %s\n' "$*" >&2; }
usage() {
    echo "usage: $0 {start|stop|restart|status|wait}" >&2
    exit 2
}

check_installed() {
    if [[ ! -x "${NATS_SERVER}" ]]; then
        log "ERROR: nats-server is not installed; apt-get install nats-server"
        exit 2
    fi
}

# A server answers when it greets a TCP client with its INFO line, which
# says "jetstream":true when JetStream is on.
probe() {
    local line
    { exec 3<>"/dev/tcp/${NATS_HOST}/${NATS_PORT}"; } 2>/dev/null || return 1
    read -r -t 2 line <&3 || line=""
    exec 3<&-
    [[ "$line" == INFO* && "$line" == *'"jetstream":true'* ]]
}

wait_ready() {
    local deadline=$((SECONDS + NATS_WAIT_TIMEOUT))
    until probe; do
        if ((SECONDS >= deadline)); then
            log "no NATS server with JetStream answered on ${NATS_HOST}:${NATS_PORT} within ${NATS_WAIT_TIMEOUT}s"
            [[ -r "${NATS_LOG}" ]] && tail -n 20 "${NATS_LOG}" >&2
            return 1
        fi
        sleep 0.1
    done
}

do_start() {
    if probe; then
        log "already running"
        return 0
    fi
    mkdir -p "${NATS_STORE_DIR}"
    log "starting ${NATS_SERVER}"
    start-stop-daemon --start --oknodo --background --make-pidfile --pidfile "${NATS_PIDFILE}" \
        --exec "${NATS_SERVER}" -- \
        -a "${NATS_HOST}" -p "${NATS_PORT}" -js -sd "${NATS_STORE_DIR}" -l "${NATS_LOG}" 9>&-
    wait_ready
    log "ready on ${NATS_HOST}:${NATS_PORT}"
}

do_stop() {
    if [[ ! -e "${NATS_PIDFILE}" ]]; then
        probe && log "the server on ${NATS_HOST}:${NATS_PORT} was not started by this script: not stopping it"
        return 0
    fi
    start-stop-daemon --stop --oknodo --quiet --pidfile "${NATS_PIDFILE}" --exec "${NATS_SERVER}" \
        --retry="TERM/${NATS_STOP_TIMEOUT}/KILL/5"
    rm -f "${NATS_PIDFILE}"
}

do_status() {
    if probe; then
        echo "nats: running, JetStream answering on ${NATS_HOST}:${NATS_PORT}"
        return 0
    fi
    echo "nats: not answering on ${NATS_HOST}:${NATS_PORT}"
    return 3
}

do_wait() { wait_ready; }

# shellcheck source=backends/_commands.sh
source "$(dirname "${BASH_SOURCE[0]}")/_commands.sh"
check_command "$@"
check_installed
run_command nats "$1"
