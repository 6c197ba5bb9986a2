# SPDX-License-Identifier: GPL-3.0-or-later
"""The drift report on a terminal (pure: report dict and width in, text out).

What a person reads first is what the run could not check, with the cause and the fix (one line, never cut: a log
reader or `head -1` gets it whole).  Then one row per node, then every finding at or above the run's fail severity
with its expected and found values and its reason, then every part of a check that was not checked or refused.  Each
row is wrapped to the width given (the terminal's, or COLUMNS), never cut: a reason is always there to read in full;
``width=None`` (``--wide``) writes each field on one line, however long.
"""

from __future__ import annotations

import json
import shutil
import textwrap

from gpuharden import coverage
from gpuharden.severity import SEVERITIES, counted

# Where the width comes from when the output is not a terminal and COLUMNS is not set (a log, a pipe).
DEFAULT_WIDTH = 120
# Narrower than this, wrapping would leave no room for the text.
MIN_WIDTH = 40
INDENT = "    "
LABEL_WIDTH = 10


def terminal_width(stream=None):
    """COLUMNS, else the terminal's width, else DEFAULT_WIDTH (shutil.get_terminal_size's order), at least MIN_WIDTH."""
    del stream  # shutil reads COLUMNS, then sys.__stdout__'s terminal
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def _text(value):
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return " ".join(str(text).split())


def _wrap(text, width, first, rest):
    """``text`` after ``first`` on the first line and ``rest`` on the others, each line at most ``width`` (None: one line)."""
    if width is None:
        return [first + text]
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=rest, break_long_words=True,
                         break_on_hyphens=False) or [first.rstrip()]


def _field(label, value, width):
    first = INDENT + (label + ":").ljust(LABEL_WIDTH)
    return _wrap(_text(value), width, first, " " * len(first))


def _columns(rows, width):
    """Left-aligned columns, the last one wrapped under itself (or under an indent, where it starts too far right)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    start = sum(widths) + 2 * len(widths)
    out = []
    for row in rows:
        head = "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  "
        rest = " " * start if width is None or start <= width // 2 else INDENT
        if width is not None and len(head) > width:
            out += _wrap(head.rstrip(), width, "", INDENT)
            out += _wrap(row[-1], width, rest, rest)
        else:
            out += _wrap(row[-1], width, head, rest)
    return out


def _where(entry):
    gpu = entry.get("gpu")
    gpu = gpu.get("index") if isinstance(gpu, dict) else gpu
    return entry.get("path") or entry.get("subject") or ("GPU%s" % gpu if gpu is not None else "")


def _finding_lines(label, entry, width):
    where = _where(entry)
    lines = _wrap("%s %s" % (entry["id"], where) if where else entry["id"], width,
                  "%s  %s  %s  " % (label, entry["check"], entry["severity"]), INDENT)
    for key, name in (("expected", "expected"), ("found", "found"), ("hint", "why")):
        if entry.get(key) not in (None, ""):
            lines += _field(name, entry[key], width)
    return lines


def render(report, width=DEFAULT_WIDTH):
    spots = coverage.blind_spots(report)
    out = []
    headline = coverage.headline(spots)
    if headline:
        out += [headline, ""]
    rows = [("NODE", "STATUS", "FINDINGS", "STAGES TO RUN")]
    for host, node in sorted(report["nodes"].items()):
        counts = {}
        for entry in node["findings"]:
            counts[entry["severity"]] = counts.get(entry["severity"], 0) + 1
        text = ", ".join("%d %s" % (counts[s], s) for s in reversed(SEVERITIES) if s in counts) or "-"
        rows.append((host, node["status"].replace("_", " "), text, ", ".join(node["remediable_stages"]) or "-"))
    for section in ("unreachable", "failed"):
        for host in report[section]:
            rows.append((host, section, "-", "- (see NOT CHECKED)"))
    out += _columns(rows, width)
    details = []
    for host, node in sorted(report["nodes"].items()):
        for entry in counted(node["findings"], report["fail_severity"]):
            details += _finding_lines(host, entry, width)
    for entry in counted(report.get("cluster", {}).get("findings", []), report["fail_severity"]):
        details += _finding_lines("(cluster)", entry, width)
    if details:
        out += ["", "FINDINGS (node, check, severity, finding)"] + details
    if spots:
        out += ["", "NOT CHECKED (never counted as clean or as drift)"]
        for spot in spots:
            out += _wrap(spot["what"] if spot["what"] != spot["check"] else spot["check"], width,
                         "%s  %s  " % ("(cluster)" if spot["scope"] == "cluster" else spot["node"], spot["check"]), INDENT)
            out += _field("cause", spot["cause"], width) + _field("fix", spot["fix"], width)
    refused = [(host, part) for host, node in sorted(report["nodes"].items()) for part in node.get(coverage.REFUSED) or []]
    if refused:
        out += ["", "REFUSED (outside what gpuharden changes safely; left as it is)"]
        for host, part in refused:
            out += _wrap(part["what"], width, "%s  %s  " % (host, part["check"]), INDENT)
            out += _field("why", part.get("why"), width) + _field("fix", part.get("fix"), width)
    summary = report["summary"]
    out.append("")
    line = ("%d node(s): %d clean, %d drifted, %d need attention (hardware, workloads or a setting to choose), %d not checked "
            "(in part), %d unreachable, %d failed; %d finding(s) in %.1f s"
            % (summary["nodes"], summary["clean"], summary["drifted"], summary.get("attention", 0), summary.get("not_checked", 0),
               summary["unreachable"], summary["failed"], summary["findings"], report["duration_seconds"]))
    if summary.get("cluster_not_checked"):
        line += "; cluster side not checked: %s" % ", ".join(summary["cluster_not_checked"])
    out += _wrap(line, width, "", "")
    return "\n".join(out)
