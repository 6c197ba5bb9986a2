# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 43, problem 11: an eBPF device-cgroup audit during which a container's cgroup disappears shows as ok through
ansible-playbook, never skipped, with the cgroups named in ``vanished_cgroups`` (the key was ``skipped``, which
ansible-core 2.19 executor/task_result.py is_skipped reads as a skipped task, findings and all).

A throwaway kubepods tree in the host's cgroup2 hierarchy (no lab): 2000 container cgroups.  The audit runs through
ansible-playbook on localhost with the tree as its cgroup_root; a watcher waits until the module process holds a
directory of the tree open (its walk has begun), then removes the container cgroups, last first, as containers that
end while a busy node is read.  The kernel answers the audit's later open of a removed cgroup with ENOENT, as it
does for a pod that ends mid-audit.  The race is real, so a run in which no removal fell between the walk and the
read of that cgroup is tried again (at most ATTEMPTS); every run must be ok.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import uuid

import ansible_runner
import pytest
import yaml
from gpuharden_lab import REPO_ROOT

pytestmark = pytest.mark.sandbox

# ansible-runner's event callback drops a result over MAX_EVENT_RES characters (700000 by default): 2000 containers' is more
ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]),
       "MAX_EVENT_RES": "50000000"}
PODS, CONTAINERS_PER_POD = 200, 10
ATTEMPTS = 3
MODULE_MARK = b"AnsiballZ_device_cgroup_audit"


def cgroup2_mount():
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        found = [line.split()[1] for line in mounts if line.split()[2] == "cgroup2"]
    if os.geteuid() != 0 or not found:
        pytest.fail("the sandbox tests need root and a cgroup2 hierarchy (found %s)" % found)
    return found[0]


@pytest.fixture
def kubepods():
    """(tree root, container cgroup paths): a cgroupfs-driver kubepods tree of PODS pods."""
    base = os.path.join(cgroup2_mount(), "gpuharden-test-vanish-" + secrets.token_hex(4))
    containers = []
    os.makedirs(os.path.join(base, "kubepods", "besteffort"))
    for _pod in range(PODS):
        pod = os.path.join(base, "kubepods", "besteffort", "pod%s" % uuid.uuid4())
        os.mkdir(pod)
        for _container in range(CONTAINERS_PER_POD):
            containers.append(os.path.join(pod, secrets.token_hex(32)))
            os.mkdir(containers[-1])
    yield base, containers
    for directory, _dirs, _files in sorted(os.walk(base), key=lambda entry: -len(entry[0])):
        os.rmdir(directory)  # a cgroup without processes: rmdir, children first


def module_reading(base):
    """The pid of a device_cgroup_audit module process that holds a directory of ``base`` open, or None."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                if MODULE_MARK not in handle.read():
                    continue
            fds = "/proc/%s/fd" % pid
            if any(os.readlink(os.path.join(fds, fd)).startswith(base + "/") for fd in os.listdir(fds)):
                return int(pid)
        except OSError:
            continue  # it ended, or is not ours to read
    return None


def remove_while_read(base, containers, removed, stop):
    """Wait for the module's walk, then remove the container cgroups, last first (the read goes first first)."""
    while not stop.is_set() and module_reading(base) is None:
        time.sleep(0.001)
    for path in sorted(containers, reverse=True):
        if stop.is_set():
            return
        if os.path.isdir(path):
            os.rmdir(path)
            removed.append(path)
            time.sleep(0.0002)


def audit_through_ansible(tmp_path, base):
    playbook = tmp_path / "audit.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Audit", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "Audit the device cgroups", "gpuharden.k8s.device_cgroup_audit": {
            "cgroup_root": base, "devices": ["/dev/null"], "allocations": [], "bundle_dirs": []}}]}]))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    events = []
    private = tempfile.mkdtemp(prefix="runner-", dir=tmp_path)
    runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=str(inventory), playbook=str(playbook), quiet=True,
                                event_handler=lambda event: events.append(event) or True)
    shutil.rmtree(private, ignore_errors=True)
    return runner, [(event["event"], event["event_data"].get("res") or {}) for event in events
                    if event["event"].startswith("runner_on_") and event["event"] != "runner_on_start"]


def test_issue43_problem11_audit_during_which_cgroups_vanish_is_ok_never_skipped(tmp_path, kubepods):
    caught = []
    for attempt in range(ATTEMPTS):
        base, containers = kubepods
        for path in containers:  # a fresh tree for each attempt: the cgroups removed last time come back
            os.makedirs(path, exist_ok=True)
        removed, stop = [], threading.Event()
        watcher = threading.Thread(target=remove_while_read, args=(base, containers, removed, stop), daemon=True)
        watcher.start()
        workdir = tmp_path / str(attempt)
        workdir.mkdir()
        try:
            runner, results = audit_through_ansible(workdir, base)
        finally:
            stop.set()
            watcher.join(timeout=30)
        assert runner.rc == 0, results
        [(event, result)] = results
        assert event == "runner_on_ok", (event, result.get("msg"))  # never runner_on_skipped
        assert "skipped" not in result and result["changed"] is False
        vanished = result["vanished_cgroups"]
        relative = {path[len(base):] for path in removed}
        assert set(vanished) <= relative, sorted(set(vanished) - relative)  # only what really went
        assert len(result["containers"]) + len(vanished) <= len(containers)
        if vanished:
            caught.append((attempt, len(vanished), len(removed)))
            break
    assert caught, "no cgroup was removed between the audit's walk and its read in %d runs: the race was never won" % ATTEMPTS
