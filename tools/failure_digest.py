#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-3.0-or-later
"""Print why a `make test` part failed, in a few lines, for the end of its output.

CI keeps only the tail of what `make test` prints, and a failing Ansible task (molecule's converge, a lab test's
playbook) is reported hundreds of lines above it.  This reads the logs named on the command line and prints each
failed task with the lines that carry its message, and pytest's one-line FAILED/ERROR summaries, bounded in size.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# molecule frames the playbook's output with box-drawing characters, and pytest prefixes a failed assertion's text
# with "E"; neither carries anything.
FRAME = re.compile(r"^\s*(?:[│└┌─]+|E(?=\s))\s*")
TASK = re.compile(r"^TASK \[(?P<name>.*)")
FAILED_TASK = re.compile(r"^(fatal|failed): \[")
# ansible-core's one-line account of a failed task, printed above its result.
TASK_ERROR = re.compile(r"^\[ERROR\]: ")
PYTEST_SUMMARY = re.compile(r"^(FAILED|ERROR) \S")
MAX_LINE = 600
MAX_LINES_PER_FAILURE = 8
MAX_FAILURES = 12
IGNORED_LOOKAHEAD = 200


def clean(line: str) -> str:
    return FRAME.sub("", ANSI.sub("", line.rstrip("\n")))


def ignored(following: list[str]) -> bool:
    """Whether the failed result that these lines follow ends with ansible's "...ignoring" (ignore_errors)."""
    for raw in following:
        text = clean(raw)
        if text.startswith("...ignoring"):
            return True
        if TASK.match(text) or text.startswith("PLAY RECAP"):
            return False
    return False


def digest(lines: list[str]) -> list[str]:
    out: list[str] = []
    task = ""
    reported_task = None
    # ansible-core's one-line account comes before the task's result, which may still say "...ignoring".
    pending_error: str | None = None
    failures = 0

    def report(block: list[str]) -> None:
        nonlocal reported_task, failures
        if reported_task != task:
            failures += 1
            reported_task = task
            out.append(f"task [{task}]")
        out.extend("  " + text[:MAX_LINE] for text in block)

    for index, raw in enumerate(lines):
        line = clean(raw)
        if TASK.match(line) or PYTEST_SUMMARY.match(line):
            if pending_error and failures < MAX_FAILURES:
                report([pending_error])
            pending_error = None
        match = TASK.match(line)
        if match:
            task = match.group("name").rstrip("*] ")
            reported_task = None
        elif PYTEST_SUMMARY.match(line):
            out.append(line[:MAX_LINE])
        elif TASK_ERROR.match(line):
            pending_error = line
        elif FAILED_TASK.match(line) and failures < MAX_FAILURES:
            block = [line]
            for follow in lines[index + 1:index + MAX_LINES_PER_FAILURE]:
                text = clean(follow)
                if not text or TASK.match(text) or FAILED_TASK.match(text) or TASK_ERROR.match(text):
                    break
                block.append(text)
            if not ignored(lines[index + 1:index + IGNORED_LOOKAHEAD]):
                report(([pending_error] if pending_error else []) + block)
            pending_error = None
    if pending_error and failures < MAX_FAILURES:
        report([pending_error])
    return out


def main(paths: list[str]) -> int:
    for path in paths:
        log = Path(path)
        if not log.is_file():
            continue
        found = digest(log.read_text(errors="replace").splitlines())
        if found:
            print(f"=== what failed, from {path}")
            print("\n".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
