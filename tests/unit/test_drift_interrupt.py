# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden drift: runs that did not finish never look clean (issue 12, item 5).

An interrupted (SIGINT, SIGTERM), timed-out or canceled run, or one whose playbook stopped before the end of the
play, exits 130/143/3, leaves the previous report and Prometheus file byte for byte as they were, prints no table or
summary, and names every host without a final result.  ansible-runner is replaced by a fake that feeds the events
a real run would; one test at the end runs the real ansible-runner on a local playbook (no lab)."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
import types

import pytest

from gpuharden import cli, drift, drift_check, drift_report, drift_run

PREVIOUS_REPORT = '{"previous": "report", "summary": {"nodes": 3}}\n'
PREVIOUS_METRICS = 'gpuharden_drift_node_drifted{node="gpu-b"} 1\ngpuharden_last_success_timestamp_seconds 1000.000\n'
PLAY_HOSTS = {"gpu-a", "gpu-b", "gpu-c"}


def _event(kind, host=None, action="gpuharden.k8s.node_stages", **res):
    data = {"host": host, "task_action": action, "task": "Audit the node", "res": res} if host else dict(res)
    return {"event": kind, "event_data": data}


def _started(*hosts):
    # drift_check.yml names every host's node once, on the play's first host
    return [_event("runner_on_start", host) for host in hosts] + [
        _event("runner_on_ok", hosts[0], action="gpuharden.k8s.drift_play", node_names={host: "node-" + host[-1] for host in hosts})]


def _audited(host, findings=()):
    return _event("runner_on_ok", host, findings=list(findings), summary={"findings": len(findings)}, checks={}, seconds=0.1)


def _stats(*hosts, dark=(), failures=()):
    return _event("playbook_on_stats", processed=dict.fromkeys(hosts, 1), ok=dict.fromkeys(hosts, 1),
                  dark=dict.fromkeys(dark, 1), failures=dict.fromkeys(failures, 1))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """An inventory, a playbook file, the previous run's report and metrics, and a fake host listing."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    playbook = tmp_path / "drift_check.yml"
    playbook.write_text("---\n")
    report, metrics = tmp_path / "report.json", tmp_path / "textfile" / "gpuharden.prom"
    metrics.parent.mkdir()
    report.write_text(PREVIOUS_REPORT)
    metrics.write_text(PREVIOUS_METRICS)
    past = time.time() - 3600
    for path in (report, metrics):
        os.utime(path, (past, past))
    listed = []

    def play_hosts(playbook, inventory, *, limit, extravars, stop=None, timeout=None):
        listed.append(limit)
        return set(limit.split(",")) & PLAY_HOSTS if limit else set(PLAY_HOSTS)

    monkeypatch.setattr(drift_run, "play_hosts", play_hosts)
    state = {"inventory": inventory, "playbook": playbook, "report": report, "metrics": metrics, "listed": listed}
    state["stat"] = {path: (path.read_bytes(), os.stat(path).st_mtime_ns) for path in (report, metrics)}
    return state


def _untouched(site):
    for path, (content, mtime) in site["stat"].items():
        assert path.read_bytes() == content, path
        assert os.stat(path).st_mtime_ns == mtime, path
    assert sorted(os.listdir(site["metrics"].parent)) == ["gpuharden.prom"]  # no temp file left either


def _fake_runner(monkeypatch, events, status, rc, *, signum=None, signal_after=None, calls=None):
    """run_playbook replaced: feeds ``events``; with ``signum``, delivers that signal to this process after
    ``signal_after`` events and checks that the cancel callback handed to ansible-runner now says stop."""

    def run_playbook(playbook, inventory, *, limit, forks, extravars, tags=None, event_handler=None, cancel=None, timeout=None):
        if calls is not None:
            calls.append({"playbook": playbook, "limit": limit, "tags": tags, "timeout": timeout})
        for index, event in enumerate(events):
            if signum is not None and index == signal_after:
                assert not cancel()
                os.kill(os.getpid(), signum)
                # the signal was taken by gpuharden's handler (no KeyboardInterrupt, no exit), and ansible-runner,
                # polling the callback, cancels the run
                assert cancel() is True
                return "canceled", 254, {}, ""
            event_handler(event)
        return status, rc, {}, "PLAY RECAP"

    monkeypatch.setattr(drift_run, "run_playbook", run_playbook)


def _drift(site, *extra):
    return cli.main(["drift", "-i", str(site["inventory"]), "--playbook", str(site["playbook"]), "--report", str(site["report"]),
                     "--prometheus", str(site["metrics"]), *extra])


def _no_clean_summary(out):
    assert out == ""  # no table, no summary line, no JSON document: nothing a consumer could take for a report
    assert "node(s):" not in out and "clean" not in out


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_item05_signal_mid_run_exits_128_plus_signal_and_writes_nothing(site, monkeypatch, capsys, signum, code):
    previous = {number: signal.getsignal(number) for number in drift_check.STOP_SIGNALS}
    events = _started("gpu-a", "gpu-b") + [_audited("gpu-a"), _audited("gpu-b"), _stats("gpu-a", "gpu-b")]
    _fake_runner(monkeypatch, events, "successful", 0, signum=signum, signal_after=4)
    assert _drift(site) == code
    out, err = capsys.readouterr()
    _untouched(site)
    _no_clean_summary(out)
    assert "INCOMPLETE, interrupted by %s" % signal.Signals(signum).name in err
    # gpu-a answered before the signal; gpu-b had started, gpu-c (from the play's host list) had not
    assert "no final result for 2 host(s): gpu-b, gpu-c" in err
    assert "answered before the stop, not reported: gpu-a" in err
    assert str(site["report"]) in err and str(site["metrics"]) in err
    assert site["listed"] == [None]
    # the handlers are put back: a later Ctrl-C is a Ctrl-C again
    assert {number: signal.getsignal(number) for number in drift_check.STOP_SIGNALS} == previous


def test_item05_sigint_while_the_cluster_side_runs_in_process_writes_nothing(site, monkeypatch, capsys):
    """The play finished and handed over the consistency check; a SIGINT while that check runs here (it hangs on the
    API server) ends the run at once as interrupted: no report, the previous files untouched."""
    hung = threading.Event()

    class Hanging:
        def run(self, options, node_reports):
            os.kill(os.getpid(), signal.SIGINT)
            hung.wait(30)
            return {"findings": []}

    monkeypatch.setattr(drift_check, "cluster_side_runner", Hanging)
    handover = _event("runner_on_ok", "gpu-a", action="gpuharden.k8s.drift_play",
                      consistency_options={"nodes": ["node-a"]}, node_reports={})
    events = _started("gpu-a") + [_audited("gpu-a"), handover, _stats("gpu-a")]
    _fake_runner(monkeypatch, events, "successful", 0)
    started = time.monotonic()
    try:
        assert _drift(site) == 130
    finally:
        hung.set()
    assert time.monotonic() - started < 10
    out, err = capsys.readouterr()
    _untouched(site)
    _no_clean_summary(out)
    assert "INCOMPLETE, interrupted by SIGINT" in err


def test_item05_sigint_before_any_event_names_every_play_host(site, monkeypatch, capsys):
    _fake_runner(monkeypatch, _started("gpu-a"), "successful", 0, signum=signal.SIGINT, signal_after=0)
    assert _drift(site, "--json") == 130
    out, err = capsys.readouterr()
    _untouched(site)
    _no_clean_summary(out)
    assert "no final result for 3 host(s): gpu-a, gpu-b, gpu-c" in err
    assert "answered before the stop" not in err


def test_item05_signal_before_the_playbook_starts(site, monkeypatch, capsys):
    calls = []
    _fake_runner(monkeypatch, [], "successful", 0, calls=calls)
    resolve = drift_run.resolve_playbook

    def resolve_then_ctrl_c(name):
        os.kill(os.getpid(), signal.SIGINT)
        return resolve(name)

    monkeypatch.setattr(drift_run, "resolve_playbook", resolve_then_ctrl_c)
    assert _drift(site) == 130
    out, err = capsys.readouterr()
    assert calls == []  # no playbook started after the signal
    _untouched(site)
    _no_clean_summary(out)
    assert "no final result for 3 host(s): gpu-a, gpu-b, gpu-c" in err


@pytest.mark.parametrize("status", ["timeout", "canceled", "running"])
def test_item05_runner_status_other_than_finished_is_incomplete(site, monkeypatch, capsys, status):
    # even with every host audited and the closing stats: ansible-runner says the run did not end by itself
    events = _started("gpu-a", "gpu-b", "gpu-c") + [_audited("gpu-a"), _audited("gpu-b"), _audited("gpu-c")]
    _fake_runner(monkeypatch, events + [_stats("gpu-a", "gpu-b", "gpu-c")], status, 254)
    assert _drift(site) == drift_report.EXIT_INCOMPLETE == 3
    out, err = capsys.readouterr()
    _untouched(site)
    _no_clean_summary(out)
    assert "INCOMPLETE" in err
    assert ("timed out" in err) if status == "timeout" else ("status %s" % status in err)


def test_item05_timeout_is_handed_to_ansible_runner_and_names_the_hosts(site, monkeypatch, capsys):
    calls = []
    _fake_runner(monkeypatch, _started("gpu-a", "gpu-b") + [_audited("gpu-a")], "timeout", 254, calls=calls)
    assert _drift(site, "--timeout", "30") == 3
    out, err = capsys.readouterr()
    assert 1 <= calls[0]["timeout"] <= 30
    _untouched(site)
    _no_clean_summary(out)
    assert "timed out (--timeout 30 s)" in err
    assert "no final result for 2 host(s): gpu-b, gpu-c" in err


def test_item05_timeout_used_up_before_the_recheck_of_remediate(site, monkeypatch, capsys):
    calls = []
    drifted = [{"id": "x", "check": "device_nodes", "stage": "device_permissions", "severity": "error", "remediable": True}]
    _fake_runner(monkeypatch, _started("gpu-a") + [_audited("gpu-a", drifted), _stats("gpu-a")], "successful", 0, calls=calls)
    clock = [1000.0]
    fake_time = types.SimpleNamespace(time=time.time, monotonic=lambda: clock[0])
    for module in (drift, drift_check):  # the command sets the deadline, the check reads it
        monkeypatch.setattr(module, "time", fake_time)
    real = drift_run.run_playbook

    def slow(*args, **kwargs):
        clock[0] += 20  # each playbook takes 20 s of the 30
        return real(*args, **kwargs)

    monkeypatch.setattr(drift_run, "run_playbook", slow)
    assert _drift(site, "--timeout", "30", "--remediate", "--harden-playbook", str(site["playbook"])) == 3
    out, err = capsys.readouterr()
    assert [call["timeout"] for call in calls] == [30, 10]  # the check, then harden with what was left; no re-check
    _untouched(site)
    _no_clean_summary(out)
    assert "timed out" in err and "no final result for 1 host(s): gpu-a" in err


def test_item05_playbook_cut_short_without_stats_is_incomplete(site, monkeypatch, capsys):
    # ansible-playbook killed or crashed (rc 250): no playbook_on_stats, gpu-b never got a node_audit result
    _fake_runner(monkeypatch, _started("gpu-a", "gpu-b") + [_audited("gpu-a")], "failed", 250)
    assert _drift(site) == 3
    out, err = capsys.readouterr()
    _untouched(site)
    _no_clean_summary(out)
    assert "stopped before the end of the play (exit code 250, an unexpected error)" in err
    assert "no final result for 2 host(s): gpu-b, gpu-c" in err


def test_item05_failed_run_with_host_results_is_a_report_not_clean(site, monkeypatch, capsys):
    events = _started("gpu-a", "gpu-b", "gpu-c") + [
        _audited("gpu-a"),
        _event("runner_on_unreachable", "gpu-b", msg="ssh: connect to host gpu-b port 22: No route to host"),
        _event("runner_on_failed", "gpu-c", action="gpuharden.k8s.node_stages", msg="node_audit failed: node_lock: locked by harden@x"),
        _stats("gpu-a", "gpu-b", "gpu-c", dark=["gpu-b"], failures=["gpu-c"])]
    _fake_runner(monkeypatch, events, "failed", 2)
    # an unreachable and a failed host: a report, and not checked (exit 4), never clean
    assert _drift(site) == drift_report.EXIT_NOT_CHECKED == 4
    out, _err = capsys.readouterr()
    report = json.loads(site["report"].read_text())
    assert list(report["nodes"]) == ["gpu-a"] and list(report["unreachable"]) == ["gpu-b"] and list(report["failed"]) == ["gpu-c"]
    metrics = site["metrics"].read_text()
    assert 'gpuharden_drift_node_unreachable{node="node-b"} 1' in metrics  # labelled with the node name, as when it answers
    assert 'gpuharden_drift_node_unreachable{node="node-a"} 0' in metrics
    assert 'gpuharden_drift_node_failed{node="node-c"} 1' in metrics
    assert 'gpuharden_drift_node_failed{node="node-b"} 0' in metrics
    assert "gpuharden_last_run_timestamp_seconds %.3f" % report["timestamp"] in metrics
    assert "gpuharden_last_success_timestamp_seconds %.3f" % report["timestamp"] not in metrics  # not every check ran
    out = " ".join(out.split())
    assert "3 node(s): 1 clean, 0 drifted" in out and "1 unreachable, 1 failed" in out


def test_item05_host_without_result_in_a_finished_play_is_failed(site, monkeypatch, capsys):
    # the play ended (stats) and rc 0, yet gpu-b has no node_audit result: failed, never dropped or clean
    events = _started("gpu-a", "gpu-b") + [_audited("gpu-a"), _event("runner_on_skipped", "gpu-b"), _stats("gpu-a", "gpu-b")]
    _fake_runner(monkeypatch, events, "successful", 0)
    assert _drift(site) == drift_report.EXIT_NOT_CHECKED
    report = json.loads(site["report"].read_text())
    assert "no result" in report["failed"]["gpu-b"]
    assert report["summary"]["failed"] == 1 and report["summary"]["clean"] == 1
    assert 'gpuharden_drift_node_failed{node="node-b"} 1' in site["metrics"].read_text()
    capsys.readouterr()


def test_item05_sigint_during_remediate(site, monkeypatch, capsys):
    drifted = [{"id": "x", "check": "device_nodes", "stage": "device_permissions", "severity": "error", "remediable": True}]
    check = _started("gpu-a", "gpu-b") + [_audited("gpu-a", drifted), _audited("gpu-b"), _stats("gpu-a", "gpu-b")]
    calls = []
    _fake_runner(monkeypatch, check, "successful", 0, calls=calls)
    real = drift_run.run_playbook

    def harden_interrupted(playbook, inventory, **kwargs):
        if kwargs.get("tags"):
            os.kill(os.getpid(), signal.SIGINT)
            assert kwargs["cancel"]()
            return "canceled", 254, {}, ""
        return real(playbook, inventory, **kwargs)

    monkeypatch.setattr(drift_run, "run_playbook", harden_interrupted)
    assert _drift(site, "--remediate", "--harden-playbook", str(site["playbook"])) == 130
    out, err = capsys.readouterr()
    _untouched(site)
    _no_clean_summary(out)
    assert "during --remediate" in err
    assert "no final result for 1 host(s): gpu-a" in err and "answered before the stop, not reported: gpu-b" in err


def test_item05_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["drift", "--help"])
    text = capsys.readouterr().out
    for line in ("0    clean: the run finished", "1    DRIFT, an answer: the run finished", "2    usage or environment error",
                 "3    INCOMPLETE", "128+N  stopped by signal N", "130 SIGINT (Ctrl-C), 143 SIGTERM", "--timeout SECONDS"):
        assert line in text, line
    assert "gpuharden_last_success_timestamp_seconds" in text


def test_item05_timeout_must_be_positive(site, capsys):
    assert _drift(site, "--timeout", "0") == 2
    assert "--timeout" in capsys.readouterr().err
    _untouched(site)


def test_item05_parse_list_hosts():
    text = textwrap.dedent("""
        playbook: drift_check.yml

          play #1 (gpu_nodes): Drift check (read-only)\tTAGS: []
            pattern: ['gpu_nodes']
            hosts (2):
              gpu-b
              gpu-a

          play #2 (localhost): Other\tTAGS: []
            pattern: ['localhost']
            hosts (1):
              localhost
        """)
    assert drift_run.parse_list_hosts(text) == {"gpu-a", "gpu-b", "localhost"}
    assert drift_run.parse_list_hosts("ERROR! the playbook could not be found") == set()


def _processes_of(path):
    """The live processes whose command line names ``path`` or whose working directory is below it."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
            with open("/proc/%s/stat" % name, encoding="utf-8") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink("/proc/%s/cwd" % name)
        except OSError:
            continue
        if state != "Z" and (str(path) in cmdline or cwd == str(path) or cwd.startswith(str(path) + os.sep)):
            found.append("%s %s (cwd %s)" % (name, cmdline.strip(), cwd))
    return found


def _none_left(path, seconds=5.0):
    """[] once no process of ``path`` is alive (polled up to ``seconds``), else the ones still there, which are then
    killed so that a failing test leaves nothing behind either."""
    deadline = time.monotonic() + seconds
    while (left := _processes_of(path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for line in left:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except OSError:
            pass
    return left


# pause waits in an ansible-playbook worker for ansible-playbook to answer; the command runs a module and sleep below
# the worker.  Since ansible-core 2.19 each worker is in a session of its own (WorkerProcess._detach), which
# ansible-runner's SIGKILL of ansible-playbook's process group does not reach.  Each entry: the task, and what shows
# that the task is under way (then the SIGINT comes): the worker beside ansible-playbook, the sleep in the playbook's
# directory.
SLOW_TASKS = {
    "pause": ("    - ansible.builtin.pause:\n        seconds: 60\n",
              lambda found: sum("slow.yml" in line for line in found) >= 2),
    "command": ("    - ansible.builtin.command:\n        cmd: sleep 60\n        chdir: \"{{ playbook_dir }}\"\n"
                "      changed_when: false\n",
                lambda found: any(line.split()[1].endswith("sleep") for line in found)),
}


def _interrupt_when(path, under_way, seconds=25.0):
    """SIGINT to this process once ``under_way(_processes_of(path))`` (or after ``seconds``); the thread's ``seen``
    says which."""

    def watch():
        deadline = time.monotonic() + seconds
        while not thread.seen and time.monotonic() < deadline and not thread.canceled.is_set():
            thread.seen = under_way(_processes_of(path))
            time.sleep(0.1)
        if not thread.canceled.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, daemon=True)
    thread.seen, thread.canceled = False, threading.Event()
    return thread


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds processes in /proc")
@pytest.mark.parametrize("task", sorted(SLOW_TASKS))
def test_item05_real_ansible_runner_sigint_end_to_end(tmp_path, capsys, task):
    """ansible-runner and ansible-playbook for real (local connection, no lab): SIGINT once the task is under way, and
    afterwards no process of the run left (neither ansible-playbook nor a worker nor the module it runs)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  vars: {ansible_connection: local, ansible_python_interpreter: %s, ansible_remote_tmp: %s}\n"
                         "  children:\n    gpu_nodes:\n      hosts: {gpu-a: {}, gpu-b: {}}\n" % (sys.executable, tmp_path / "remote"))
    playbook = tmp_path / "slow.yml"
    text, under_way = SLOW_TASKS[task]
    playbook.write_text("- hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n" + text)
    report, metrics = tmp_path / "report.json", tmp_path / "gpuharden.prom"
    report.write_text(PREVIOUS_REPORT)
    metrics.write_text(PREVIOUS_METRICS)
    watcher = _interrupt_when(tmp_path, under_way)
    started = time.monotonic()
    watcher.start()
    try:
        code = cli.main(["drift", "-i", str(inventory), "--playbook", str(playbook), "--report", str(report),
                         "--prometheus", str(metrics)])
    finally:
        watcher.canceled.set()
        watcher.join()
    out, err = capsys.readouterr()
    left = _none_left(tmp_path)
    assert watcher.seen, "the %s task never got under way" % task
    assert code == 130, err
    assert time.monotonic() - started < 40  # the start, then canceled within about a second, plus the host listing
    assert report.read_text() == PREVIOUS_REPORT and metrics.read_text() == PREVIOUS_METRICS
    _no_clean_summary(out)
    assert "no final result for 2 host(s): gpu-a, gpu-b" in err
    assert left == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds processes in /proc")
@pytest.mark.parametrize("how", ["timeout", "second_signal"])
def test_item05_abandoned_host_listing_leaves_no_process(tmp_path, monkeypatch, how):
    """ansible-playbook --list-hosts given up (its 60 s cap, or another Ctrl-C): it and everything it started end,
    even processes that ignore SIGTERM or left its session."""
    fake = tmp_path / "ansible-playbook"
    fake.write_text(textwrap.dedent("""\
        #!%s
        import os, signal, subprocess, sys, time
        os.chdir(%r)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited: only SIGKILL ends these
        subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(60)"])
        subprocess.Popen(["sleep", "60"])
        print("started", flush=True)
        time.sleep(60)
        """ % (sys.executable, str(tmp_path))))
    fake.chmod(0o755)
    monkeypatch.setattr(drift_run, "runner_env", lambda: {"PATH": str(tmp_path)})
    monkeypatch.setattr(drift_run, "TERMINATE_GRACE", 0.5, raising=False)  # absent before the fix: the test fails there, not errors
    stop = drift_check.StopRequest()
    timer = threading.Timer(1.5, stop, (signal.SIGINT,))
    started = time.monotonic()
    if how == "second_signal":
        stop(signal.SIGINT)  # the first Ctrl-C, which ended the run; the timer's is the second
        timer.start()
    try:
        assert drift_run.play_hosts("slow.yml", "hosts.yml", limit=None, extravars={}, stop=stop,
                                timeout=1 if how == "timeout" else 30) is None
    finally:
        timer.cancel()
    assert time.monotonic() - started < 25  # the fake sleeps 60 s and the listing's own timeout is 30 s; slack for a loaded machine
    assert _none_left(tmp_path, seconds=2.0) == []
