#!/usr/bin/env bash
# Manage the local Redis server that the outbox relay tests publish to. It
# keeps nothing on disk (no RDB snapshots, no AOF): test data only.
#
# Usage: backends/redis.sh {start|stop|restart|status|wait}
#
#   start    start redis-server if nothing answers (no-op otherwise) and wait
#            until it does
#   stop     SHUTDOWN NOSAVE; no-op if stopped
#   restart  stop + start
#   status   exit 0 if Redis answers PING on REDIS_HOST:REDIS_PORT, 3 if not
#   wait     wait (up to REDIS_WAIT_TIMEOUT seconds) until it answers
#
# Environment:
#   REDIS_HOST          address to connect to        (default 127.0.0.1)
#   REDIS_PORT          port                         (default 6379)
#   REDIS_DIR           working directory            (default /var/lib/redis)
#   REDIS_LOG           log file                     (default /var/log/redis/ci.log)
#   REDIS_WAIT_TIMEOUT  seconds for "wait"/"start"   (default 30)
#
# Exit codes: 0 ok, 1 failure, 2 Redis not installed / usage error,
# 3 "status": not answering.
set -euo pipefail

REDIS_HOST="${REDIS_HOST:-127.0.0.1}"
REDIS_PORT="${REDIS_PORT:-6379}"
REDIS_DIR="${REDIS_DIR:-/var/lib/redis}"
REDIS_LOG="${REDIS_LOG:-/var/log/redis/ci.log}"
REDIS_WAIT_TIMEOUT="${REDIS_WAIT_TIMEOUT:-30}"

log() { printf 'redis.sh: %s\n' "$*" >&2; }
usage() {
    echo "usage: $0 {start|stop|restart|status|wait}" >&2
    exit 2
}

check_installed() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        log "ERROR: Redis is not installed; apt-get install redis-server"
        exit 2
    fi
}

cli() { redis-cli -h "${REDIS_HOST}" -p "${REDIS_PORT}" "$@"; }
probe() { [[ "$(cli ping 2>/dev/null)" == PONG ]]; }

wait_ready() {
    local deadline=$((SECONDS + REDIS_WAIT_TIMEOUT))
    until probe; do
        if ((SECONDS >= deadline)); then
            log "Redis did not answer on ${REDIS_HOST}:${REDIS_PORT} within ${REDIS_WAIT_TIMEOUT}s"
            [[ -r "${REDIS_LOG}" ]] && tail -n 20 "${REDIS_LOG}" >&2
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
    mkdir -p "${REDIS_DIR}" "$(dirname "${REDIS_LOG}")"
    log "starting redis-server"
    redis-server --daemonize yes --bind "${REDIS_HOST}" -::1 --port "${REDIS_PORT}" \
        --save "" --appendonly no --dir "${REDIS_DIR}" --logfile "${REDIS_LOG}" 9>&-
    wait_ready
    log "ready on ${REDIS_HOST}:${REDIS_PORT}"
}

do_stop() {
    if probe; then
        cli shutdown nosave >/dev/null 2>&1 || true
    fi
}

do_status() {
    if probe; then
        echo "redis: running, answering on ${REDIS_HOST}:${REDIS_PORT}"
        return 0
    fi
    echo "redis: not answering on ${REDIS_HOST}:${REDIS_PORT}"
    return 3
}

do_wait() { wait_ready; }

# shellcheck source=backends/_commands.sh
source "$(dirname "${BASH_SOURCE[0]}")/_commands.sh"
check_command "$@"
check_installed
run_command redis "$1"
