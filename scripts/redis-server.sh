#!/usr/bin/env bash
# Starts, stops and checks a real Redis server on 127.0.0.1 for the Redis tests.
#
# Usage: scripts/redis-server.sh start|stop|status
#
#   start   find a Redis server (or install one, first time only), start it in the
#           background on 127.0.0.1, wait until it answers PING, and print
#           FORKHIVE_REDIS_URL=... as the last stdout line. Reuses a server from an earlier
#           `start` if it still answers.
#   stop    stop the server from the pid file (TERM, then KILL after 5 s). Succeeds if
#           nothing is running.
#   status  print FORKHIVE_REDIS_URL=... and exit 0 if the server answers, else exit 1.
#
# Which server: `redis-server` on PATH if there is one; else a user-space install that needs
# no root — Debian's own packages (redis-tools, libjemalloc2, liblzf1), fetched with
# `apt-get download` and unpacked with `dpkg -x` under target/redis/root. The server keeps
# nothing on disk (no RDB, no AOF): every start is empty.
#
# Environment:
#   FORKHIVE_REDIS_PORT   port on 127.0.0.1 (default 16379)
#
# Everything (the install, server.log, server.pid) lives under target/redis/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/target/redis"
LOG="$DIR/server.log"
PIDFILE="$DIR/server.pid"
PORT="${FORKHIVE_REDIS_PORT:-16379}"
HOST=127.0.0.1
URL="redis://$HOST:$PORT"
PACKAGES=(redis-tools libjemalloc2 liblzf1)

log() { echo "redis-server.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# True if a Redis server answers PING on the port (bash's /dev/tcp: no client needed).
answers() {
    local reply
    reply="$(
        {
            exec 3<>"/dev/tcp/$HOST/$PORT" && printf 'PING\r\n' >&3 && read -r -t 2 line <&3 &&
                echo "$line"
        } 2>/dev/null
    )" || return 1
    [[ "$reply" == +PONG* ]]
}

alive() {
    kill -0 "$1" 2>/dev/null || return 1
    if [[ -r "/proc/$1/stat" ]]; then
        local stat
        stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
        stat="${stat##*) }"
        [[ "${stat:0:1}" != Z ]] || return 1
    fi
}

# The server this checkout started on the port, found by its command line (Redis shows
# `<binary> <host>:<port>`) when the pid file is gone or stale.
find_ours() {
    command -v pgrep >/dev/null 2>&1 || return 1
    local pid
    pid="$(pgrep -f "^$DIR/bin/redis-server $HOST:$PORT" | head -n 1)"
    [[ -n "$pid" ]] && alive "$pid" || return 1
    echo "$pid" >"$PIDFILE"
    echo "$pid"
}

running_pid() {
    [[ -f "$PIDFILE" ]] || {
        find_ours
        return
    }
    local pid
    pid="$(tr -dc '0-9' <"$PIDFILE")"
    [[ -n "$pid" ]] && alive "$pid" || return 1
    # A stale pid file must not make us signal an unrelated process that took its pid.
    if [[ -r "/proc/$pid/cmdline" ]]; then
        local cmd
        cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
        [[ "$cmd" == *redis* ]] || return 1
    fi
    echo "$pid"
}

# Sets SERVER (the binary) and SERVER_ENV (what it needs to run).
locate() {
    SERVER_ENV=()
    if command -v redis-server >/dev/null 2>&1; then
        SERVER="$(command -v redis-server)"
        return 0
    fi
    local local_root="$DIR/root"
    # Debian ships the server as redis-check-rdb, which acts as redis-server when named so.
    if [[ -x "$local_root/usr/bin/redis-check-rdb" ]]; then
        mkdir -p "$DIR/bin"
        ln -sf "$local_root/usr/bin/redis-check-rdb" "$DIR/bin/redis-server"
        SERVER="$DIR/bin/redis-server"
        local libs
        libs="$(find "$local_root/usr/lib" -maxdepth 2 -type d 2>/dev/null | paste -sd: -)"
        SERVER_ENV=("LD_LIBRARY_PATH=${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
        return 0
    fi
    return 1
}

install() {
    command -v apt-get >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1 ||
        die "no redis-server on PATH, and no apt-get/dpkg to fetch Debian's (install Redis)"
    mkdir -p "$DIR/debs" "$DIR/root"
    log "fetching ${PACKAGES[*]} (Debian packages, unpacked without root) ..."
    (cd "$DIR/debs" && apt-get download "${PACKAGES[@]}" >"$DIR/install.log" 2>&1) || {
        log "apt-get download failed; refreshing the package lists (needs root) ..."
        if [[ "$(id -u)" == 0 ]]; then
            apt-get update -q >>"$DIR/install.log" 2>&1 || true
            (cd "$DIR/debs" && apt-get download "${PACKAGES[@]}" >>"$DIR/install.log" 2>&1) ||
                die "could not download ${PACKAGES[*]} (see $DIR/install.log)"
        else
            die "could not download ${PACKAGES[*]} (see $DIR/install.log)"
        fi
    }
    local deb
    for deb in "$DIR"/debs/*.deb; do
        dpkg -x "$deb" "$DIR/root"
    done
}

start() {
    mkdir -p "$DIR"
    if answers; then
        if running_pid >/dev/null; then
            echo "FORKHIVE_REDIS_URL=$URL"
            return 0
        fi
        die "something else answers on port $PORT (set FORKHIVE_REDIS_PORT)"
    fi
    locate || { install && locate; } || die "no Redis server after installing"
    log "starting $SERVER on $HOST:$PORT"
    # Its own session: `stop` signals the whole group.
    env "${SERVER_ENV[@]}" setsid "$SERVER" --bind "$HOST" --port "$PORT" --save '' \
        --appendonly no --dir "$DIR" --protected-mode yes >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    local i
    for ((i = 0; i < 100; i++)); do
        if answers; then
            echo "FORKHIVE_REDIS_URL=$URL"
            return 0
        fi
        alive "$(cat "$PIDFILE")" || break
        sleep 0.1
    done
    log "the server did not answer; last lines of $LOG:"
    tail -n 20 "$LOG" >&2 || true
    stop
    exit 1
}

stop() {
    local pid
    if pid="$(running_pid)"; then
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        local i
        for ((i = 0; i < 50; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
        fi
        log "stopped server (pid $pid)"
    fi
    rm -f "$PIDFILE"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status)
    if answers; then
        echo "FORKHIVE_REDIS_URL=$URL"
    else
        exit 1
    fi
    ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
