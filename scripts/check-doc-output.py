#!/usr/bin/env python3
"""Checks that the measured output quoted in the docs is what the commands print today.

A ```text block right after a line `<!-- output of: COMMAND -->` is checked: COMMAND runs
(from the repository root), and every non-blank line of the block must be a line of its
output. Task ids (an `a` and eight base-36 characters) and runs of spaces are normalised on
both sides, so only ids and column widths may differ. Exits 1 naming each stale line.
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARK = re.compile(r"<!-- output of: (.+?) -->\n+```text\n(.*?)\n```", re.S)
TASK_ID = re.compile(r"\ba[0-9a-z]{8}\b")


def norm(line: str) -> str:
    return " ".join(TASK_ID.sub("<id>", line).split())


def main() -> int:
    stale = 0
    for page in sorted((ROOT / "docs").glob("*.md")):
        for m in MARK.finditer(page.read_text()):
            command, block = m.group(1), m.group(2)
            run = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{page.name}: `{command}` failed:\n{run.stderr}", file=sys.stderr)
                stale += 1
                continue
            printed = {norm(line) for line in run.stdout.splitlines()}
            for line in block.splitlines():
                if line.strip() and norm(line) not in printed:
                    print(f"{page.name}: `{command}` no longer prints: {line}", file=sys.stderr)
                    stale += 1
    if stale:
        return 1
    print("docs: every checked output block matches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
