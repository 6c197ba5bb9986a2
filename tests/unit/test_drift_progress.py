# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden drift's progress on stderr: on a terminal, a status line at once (before any host has finished), rewritten
below the host lines as hosts finish and cleared before the report; in a log or a pipe (or TERM=dumb), only the plain
host lines, with no carriage return or escape code; nothing with --quiet; never on stdout.  ansible-runner is replaced
by a fake that feeds a real run's events (as in test_drift_interrupt.py)."""

from __future__ import annotations

import io

import pytest

from gpuharden import cli, drift, drift_check, drift_run, drift_terminal
from tests.unit.test_drift_interrupt import _audited, _event, _stats, site  # noqa: F401 (site: the fixture)

CLEAR = "\r\x1b[K"


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def _events(hosts):
    return [_event("runner_on_start", host) for host in hosts] + [_audited(host) for host in hosts] + [_stats(*hosts)]


@pytest.fixture
def run_drift(site, monkeypatch):  # noqa: F811 (the imported fixture)
    """drift run over two hosts with ``stream`` as stderr; the stream's text as the first event came in, and stdout."""
    inventory, playbook = site["inventory"], site["playbook"]
    seen_first = []

    def run_playbook(playbook, inventory, *, limit, forks, extravars, tags=None, event_handler=None, cancel=None, timeout=None):
        seen_first.append(stream_of[0].getvalue())
        for event in _events(["gpu-a", "gpu-b"]):
            event_handler(event)
        return "successful", 0, {}, "PLAY RECAP"

    monkeypatch.setattr(drift_run, "run_playbook", run_playbook)
    monkeypatch.setattr(drift_check, "cluster_side_runner", lambda: None)
    stream_of = []

    def run(stream, *extra):
        stream_of[:] = [stream]
        out = io.StringIO()
        args = cli.build_parser().parse_args(["drift", "-i", str(inventory), "--playbook", str(playbook), "--report", str(site["report"]),
                                              *extra])
        code = drift.run(args, stream=stream, out=out)
        return code, seen_first[-1], stream.getvalue(), out.getvalue()

    return run


def test_on_a_terminal_a_status_line_at_once_then_updated_and_cleared(run_drift, monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    _code, before_first_host, err, out = run_drift(FakeTerminal())
    assert before_first_host.startswith("gpuharden drift: checking, no host finished yet (0 s)"), repr(before_first_host)
    assert "\n" not in before_first_host
    assert CLEAR + "[1/2] gpu-a: 0 finding(s)\ngpuharden drift: 1 of 2 host(s) started so far finished (" in err
    assert CLEAR + "[2/2] gpu-b: 0 finding(s)\ngpuharden drift: 2 of 2 host(s) started so far finished (" in err
    # cleared before whatever comes next on stderr: the status line is never left behind
    progress_part = err[:err.rindex(CLEAR) + len(CLEAR)]
    assert progress_part.endswith("s)" + CLEAR), repr(progress_part[-200:])
    assert "\r" not in out and "\x1b" not in out and "gpuharden drift: checking" not in out


@pytest.mark.parametrize("terminal", [False, True])
def test_in_a_log_only_plain_host_lines(run_drift, monkeypatch, terminal):
    monkeypatch.setenv("TERM", "dumb" if terminal else "xterm")
    _code, before_first_host, err, out = run_drift(FakeTerminal() if terminal else io.StringIO())
    assert before_first_host == ""
    assert err.startswith("[1/2] gpu-a: 0 finding(s)\n[2/2] gpu-b: 0 finding(s)\n"), repr(err[:300])
    assert "\r" not in err and "\x1b" not in err and "checking" not in err


def test_quiet_prints_no_progress_even_on_a_terminal(run_drift, monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    _code, before_first_host, err, _out = run_drift(FakeTerminal(), "--quiet")
    assert before_first_host == "" and "[1/2]" not in err and "\r" not in err


def test_json_goes_to_stdout_without_progress(run_drift, monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    _code, _before, err, out = run_drift(FakeTerminal(), "--json")
    assert out.lstrip().startswith("{") and "[1/2]" not in out and "\r" not in out
    assert "[1/2] gpu-a" in err


def test_the_status_line_fits_one_row(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "30")
    stream = FakeTerminal()
    progress = drift_terminal.progress(stream)
    progress(1, 2, "gpu-a", "0 finding(s)")
    progress.end()
    progress(2, 2, "gpu-b", "0 finding(s)")
    assert stream.getvalue() == ("gpuharden drift: checking, no"
                                 + CLEAR + "[1/2] gpu-a: 0 finding(s)\n" + "gpuharden drift: 1 of 2 host(" + CLEAR
                                 + "[2/2] gpu-b: 0 finding(s)\n")
