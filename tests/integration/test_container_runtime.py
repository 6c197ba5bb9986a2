# SPDX-License-Identifier: GPL-3.0-or-later
"""container_runtime role over SSH on the seed-failures lab: check mode, apply, re-apply, fixtures, broken config.

seed-no-runtime runs the real containerd 2.4 with its own default config; the other real nodes were prepared by the real
nvidia-ctk (--set-as-default), which the role finds compliant."""

from __future__ import annotations

import shlex
import tempfile
import time
import tomllib
from pathlib import Path

import ansible_runner
import pytest
from gpuharden_lab import manager

from tests.labfixtures import discard_shared_lab, shared_lab

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = Path(__file__).parent / "playbooks"
FIXTURES = REPO / "tests/unit/fixtures/containerd"
MISSING = "seed-no-runtime"
SEEDED = "seed-topology-none"
CONFIG = "/etc/containerd/config.toml"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
MODULE_TASK = "Ensure containerd has the NVIDIA runtime, and restart containerd if it changed"


@pytest.fixture(scope="module")
def lab():
    # The last user of the lab it shares (tests/xdist_shared_lab.py): seed-topology-none keeps a fixture's config.
    with shared_lab("seed-failures", unit="node-roles") as state:
        try:
            yield state
        finally:
            discard_shared_lab()


def playbook(state, name, *extra, check=False):
    """Run a test playbook through ansible-runner; results come from its job events, never from stdout."""
    cmdline = " ".join(shlex.quote(arg) for arg in extra) + (" --check --diff" if check else "")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuharden-runner-") as private:
        run = ansible_runner.run(private_data_dir=private, playbook=str(PLAYBOOKS / name), inventory=state["inventory"],
                                 cmdline=cmdline.strip() or None, envvars={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
                                 project_dir=str(REPO), quiet=True)
        tasks = {}
        for event in run.events:
            data = event.get("event_data", {})
            if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable"):
                result = dict(data.get("res") or {})
                result["failed"] = event["event"] in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors")
                tasks.setdefault(data.get("task", ""), {})[data["host"]] = result
        stats = {}
        for key, per_host in (run.stats or {}).items():
            for host, count in (per_host or {}).items():
                stats.setdefault(host, {})[key] = count
        hosts = set(state["nodes"])
        for host in hosts:
            stats.setdefault(host, {}).setdefault("changed", 0)
    return {"rc": run.rc, "tasks": tasks, "stats": stats, "seconds": round(time.monotonic() - started, 1)}


def task_results(report, task_name):
    out = {}
    for name, hosts in report["tasks"].items():
        if name.endswith(task_name):
            out.update(hosts)
    return out


def sh(state, node, command):
    result = manager.ssh(state["nodes"][node]["address"], command)
    assert result.returncode == 0, (command, result.stdout, result.stderr)
    return result.stdout


def fingerprint(state, node):
    """sha256 and mtime of every file under /etc/containerd (and the list of files)."""
    return sh(state, node, "find /etc/containerd -type f -printf '%p %T@ ' -exec sha256sum {} \\; | sort")


def main_pid(state, node):
    return sh(state, node, "systemctl show containerd --property=MainPID --value").strip()


def test_check_apply_reapply_on_the_fleet(lab):
    nodes = sorted(lab["nodes"])
    before = {node: fingerprint(lab, node) for node in nodes}
    pids = {node: main_pid(lab, node) for node in nodes}

    checked = playbook(lab, "container_runtime.yml", check=True)
    assert checked["rc"] == 0, checked["stats"]
    results = task_results(checked, MODULE_TASK)
    assert results[MISSING]["changed"] is True and results[MISSING]["restart_required"] is True
    # the real containerd 2.4's `containerd config default` (the node as installed) is config version 4, and imports
    # /etc/containerd/conf.d/*.toml: the runtime goes into a drop-in there
    assert results[MISSING]["runtime_file"] == DROP_IN and results[MISSING]["config_version"] == 4
    assert results[MISSING]["diff"][0]["before"] == "" and "runtimes.nvidia]" in results[MISSING]["diff"][0]["after"]
    assert all(results[node]["changed"] is False for node in nodes if node != MISSING)
    assert {node: fingerprint(lab, node) for node in nodes} == before  # check mode touched nothing
    assert {node: main_pid(lab, node) for node in nodes} == pids  # and restarted nothing

    applied = playbook(lab, "container_runtime.yml")
    assert applied["rc"] == 0, applied["stats"]
    assert applied["stats"][MISSING]["changed"] >= 1
    assert all(applied["stats"][node]["changed"] == 0 for node in nodes if node != MISSING)
    assert main_pid(lab, MISSING) != pids[MISSING]
    assert sh(lab, MISSING, "systemctl is-active containerd").strip() == "active"
    assert all(main_pid(lab, node) == pids[node] for node in nodes if node != MISSING)
    # the write's own run restarted the real containerd and saw it serve again on its new socket
    written = task_results(applied, MODULE_TASK)
    readiness = written[MISSING]["readiness"]
    assert written[MISSING]["restarted"] is True and readiness["ready"] is True, readiness
    assert readiness["address"] == "/run/containerd/containerd.sock" and readiness["status"] == "active"
    assert readiness["seconds"] < 15, readiness
    assert all(written[node]["restarted"] is False and written[node]["readiness"] is None for node in nodes if node != MISSING)
    print("\ncontainerd on %s served again %.2fs after the restart (%d polls)" % (MISSING, readiness["seconds"], readiness["attempts"]))
    # exactly the runtime: the main config is byte-identical, the drop-in holds only the runtime
    after = fingerprint(lab, MISSING)
    assert [line for line in before[MISSING].splitlines() if CONFIG in line] == [line for line in after.splitlines() if CONFIG in line]
    drop_in = tomllib.loads(sh(lab, MISSING, "cat " + DROP_IN))
    runtime = drop_in["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"].pop("nvidia")
    # runc's runtime as the default config has it, through the toolkit's runtime: what `nvidia-ctk runtime configure`
    # writes too, into the same file on the nodes it prepared
    main = tomllib.loads(sh(lab, MISSING, "cat " + CONFIG))
    runc = main["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]
    assert runtime == dict(runc, options=dict(runc["options"], BinaryName="/usr/bin/nvidia-container-runtime"))
    assert drop_in == {"version": 4, "plugins": {"io.containerd.cri.v1.runtime": {"containerd": {"runtimes": {}}}}}

    again_before = {node: fingerprint(lab, node) for node in nodes}
    again = playbook(lab, "container_runtime.yml")
    assert again["rc"] == 0
    assert all(again["stats"][node]["changed"] == 0 for node in nodes), again["stats"]
    assert {node: fingerprint(lab, node) for node in nodes} == again_before  # checksum and mtime unchanged
    # the write's action sets the facts the RuntimeClass reads (plugins/action/container_runtime_stage.py)
    facts = task_results(again, MODULE_TASK)
    assert {host["ansible_facts"]["container_runtime_handler"] for host in facts.values()} == {"nvidia"}
    assert {host["ansible_facts"]["container_runtime_restart_required"] for host in facts.values()} == {False}
    print("per-run seconds (11 nodes): check %.1f, apply %.1f, re-apply %.1f" % (checked["seconds"], applied["seconds"], again["seconds"]))


@pytest.mark.parametrize("fixture", ["v2-comments.toml", "v3-single.toml"])
def test_single_file_fixture_gains_exactly_the_runtime(lab, fixture):
    seeded = playbook(lab, "container_runtime_seed.yml", "-e", "target=%s" % SEEDED, "-e", "fixture=%s" % (FIXTURES / fixture))
    assert seeded["rc"] == 0, seeded["stats"]
    original = (FIXTURES / fixture).read_text()
    applied = playbook(lab, "container_runtime.yml", "-e", "target=%s" % SEEDED)
    assert applied["rc"] == 0, applied["stats"]
    result = task_results(applied, MODULE_TASK)[SEEDED]
    assert result["changed"] is True and result["runtime_file"] == CONFIG
    text = sh(lab, SEEDED, "cat " + CONFIG)
    before, after = tomllib.loads(original), tomllib.loads(text)
    cri = "io.containerd.grpc.v1.cri" if before["version"] == 2 else "io.containerd.cri.v1.runtime"
    runtime = after["plugins"][cri]["containerd"]["runtimes"].pop("nvidia")
    assert after == before
    assert runtime["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime" and runtime["options"]["SystemdCgroup"] is True
    for line in original.splitlines():
        if "#" in line:
            assert line[line.index("#"):] in text
    assert sh(lab, SEEDED, "systemctl is-active containerd").strip() == "active"
    backups = result["backup_files"]
    assert list(backups) == [CONFIG] and sh(lab, SEEDED, "cat '%s'" % backups[CONFIG]) == original
    stamp = fingerprint(lab, SEEDED)
    again = playbook(lab, "container_runtime.yml", "-e", "target=%s" % SEEDED)
    assert again["stats"][SEEDED]["changed"] == 0 and fingerprint(lab, SEEDED) == stamp


def test_broken_config_fails_clearly_and_nothing_changes(lab):
    seeded = playbook(lab, "container_runtime_seed.yml", "-e", "target=%s" % SEEDED, "-e", "fixture=%s" % (FIXTURES / "broken.toml"))
    assert seeded["rc"] == 0
    stamp, pid = fingerprint(lab, SEEDED), main_pid(lab, SEEDED)
    failed = playbook(lab, "container_runtime.yml", "-e", "target=%s" % SEEDED)
    assert failed["rc"] != 0
    result = task_results(failed, MODULE_TASK)[SEEDED]
    assert result["failed"] is True and CONFIG in result["msg"] and "invalid TOML" in result["msg"]
    assert fingerprint(lab, SEEDED) == stamp and main_pid(lab, SEEDED) == pid


def test_containerd_that_does_not_come_back_fails_the_readiness_wait(lab):
    # The module refuses every config it finds invalid, so stand in for a containerd that dies after the
    # restart with a unit whose daemon exits 1, as containerd does on a config it cannot load.
    seeded = playbook(lab, "container_runtime_seed.yml", "-e", "target=%s" % SEEDED, "-e", "fixture=%s" % (FIXTURES / "v2-single.toml"))
    assert seeded["rc"] == 0
    sh(lab, SEEDED, "printf '[Service]\\nExecStart=/bin/sh -c \\x27sleep 0.2; exit 1\\x27\\n' > /etc/systemd/system/gpuhtest-dying.service"
                    " && systemctl daemon-reload")
    failing = playbook(lab, "container_runtime.yml", "-e", "target=%s" % SEEDED, "-e", "container_runtime_service=gpuhtest-dying")
    assert failing["rc"] != 0
    written = task_results(failing, MODULE_TASK)[SEEDED]
    assert written["changed"] is True and written["restarted"] is True
    # active for 0.2 s, with the socket still the running containerd's old one, then failed: not waited on to the timeout
    readiness = written["readiness"]
    assert readiness["ready"] is False and readiness["status"] == "failed" and readiness["timed_out"] is False, readiness
    assert readiness["seconds"] < 10, readiness
    report = written  # the write's own task fails the host (plugins/action/container_runtime_stage.py)
    assert report["failed"] is True and "gpuhtest-dying" in report["msg"] and "is failed after the restart" in report["msg"], report
    # the config went back as the fixture had it; the unit still dies with it, and the message says so
    assert written["rollback"]["restored"] == [CONFIG] and written["rollback"]["readiness"]["ready"] is False
    assert "does not come back either" in report["msg"]
    assert sh(lab, SEEDED, "cat " + CONFIG) == (FIXTURES / "v2-single.toml").read_text()


def test_real_containerd_that_refuses_the_change_gets_its_old_configuration_back_and_serves_again(lab):
    """The real containerd, made to refuse to start once its config names the NVIDIA runtime (a unit drop-in's
    ExecStartPre, as a broken toolkit install or an old containerd would): the write's own run sees it fail, puts the
    config back, restarts containerd with it and sees it serve again; the role fails the host, naming both."""
    seeded = playbook(lab, "container_runtime_seed.yml", "-e", "target=%s" % SEEDED, "-e", "fixture=%s" % (FIXTURES / "v2-single.toml"))
    assert seeded["rc"] == 0
    refuse = "/etc/systemd/system/containerd.service.d/99-gpuhtest-refuse-nvidia.conf"
    check = "/usr/local/sbin/gpuhtest-refuse-nvidia"  # a script: the unit line needs no quoting
    sh(lab, SEEDED, "printf '#!/bin/sh\\n! grep -qs nvidia-container-runtime %s\\n' > %s && chmod 755 %s && mkdir -p %s"
                    " && printf '[Service]\\nExecStartPre=%s\\n' > %s && systemctl daemon-reload && systemctl restart containerd"
                    % (CONFIG, check, check, refuse.rsplit("/", 1)[0], check, refuse))
    assert sh(lab, SEEDED, "systemctl is-active containerd").strip() == "active"
    before_pid = main_pid(lab, SEEDED)
    try:
        failing = playbook(lab, "container_runtime.yml", "-e", "target=%s" % SEEDED)
        assert failing["rc"] != 0
        written = task_results(failing, MODULE_TASK)[SEEDED]
        assert written["changed"] is True and written["readiness"]["ready"] is False, written["readiness"]
        rollback = written["rollback"]
        assert rollback["restored"] == [CONFIG] and rollback["readiness"]["ready"] is True, rollback
        report = written  # the write's own task fails the host (plugins/action/container_runtime_stage.py)
        assert report["failed"] is True and "it serves again" in report["msg"], report
        assert sh(lab, SEEDED, "cat " + CONFIG) == (FIXTURES / "v2-single.toml").read_text()
        assert sh(lab, SEEDED, "systemctl is-active containerd").strip() == "active"
        assert main_pid(lab, SEEDED) not in ("0", before_pid)
        assert sh(lab, SEEDED, "test -S /run/containerd/containerd.sock && echo socket").strip() == "socket"
    finally:
        sh(lab, SEEDED, "rm -f %s %s && systemctl daemon-reload" % (refuse, check))
