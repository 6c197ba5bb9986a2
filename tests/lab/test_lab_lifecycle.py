# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab itself: nodes reached over real SSH see their own GPUs, and `lab down` leaves nothing behind."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from gpuharden_lab import NVML_FIXTURES, REPO_ROOT, layout, manager
from gpuharden_lab import node as lab_node
from gpuharden_lab.scenario import load
from gpuharden_lab.system import LabError

from tests.labfixtures import lab_lock

pytestmark = pytest.mark.lab

ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")
# Nodes only, without a cluster: a stand-in fleet of three fixtures and a CPU-only node, which needs no real binaries
# (the healthy scenario's real nodes are reached through a cluster and a harden run).
SCENARIO = "mixed-fleet"
LIST_UUIDS = (
    "%s -c 'import pynvml; pynvml.nvmlInit(); "
    "print([pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())])'"
)


@pytest.fixture
def clean_lab():
    assert os.geteuid() == 0, "the lab tests need root"
    with lab_lock():
        manager.down()
        yield
        assert manager.down() == []


def test_fleet_over_ssh(clean_lab):
    state = manager.up(SCENARIO, with_cluster=False)
    scenario = load(SCENARIO)
    assert manager.status()["nodes"] == {
        node: {"address": info["address"], "sshd": "running"} for node, info in state["nodes"].items()
    }
    completed = subprocess.run(
        [ANSIBLE, "-i", state["inventory"], "all", "-m", "gpuharden.k8s.gpu_facts"],
        capture_output=True, text=True, check=False, cwd=REPO_ROOT,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg")),
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    for spec in scenario.nodes:
        assert "%s | SUCCESS" % spec.name in completed.stdout
        if spec.fixture is None:
            continue
        fixture = json.loads((NVML_FIXTURES / (spec.fixture + ".json")).read_text())
        # Each node answers with its own fixture's GPUs, through its own libnvidia-ml.so.1.
        result = manager.ssh(state["nodes"][spec.name]["address"], LIST_UUIDS % (layout.NODE_PYTHON / "bin/python"))
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str([gpu["uuid"] for gpu in fixture["gpus"]])


def test_nodes_are_isolated_from_the_host_and_each_other(clean_lab):
    host_name = socket.gethostname()
    state = manager.up(SCENARIO, with_cluster=False)
    for node, info in state["nodes"].items():  # each node has its own UTS namespace
        assert manager.ssh(info["address"], "hostname").stdout.strip() == node
    assert socket.gethostname() == host_name
    first, second = (info["address"] for info in list(state["nodes"].values())[:2])
    marker = "/var/lib/kubelet/gpuharden-isolation-marker"
    assert manager.ssh(first, "mkdir -p /var/lib/kubelet && echo one > %s" % marker).returncode == 0
    assert manager.ssh(second, "test ! -e %s" % marker).returncode == 0
    assert not os.path.exists(marker)
    # The node sees cgroup2 at /sys/fs/cgroup, rooted at its own subtree.
    cgroup = manager.ssh(first, "stat -f -c %T /sys/fs/cgroup; grep '^0::' /proc/self/cgroup")
    fs_type, own_cgroup = cgroup.stdout.split()
    assert fs_type == "cgroup2fs"
    assert own_cgroup.startswith("0::/system.slice/")
    # bash reads root's ~/.bashrc for every ssh command: the node's own, as a fresh install leaves it, not the host's
    if os.path.exists("/root/.bashrc"):
        assert manager.ssh(first, "cat /root/.bashrc").stdout == lab_node.NODE_BASHRC


HOST_TREES = ["/etc", "/var/log", "/var/lib", "/usr/local", "/root", "/run", "/dev"]


def host_files_changed_since(marker: str) -> list[str]:
    """Files under the host's system trees newer than ``marker`` (caches the tools keep are not the lab's, nor libuuid's
    clock, which any process on the host that makes a time-based UUID updates: Python's uuid.uuid1() goes through
    libuuid, which keeps /var/lib/libuuid/clock.txt wherever the uuid-runtime package made that directory; nor pyenv's
    shims, which its pip hook (pyenv.d/exec/pip-rehash.bash) rehashes through a prototype file, shims/.pyenv-shim,
    after any `python -m pip` that goes through a pyenv shim: one in another stream of a fresh `make test` ran while
    this test did, and the test failed on it)."""
    completed = subprocess.run(
        ["find", *HOST_TREES, "-xdev", "-newer", marker, "-not", "-path", "/root/.cache/*", "-not", "-path", "/root/.ansible/*",
         "-not", "-path", "/root/.config/go/*", "-not", "-path", "/run/netns*", "-not", "-path", "/var/lib/libuuid/*",
         "-not", "-path", "/root/.pyenv/shims/*", "-not", "-type", "d"],
        capture_output=True, text=True, check=False,
    )
    return sorted(line for line in completed.stdout.splitlines() if line)


def test_up_down_cycles_leave_nothing(clean_lab, tmp_path):
    marker = tmp_path / "marker"
    marker.write_text("")
    before = set(host_files_changed_since(str(marker)))
    for _ in range(2):
        manager.up(SCENARIO, with_cluster=False)
        assert manager.leftovers()  # something exists while up
        assert manager.down() == []
    assert set(host_files_changed_since(str(marker))) - before == set()


def test_crashed_up_is_cleaned_by_down(clean_lab):
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuharden.cli", "lab", "up", "--scenario", SCENARIO, "--no-cluster"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not list(layout.NODES_DIR.glob("*/sshd.pid")) and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)  # no cleanup handler runs
    process.wait()
    assert manager.leftovers(), "the crash should have left something to clean"
    assert manager.down() == []


def test_up_refuses_a_second_lab_and_unknown_scenarios(clean_lab):
    manager.up(SCENARIO, with_cluster=False)
    with pytest.raises(LabError, match="already up"):
        manager.up(SCENARIO, with_cluster=False)
    with pytest.raises(LabError, match="unknown scenario"):
        load("no-such-scenario")


def test_lab_needs_root_and_says_so():
    script = (
        "import os, gpuharden.cli, gpuharden_lab.cli\n"
        "parser = gpuharden.cli.build_parser()\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "args = parser.parse_args(['lab', 'status'])\n"
        "raise SystemExit(args.handler(args))\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert completed.returncode == 2, completed.stderr
    assert "needs root" in completed.stderr


def _other_instance_cli(instance: int, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUHARDEN_LAB_INSTANCE=str(instance))
    env.pop("GPUHARDEN_LAB_DIR", None)
    return subprocess.run([sys.executable, "-m", "gpuharden.cli", "lab", *args], capture_output=True, text=True,
                          check=False, env=env, cwd=REPO_ROOT)


def _named_leftovers() -> list[str]:
    """What `lab down` would remove by name (netns, links, cgroup, directory, inventory); processes come and go."""
    return [item for item in manager.leftovers() if not item.startswith("process ")]


def test_a_second_instance_comes_and_goes_without_touching_this_one(clean_lab):
    """Two labs at once (make integration runs one per worker): the other's up and down leave this one whole."""
    other = layout.MAX_INSTANCE if layout.INSTANCE != layout.MAX_INSTANCE else 0
    own = manager.up(SCENARIO, with_cluster=False)
    own_leftovers = _named_leftovers()
    with open("/var/tmp/gpuharden-lab%s.lock" % (other or ""), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            up = _other_instance_cli(other, "up", "--scenario", SCENARIO, "--no-cluster")
            assert up.returncode == 0, up.stderr[-3000:]
            theirs = json.loads(up.stdout)
            assert {info["address"] for info in theirs["nodes"].values()}.isdisjoint(
                info["address"] for info in own["nodes"].values())
            assert theirs["inventory"] != own["inventory"]
            # This instance counts none of the other's netns, links, cgroup, directory, inventory or processes.
            assert _named_leftovers() == own_leftovers
            down = _other_instance_cli(other, "down")
            assert down.returncode == 0, down.stderr[-3000:]
            assert "nothing left behind" in down.stdout + down.stderr
        finally:
            _other_instance_cli(other, "down")
            fcntl.flock(handle, fcntl.LOCK_UN)
    assert _named_leftovers() == own_leftovers
    for info in own["nodes"].values():
        result = manager.ssh(info["address"], "true")
        assert result.returncode == 0, result.stderr
    assert manager.status()["nodes"] == {node: {"address": info["address"], "sshd": "running"} for node, info in own["nodes"].items()}
