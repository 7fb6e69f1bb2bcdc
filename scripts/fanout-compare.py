#!/usr/bin/env python3
"""Compares two builds of `fanout_bench` on this machine, in one batch.

    python3 scripts/fanout-compare.py NEW_BIN OLD_BIN RUNS [fanout_bench options...]

Runs the two binaries in turn (new, old, then old, new, ...) RUNS times each, so that a
machine whose speed drifts during the batch weighs on both alike, and prints each one's
median `per_child_us` and their ratio (new / old). Build each side with
`cargo build --release --example fanout_bench` (an older revision in a `git worktree` with
its own `CARGO_TARGET_DIR`) and pass the two `target/release/examples/fanout_bench` copies.
"""
import json
import statistics
import subprocess
import sys


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    new, old, runs, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    seen = {new: [], old: []}
    for i in range(runs):
        for binary in (new, old) if i % 2 == 0 else (old, new):
            out = subprocess.run([binary, *args], capture_output=True, text=True, check=True)
            seen[binary].append(json.loads(out.stdout.strip().splitlines()[-1])["per_child_us"])
    n, o = statistics.median(seen[new]), statistics.median(seen[old])
    print(
        f"{' '.join(args) or '(defaults)'}: new {n:.2f} us, old {o:.2f} us per child "
        f"(medians of {runs}); new/old {n / o:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
