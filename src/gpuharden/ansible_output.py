# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading what ansible-playbook (or ``ansible``) printed, for the one message a failed run is shown as.

Pure functions over the text ansible-runner captured (its ``stdout``, ansible's stdout and stderr together): the run
is started with ANSIBLE_NOCOLOR=1, and ANSI codes are stripped anyway (a callback or a wrapper may still colour).
The reports themselves come from ansible-runner's events, never from this text; only a run that failed before or
beside its events (a YAML error, an unknown --limit, an empty inventory) is explained from it.
"""

from __future__ import annotations

import re

# CSI sequences (colours, cursor movement) and the two-character escapes; OSC (hyperlinks) up to BEL or ST.
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# Where an error of ansible-core's own starts: "[ERROR]: " (ansible-core 2.19 and later), "ERROR! " (before 2.19),
# a task's "fatal: [host]" / "failed: [host] (item=...)", a Python traceback.
ERROR_START = re.compile(r"^(?:\[ERROR\]:|ERROR!|fatal: \[|failed: \[|Traceback \(most recent call last\)|An exception occurred)")
# Lines that start the next part of the output: an error's block ends there.
SECTION = re.compile(r"^(?:PLAY \[|TASK \[|RUNNING HANDLER \[|PLAY RECAP|NO MORE HOSTS LEFT|\[WARNING\]:|\[DEPRECATION WARNING\]:)")
RECAP_ROW = re.compile(r"^\S+\s+: ok=\d+")
# ansible-core's exit codes (lib/ansible/errors/__init__.py, ExitCode; the TaskQueueManager's are bit flags).
EXIT_MEANINGS = {
    0: "success",
    1: "an error",
    2: "a host failed",
    4: "a host unreachable, or a parse error",
    5: "bad or incomplete options",
    99: "interrupted",
    250: "an unexpected error",
}
# What ansible prints when a pattern or an inventory gives no host (lib/ansible/cli/__init__.py, get_host_list;
# cli/adhoc.py; the PlaybookExecutor's "skipping: no hosts matched"); the older ERROR! wording of the limit too.
NO_HOSTS_TEXTS = (
    "leaves us with no hosts to target",
    "does not match any hosts",
    "provided hosts list is empty",
    "No hosts matched",
    "no hosts matched",
)
UNMATCHED = re.compile(r"Could not match supplied host pattern, ignoring: (.+)")
INVENTORY_PROBLEM = re.compile(r"^\[WARNING\]:.*(?:inventory source|Failed to parse)")


def strip_ansi(text):
    """``text`` without terminal escape sequences, with carriage returns (the pty's \\r\\n) as plain newlines."""
    return ANSI.sub("", text or "").replace("\r\n", "\n").replace("\r", "\n")


def describe_exit(status, rc):
    """How ansible-runner says a run ended, in words that never call a failure successful: ``exit code 4 (a host
    unreachable, or a parse error)``; for a run that did not get to its end, ansible-runner's status."""
    if status in ("successful", "failed") and rc is not None:
        meaning = EXIT_MEANINGS.get(rc, "an error" if rc else "success")
        return "exit code %s, %s" % (rc, meaning)
    return "ansible-runner status %s%s" % (status, "" if rc is None else ", exit code %s" % rc)


def error_excerpt(text, max_lines=14, width=300, others=3):
    """The first meaningful error of ansible's output, as lines: the first "[ERROR]:" / "ERROR!" / "fatal: [host]"
    line and what belongs to it (a YAML error's origin and context, a task result's msg) up to ``max_lines``, then
    the first line of up to ``others`` further errors (another host's fatal line).  Without any error line: the last
    few lines of output that are no play, task or recap lines.  "" when there is no output."""
    lines = [line.rstrip() for line in strip_ansi(text).split("\n")]
    starts = [index for index, line in enumerate(lines) if ERROR_START.match(line)]
    if not starts:
        tail = [line[:width] for line in lines if line.strip() and not SECTION.match(line) and not RECAP_ROW.match(line)]
        return "\n".join(tail[-5:])
    block = []
    for line in lines[starts[0]:]:
        if block and (SECTION.match(line) or ERROR_START.match(line) or RECAP_ROW.match(line)):
            break
        if not line.strip() and (not block or not block[-1].strip()):
            continue  # one blank line at most between two lines of the block
        block.append(line[:width])
    while block and not block[-1].strip():
        block.pop()
    if len(block) > max_lines:
        block = block[:max_lines] + ["..."]
    further = []
    for index in starts[1:]:
        line = lines[index][:width]
        if line not in block and line not in further:
            further.append(line)
    if len(further) > others:
        further = further[:others] + ["... and %d more error(s)" % (len(further) - others)]
    return "\n".join(block + further)


def indent(text, prefix="  "):
    return "\n".join(prefix + line if line.strip() else "" for line in text.split("\n")) if text else ""


def no_hosts(text, *, inventory, limit=None, unmatched_plays=(), pattern_variable=None):
    """Why a run had no host to work on, as (what matched nothing: "inventory", "limit" or "pattern", the reason),
    or None when its output does not say so.  For a run that ran nothing on any
    host: in a run that did, "no hosts matched" may be a later play's (harden's rollout play, with nothing to roll out).

    ``unmatched_plays``: the hosts patterns of the plays ansible skipped with "no hosts matched" (from the runner's
    playbook_on_no_hosts_matched events, ``play_pattern``); ``pattern_variable``: (name, default) of the variable
    the playbook's hosts pattern comes from, to name it."""
    text = strip_ansi(text)
    if not unmatched_plays and not any(marker in text for marker in NO_HOSTS_TEXTS):
        return None
    problems = sorted({line.strip() for line in text.split("\n") if INVENTORY_PROBLEM.match(line.strip())})
    names = []
    for match in UNMATCHED.findall(text):
        names += [name.strip() for name in match.split(",") if name.strip() and name.strip() not in names]
    if "provided hosts list is empty" in text:
        kind, reason = "inventory", "the inventory %s has no hosts" % inventory
    elif limit and ("leaves us with no hosts to target" in text or "does not match any hosts" in text):
        kind, reason = "limit", "-l %s matches no host of the inventory %s" % (limit, inventory)
    else:
        kind = "pattern"
        patterns = ", ".join(sorted(set(unmatched_plays))) or "?"
        reason = "the play's hosts pattern %s" % patterns
        if pattern_variable:
            reason += " (%s, default %s)" % pattern_variable
        reason += " matches no host of the inventory %s%s" % (inventory, " within -l %s" % limit if limit else "")
    if names:
        reason += "; no group or host named %s" % ", ".join(names)
    if problems:
        reason += "; ansible said: %s" % " ".join(problems)
    return kind, reason
