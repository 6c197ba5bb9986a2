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
