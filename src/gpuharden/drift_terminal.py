# SPDX-License-Identifier: GPL-3.0-or-later
"""What `gpuharden drift` shows a person: the progress lines on stderr, the report as a table (or JSON) on stdout, and
the message of a run that did not finish."""

from __future__ import annotations

import json
import os
import shutil
import time

from gpuharden import ansible_output, coverage, terminal


def table(report, width=terminal.DEFAULT_WIDTH):
    """The report for a terminal: what could not be checked first, each finding's reason wrapped to ``width`` (None:
    unwrapped, --wide)."""
    return terminal.render(report, width)


class Progress:
    """The run's progress on ``stream`` (stderr), a line per host as it finishes ("[done/seen] host: result").  On a
    terminal, also a status line at once, before any host has finished (a slow fleet can take many seconds to the
    first result), kept below the host lines and rewritten as hosts finish, and cleared by end() before the report is
    printed.  Not in a log or a pipe (not a TTY, or TERM=dumb): there carriage returns and escape codes would be noise,
    so only the host lines go there, as before."""

    CLEAR_LINE = "\r\x1b[K"

    def __init__(self, stream):
        self.stream = stream
        self.live = bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb"
        self.started = time.monotonic()
        self.done = self.seen = 0
        if self.live:
            self._write(self._status())

    def __call__(self, done, seen, host, text):
        line = "[%d/%d] %s: %s\n" % (done, seen, host, text)
        if self.live:
            self.done, self.seen = done, seen
            self._write(self.CLEAR_LINE + line + self._status())
        else:
            self._write(line)

    def _status(self):
        seconds = int(time.monotonic() - self.started)
        if not self.seen:
            text = "gpuharden drift: checking, no host finished yet (%d s)" % seconds
        else:
            text = "gpuharden drift: %d of %d host(s) started so far finished (%d s)" % (self.done, self.seen, seconds)
        # one terminal row, or the carriage return would rewrite only its last row
        return text[:max(1, shutil.get_terminal_size((80, 24)).columns - 1)]

    def end(self):
        """Clear the status line (the report comes next); later host lines are plain ones."""
        if self.live:
            self._write(self.CLEAR_LINE)
            self.live = False

    def _write(self, text):
        self.stream.write(text)
        self.stream.flush()


def progress(stream):
    return Progress(stream)


def explain_incomplete(error, args, stream):
    """What an incomplete run says on stderr: why, that nothing was written, and the hosts without a final result.
    Never a table or a summary line (a consumer of stdout must not mistake it for a report)."""
    files = [path for path in (args.report, args.prometheus, getattr(args, "html", None)) if path]
    lines = ["gpuharden drift: INCOMPLETE, %s: no report written%s" % (
        error.reason, (" (left as they were: %s)" % ", ".join(files)) if files else "")]
    if error.details:
        lines.append("gpuharden drift: ansible-playbook said:\n" + ansible_output.indent(error.details))
    if error.pending:
        lines.append("gpuharden drift: no final result for %d host(s): %s" % (len(error.pending), ", ".join(error.pending)))
    elif error.hosts_known:
        lines.append("gpuharden drift: every host had answered, but the run was stopped before its report")
    if not error.hosts_known:
        lines.append("gpuharden drift: the play's host list could not be read: hosts the run had not started are not named")
    if error.checked:
        lines.append("gpuharden drift: answered before the stop, not reported: %s" % ", ".join(error.checked))
    stream.write("\n".join(lines) + "\n")
    stream.flush()


def show(report, args, out, stream):
    """The report on stdout: JSON, or the table, which opens with what could not be checked.  With --json, that line
    goes to stderr, so that it still comes first where a person reads."""
    if args.json:
        line = coverage.headline(report.get(coverage.NOT_CHECKED) or [])
        if line:
            stream.write("gpuharden drift: %s\n" % line)
            stream.flush()
        out.write(json.dumps(report, indent=2, sort_keys=True) + "\n")
    else:
        out.write(table(report, None if getattr(args, "wide", False) else terminal.terminal_width()) + "\n")
