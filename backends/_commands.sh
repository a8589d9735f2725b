# shellcheck shell=bash
# Sourced by postgres.sh and mariadb.sh: the subcommand check, the lock that
# serialises start/stop/restart between concurrent callers (e.g. parallel
# tests), and the dispatch to the script's do_start/do_stop/do_status/do_wait.

# check_command ARGS...: exactly one known subcommand, else usage.
check_command() {
    [[ $# -eq 1 ]] || usage
    case "$1" in
    start | stop | restart | status | wait) ;;
    *) usage ;;
    esac
}

# run_command NAME COMMAND: take the lock (except for read-only commands) and run it.
run_command() {
    local name=$1 command=$2
    if [[ "$command" != status && "$command" != wait ]] && command -v flock >/dev/null 2>&1; then
        if { exec 9>>"${TMPDIR:-/tmp}/aiofragno-backend-${name}.lock"; } 2>/dev/null; then
            flock 9
        fi
    fi
    case "$command" in
    start) do_start ;;
    stop) do_stop ;;
    restart)
        do_stop
        do_start
        ;;
    status) do_status ;;
    wait) do_wait ;;
    esac
}
