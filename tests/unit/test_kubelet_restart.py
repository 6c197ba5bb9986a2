# SPDX-License-Identifier: GPL-3.0-or-later
"""kubelet_config's restart option: the write, the kubelet's restart and the healthz wait in one module run.

The module runs as Ansible runs it (a fresh Python), against a copy of the kubeadm fixture node, with a systemctl on
PATH that records its arguments and a local HTTP server standing in for the kubelet's healthz port.
"""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _kubelet_restart

from tests.unit.conftest import run_module

FIXTURES = Path(__file__).parent / "fixtures" / "kubelet"
TOPOLOGY = {"topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static", "reserved_system_cpus": "0-1"}


class Healthz:
    """A healthz endpoint that answers 503 ``unhealthy`` times, then 200."""

    def __init__(self, unhealthy):
        self.unhealthy, self.requests = unhealthy, 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                owner.requests += 1
                self.send_response(503 if owner.requests <= owner.unhealthy else 200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/healthz" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def world(world_tmp):
    """(node root, the systemctl call log, the env that puts the recording systemctl first on PATH)."""
    root = world_tmp / "node"
    shutil.copytree(FIXTURES / "kubeadm", root)
    bin_dir, calls = world_tmp / "bin", world_tmp / "systemctl.calls"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text('#!/bin/sh\necho "$@" >> %s\n[ "$2" = broken ] && { echo "Unit broken.service not found." >&2; exit 5; }\nexit 0\n'
                    % calls)
    fake.chmod(0o755)
    return root, calls, {"PATH": "%s:%s" % (bin_dir, os.environ["PATH"])}


def _run(root, env, check=False, **options):
    result = run_module("kubelet_config", dict({"root": str(root), "_ansible_check_mode": check}, **TOPOLOGY, **options), env)
    assert not result.get("failed"), result
    return result


def _run_with_healthz(root, env, unhealthy, **options):
    """The module run against a healthz that answers 503 ``unhealthy`` times; (result, the GETs it received)."""
    healthz = Healthz(unhealthy)
    try:
        return _run(root, env, health_url=healthz.url, **options), healthz.requests
    finally:
        healthz.close()


def test_write_restarts_and_waits_until_healthz_answers_200(world):
    root, calls, env = world
    before = time.time()
    result, requests = _run_with_healthz(root, env, 3, restart="if_required", health_timeout=30)
    assert result["changed"] and result["restart_required"] and result["restarted"]
    # the node's clock just before the restart: the post-check trusts only a Node status the kubelet posted after it
    assert before <= result["health"]["restarted_at"] <= time.time()
    assert result["health"]["status"] == 200 and result["health"]["error"] is None
    assert result["health"]["attempts"] == 4 == requests
    assert calls.read_text().split("\n")[0] == "restart kubelet"


def test_nothing_restarts_without_a_change_the_kubelet_reads_in_check_mode_or_by_default(world):
    root, calls, env = world
    assert _run(root, env, check=True, restart="always")["restarted"] is False
    assert _run(root, env)["restarted"] is False  # restart: never, the default; the files are written
    again = _run(root, env, restart="if_required", health_url="http://127.0.0.1:9/healthz")
    assert again["changed"] is False and again["restarted"] is False and again["health"] is None
    assert not calls.exists()


def test_always_starts_the_kubelet_even_without_a_change(world):
    root, calls, env = world
    _run(root, env)
    result, _requests = _run_with_healthz(root, env, 0, restart="always")
    assert result["changed"] is False and result["restarted"] and result["health"]["status"] == 200
    assert calls.read_text() == "restart kubelet\n"


def test_a_kubelet_that_does_not_come_back_is_reported_not_raised(world):
    root, _calls, env = world
    result, _requests = _run_with_healthz(root, env, 1000, restart="if_required", health_timeout=1)
    assert result["restarted"] and result["health"]["status"] == 503
    assert "not healthy 1 s after the restart" in result["health"]["error"] and "HTTP 503" in result["health"]["error"]
    assert 2 <= result["health"]["attempts"] <= 6  # a quarter second apart over one second
    assert result["backup_files"] == {} and result["changed"]  # written: the role restores it from its backups


def test_a_failed_restart_a_missing_systemctl_or_a_closed_port_is_an_unhealthy_result():
    calls = []

    def failing(argv):
        calls.append(argv)
        return 5, "", "Unit broken.service not found.\n"

    failed = _kubelet_restart.restart_and_wait(failing, "broken", "http://127.0.0.1:9/healthz", 5)
    assert calls == [["systemctl", "restart", "broken"]]
    assert failed["status"] is None and failed["attempts"] == 0 and "rc 5" in failed["error"] and "not found" in failed["error"]

    def missing(argv):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    absent = _kubelet_restart.restart_and_wait(missing, "kubelet", "http://127.0.0.1:9/healthz", 5)
    assert absent["status"] is None and "rc 2" in absent["error"] and "systemctl" in absent["error"]

    answers = iter([http.client.BadStatusLine("half a line"), ConnectionResetError(104, "reset"), 200])

    def restarting(_url, _timeout):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    flaky = _kubelet_restart.restart_and_wait(lambda argv: (0, "", ""), "kubelet", "http://x/healthz", 30, sleep=lambda _s: None,
                                              get=restarting)
    assert flaky["status"] == 200 and flaky["attempts"] == 3 and flaky["error"] is None

    clock = iter(range(100)).__next__  # one second per reading: the deadline passes after a few polls
    closed = _kubelet_restart.restart_and_wait(lambda argv: (0, "", ""), "kubelet", "http://127.0.0.1:9/healthz", 3,
                                               clock=clock, sleep=lambda _s: None)
    assert closed["status"] is None and closed["attempts"] >= 1
    assert closed["error"].startswith("not healthy 3 s after the restart: http://127.0.0.1:9/healthz")


@pytest.mark.parametrize(("restart", "changed", "required", "check", "expected"), [
    ("never", True, True, False, False),
    ("if_required", True, True, False, True),
    ("if_required", True, False, False, False),  # files changed, nothing the kubelet reads
    ("if_required", False, True, False, False),
    ("always", False, False, False, True),
    ("always", True, True, True, False),  # check mode
])
def test_when_the_module_restarts(restart, changed, required, check, expected):
    assert _kubelet_restart.wanted({"restart": restart}, changed, required, check) is expected


class HealthyAfterRestarts:
    """A healthz that answers 503 until systemctl has restarted the kubelet ``restarts`` times, then 200."""

    def __init__(self, calls, restarts):
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                done = calls.read_text().split("\n").count("restart kubelet") if calls.exists() else 0
                self.send_response(200 if done >= owner.restarts else 503)
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.restarts = restarts
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/healthz" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _unit_says(world_tmp, calls):
    """The recording systemctl, which also answers ``systemctl show`` as a kubelet that exited with status 1."""
    fake = world_tmp / "bin" / "systemctl"
    fake.write_text('#!/bin/sh\necho "$@" >> %s\n[ "$1" = show ] && { echo Result=exit-code; echo ExecMainStatus=1; }\nexit 0\n' % calls)


def test_rollback_puts_the_files_back_restarts_and_fails_with_the_kubelets_reason(world, world_tmp):
    root, calls, env = world
    _unit_says(world_tmp, calls)
    before = {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}
    log = world_tmp / "kubelet.log"
    log.write_text("I1207 starting\nE1207 12:00:00 run.go:72] failed to run Kubelet: invalid configuration: imageGC thresholds\nI1207 done\n")
    healthz = HealthyAfterRestarts(calls, 2)  # healthy only on the restored files (the second restart)
    try:
        result = run_module("kubelet_config", dict({"root": str(root), "_ansible_check_mode": False}, **TOPOLOGY, restart="if_required",
                                                   rollback=True, health_url=healthz.url, health_timeout=1, log_file=str(log), backup=True), env)
    finally:
        healthz.close()
    assert result["failed"] and result["restarted"]
    assert "did not become healthy within 1s" in result["msg"] and "Result=exit-code, ExecMainStatus=1" in result["msg"]
    assert "imageGC thresholds" in result["msg"] and "I1207" not in result["msg"]  # the error lines only
    assert "the kubelet is healthy again" in result["msg"]
    assert result["rolled_back"] and all(path in result["msg"] for path in result["rolled_back"])
    assert result["health_after_rollback"]["status"] == 200
    assert calls.read_text().split("\n")[:3] == ["restart kubelet", "show -p Result -p ExecMainStatus kubelet", "restart kubelet"]
    after = {path: path.read_bytes() for path in root.rglob("*") if path.is_file()}
    assert after == before  # every file back, no backup or drop-in left behind


def test_without_rollback_or_when_healthy_nothing_is_put_back(world):
    root, calls, env = world
    result, _requests = _run_with_healthz(root, env, 0, restart="if_required", rollback=True)
    assert result["health"]["status"] == 200 and "rolled_back" not in result
    assert calls.read_text() == "restart kubelet\n"


def test_stop_first_stops_before_the_write_and_a_failed_write_starts_the_kubelet_again(world):
    root, calls, env = world
    result, _requests = _run_with_healthz(root, env, 0, restart="always", stop_first=True)
    assert result["changed"] and calls.read_text() == "stop kubelet\nrestart kubelet\n"
    calls.unlink()
    assert _run(root, env, check=True, restart="always", stop_first=True)["restarted"] is False
    assert not calls.exists()  # check mode stops nothing

    calls_made = []

    def run_command(argv):
        calls_made.append(argv)
        return (0, "", "")

    _kubelet_restart.stop(run_command, "kubelet")
    _kubelet_restart.start(run_command, "kubelet")
    assert calls_made == [["systemctl", "stop", "kubelet"], ["systemctl", "start", "kubelet"]]
    with pytest.raises(Exception, match="systemctl stop kubelet failed"):
        _kubelet_restart.stop(lambda argv: (1, "", "denied"), "kubelet")


def test_the_rollback_leaves_a_removed_checkpoint_removed_and_reads_the_journal_without_a_log_file():
    assert _kubelet_restart.rollback_paths(["/etc/kubernetes/kubelet.conf.d/50-gpuharden.conf", "/var/lib/kubelet/cpu_manager_state"]) == [
        "/etc/kubernetes/kubelet.conf.d/50-gpuharden.conf"]
    seen = []

    def journal(argv):
        seen.append(argv)
        return 0, "Dec 07 kubelet[1]: run.go:72] Error: bad flag\nDec 07 kubelet[1]: I1207 fine\n", ""

    # journal lines start with the date, so only the Go error text marks them
    assert _kubelet_restart.log_reason(journal, "kubelet-gpuharden-missing", "", 5) == "Dec 07 kubelet[1]: run.go:72] Error: bad flag"
    assert seen == [["journalctl", "--no-pager", "-n", "5", "-u", "kubelet-gpuharden-missing"]]
    assert _kubelet_restart.unit_result(lambda argv: (1, "", ""), "kubelet") == {"Result": "?", "ExecMainStatus": "?"}
