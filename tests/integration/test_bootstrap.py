# SPDX-License-Identifier: GPL-3.0-or-later
"""playbooks/bootstrap_gpu_node.yml on the bare lab: new nodes joined cordoned with the bootstrap taint, nothing
configured, their Python without nvidia-ml-py.

bare-l4-0 (2 L4s): reached with the node's system Python, which is externally managed (PEP 668, this Debian 12
host's), the bootstrap gives the node a venv with the node packages from wheels copied in (role node_prerequisites,
under /var/lib: /opt is the host's in the lab) and runs the node tasks with it, hardens every stage, the post-check
passes, and the Node ends Ready, schedulable, untainted, labelled, with 2 nvidia.com/gpu allocatable from the real
plugin; a second run changes nothing.  bare-dgx-lost-0 is bootstrapped without the venv step: pynvml.py is shipped to
the node's Python instead.

bare-dgx-lost-0 (GPU6 fallen off the bus, which no remediation fixes): the real NVIDIA container toolkit cannot create
the plugin's container there (its jit-cdi mode builds the CDI edits for every GPU, and NVML answers GPU_IS_LOST for
GPU 6: "failed to get full GPU device editors: error getting device handle for index '6': GPU is lost", measured), so
the bootstrap stops at the device plugin stage, whose rollout wait names the node and its pod's RunContainerError;
the node stays cordoned and tainted, the run reports it in the custom stat gpuharden_bootstrap_failed and fails that
host.  (With the lab's earlier stand-ins the same node failed later, in the post-check, with gpu_lost: the real
toolkit stops it first.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import ansible_runner
import pytest
import yaml
from gpuharden_lab import REPO_ROOT, manager
from gpuharden_lab.node import node_site_packages
from kubernetes import client

from tests.integration import cluster_side as cs
from tests.labfixtures import running_lab

# real_nodes: the bare lab's nodes run the real kubelet and containerd (they need real-components; `make real-nodes` runs only these).
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

PLAYBOOK = REPO_ROOT / "playbooks" / "bootstrap_gpu_node.yml"
GOOD, LOST = "bare-l4-0", "bare-dgx-lost-0"
TAINT = "gpuharden.io/bootstrap"
LABELS = {"gpuharden.io/hardened": "true", "nvidia.com/gpu.present": "true"}
NODE_PYTHON = str(REPO_ROOT / "build" / "node-python" / "bin" / "python")
SYSTEM_PYTHON = "/usr/bin/python3"  # GOOD's Python in the run's inventory: externally managed
VENV = "/var/lib/gpuharden/venv"


def _inventory(state, private):
    """The lab's inventory, GOOD reached with the node's system Python."""
    with open(state["inventory"]) as handle:
        inventory = yaml.safe_load(handle)
    inventory["all"]["children"]["gpu_nodes"]["hosts"][GOOD]["ansible_python_interpreter"] = SYSTEM_PYTHON
    path = os.path.join(private, "hosts.yml")
    with open(path, "w") as handle:
        yaml.safe_dump(inventory, handle)
    return path


def bootstrap(state, limit, **extravars):
    """ansible-runner over the lab inventory, the API steps as the tool's own identity (the shipped RBAC): a summary."""
    envvars = {
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    with tempfile.TemporaryDirectory(prefix="gpuharden-bootstrap-test-") as private:
        started = time.monotonic()
        runner = ansible_runner.run(
            private_data_dir=private, project_dir=str(REPO_ROOT), inventory=_inventory(state, private), envvars=envvars,
            playbook=str(PLAYBOOK), limit=limit, extravars=extravars, quiet=True,
        )
        seconds = time.monotonic() - started
        events = list(runner.events)
        stdout = runner.stdout.read()
        stats = runner.stats or {}
    custom = {}
    for event in events:
        if event.get("event") == "playbook_on_stats":
            custom = (event["event_data"].get("artifact_data") or {})
    found = cs.results(events)
    changed = [(r["_host"], r["_task"]) for r in found if r["_event"] == "runner_on_ok" and r.get("changed")]
    return {"rc": runner.rc, "stats": stats, "custom": custom, "results": found, "changed": changed,
            "seconds": seconds, "stdout": stdout}


def _explain(run):
    return "rc=%s failures=%s\n%s" % (run["rc"], cs.failures(run["results"]), run["stdout"][-4000:])


@pytest.fixture(scope="module")
def lab():
    with running_lab("bare") as state:
        api = cs.admin(state)
        state["_core"] = client.CoreV1Api(api)
        yield state
        api.close()


@pytest.fixture(scope="module")
def venv_options():
    """The node packages as wheels for the node's Python (pip download, as for an air-gapped node)."""
    with tempfile.TemporaryDirectory(prefix="gpuharden-bootstrap-wheels-") as wheels:
        subprocess.run([SYSTEM_PYTHON, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", wheels, "-r",
                        str(REPO_ROOT / "requirements-node.txt")], check=True)
        yield {"node_prerequisites_venv": VENV, "node_prerequisites_wheels": wheels, "node_prerequisites_wheels_dest": "/var/lib/gpuharden/wheels"}


@pytest.fixture(scope="module")
def first(lab, venv_options):
    run = bootstrap(lab, GOOD, **venv_options)
    print("bootstrap of %s: %.1fs" % (GOOD, run["seconds"]))
    return run


@pytest.fixture(scope="module")
def second(lab, first, venv_options):
    run = bootstrap(lab, GOOD, **venv_options)
    print("second bootstrap of %s: %.1fs" % (GOOD, run["seconds"]))
    return run


@pytest.fixture(scope="module")
def failed(lab, second):
    # The plugin's rollout wait is stated shorter than its default 300 s: the real toolkit refuses its container at once.
    run = bootstrap(lab, LOST, device_plugin_wait_timeout=60, gpuharden_bootstrap_node_venv=False)
    print("bootstrap of %s (GPU lost): %.1fs" % (LOST, run["seconds"]))
    return run


def _bootstrap_taints(node):
    """The bootstrap taint (the node lifecycle controller adds node.kubernetes.io/unschedulable to a cordoned node)."""
    return [(t.key, t.effect) for t in node.spec.taints or [] if t.key == TAINT]


def _ssh(state, node, command):
    return manager.ssh(state["nodes"][node]["address"], command)


def test_the_bare_nodes_start_bare(lab):
    """What the scenario promises, read before any bootstrap ran."""
    core = lab["_core"]
    for name in (GOOD, LOST):
        node = core.read_node(name)
        assert node.spec.unschedulable is True
        assert _bootstrap_taints(node) == [(TAINT, "NoSchedule")]
        assert not set(LABELS) & set(node.metadata.labels)
        assert "nvidia.com/gpu" not in (node.status.allocatable or {})
        assert _ssh(lab, name, "%s -c 'import pynvml'" % NODE_PYTHON).returncode != 0
        assert _ssh(lab, name, "ls /dev/nvidia0 /dev/nvidiactl").returncode == 0
        assert "nvidia" not in _ssh(lab, name, "cat /etc/containerd/config.toml").stdout
        assert "topologyManagerPolicy" not in _ssh(lab, name, "cat /var/lib/kubelet/config.yaml").stdout
    assert client.AppsV1Api(core.api_client).list_daemon_set_for_all_namespaces().items == []
    assert client.NodeV1Api(core.api_client).list_runtime_class().items == []
    # the host (and the other lab nodes) keep their nvidia-ml-py: the whiteout is the node's own
    assert (node_site_packages() / "pynvml.py").is_file()


def test_bootstrap_succeeds(first):
    assert first["rc"] == 0, _explain(first)
    assert GOOD in first["custom"].get("gpuharden_bootstrap_ready", {}), first["custom"]
    assert "gpuharden_bootstrap_failed" not in first["custom"]


# the python step ships pynvml.py itself (its result's copied: ansible.builtin.copy's)
PYTHON_TASK = "Bootstrap | find the Python that runs the modules on the node, ship pynvml.py to it where it lacks pynvml"


def test_the_node_packages_went_into_a_venv_not_the_system_python(lab, first):
    """The PEP 668 node: the venv holds the packages, the node tasks ran with it, pynvml.py was not shipped."""
    [venv] = [r for r in first["results"] if r["_task"] == "Node prerequisites | create the venv with the node packages"]
    assert venv["_host"] == GOOD and venv["changed"] and venv["created"] and venv["python"] == VENV + "/bin/python3"
    [python] = [r for r in first["results"] if r["_task"] == PYTHON_TASK]
    assert python["python"] == VENV + "/bin/python3" and not python["pynvml"]["ship"] and "copied" not in python
    assert _ssh(lab, GOOD, "%s/bin/python3 -c 'import pynvml, ruamel.yaml, tomlkit, yaml'" % VENV).returncode == 0
    assert _ssh(lab, GOOD, "%s -c 'import tomlkit'" % SYSTEM_PYTHON).returncode != 0
    assert _ssh(lab, GOOD, "%s -c 'import pynvml'" % NODE_PYTHON).returncode != 0


def test_the_node_is_in_service(lab, first):
    node = lab["_core"].read_node(GOOD)
    conditions = {c.type: c.status for c in node.status.conditions or []}
    assert conditions.get("Ready") == "True"
    assert not node.spec.unschedulable
    assert TAINT not in [t.key for t in node.spec.taints or []]
    assert {key: node.metadata.labels.get(key) for key in LABELS} == LABELS


def test_gpus_are_allocatable(lab, first):
    """The device plugin the bootstrap installed registered both L4s (it tolerates the bootstrap taint)."""
    node = lab["_core"].read_node(GOOD)
    assert node.status.allocatable.get("nvidia.com/gpu") == "2"
    assert node.status.capacity.get("nvidia.com/gpu") == "2"


def test_the_stages_really_ran(lab, first):
    assert "runtimes.nvidia" in _ssh(lab, GOOD, "cat /etc/containerd/config.toml /etc/containerd/conf.d/*.toml 2>/dev/null").stdout
    assert _ssh(lab, GOOD, "systemctl is-active kubelet").stdout.strip() == "active"
    classes = [rc.metadata.name for rc in client.NodeV1Api(lab["_core"].api_client).list_runtime_class().items]
    assert classes == ["nvidia"]


def test_second_run_changes_nothing(second):
    assert second["rc"] == 0, _explain(second)
    assert second["changed"] == []
    assert second["stats"].get("changed", {}).get(GOOD, 0) == 0


def test_a_node_whose_lost_gpu_stops_the_plugins_container_stays_out_of_service(lab, failed):
    assert failed["rc"] != 0
    assert failed["stats"]["failures"].get(LOST) == 1
    report = failed["custom"]["gpuharden_bootstrap_failed"][LOST]
    assert report["node"] == LOST
    assert report["stage"].startswith("Device plugin |"), report
    assert "not ready on 1 node(s): %s (pod nvidia-device-plugin-" % LOST in report["reason"], report
    assert any(reason in report["reason"] for reason in ("RunContainerError", "CrashLoopBackOff")), report
    assert report["kept_cordoned"] and report["kept_tainted"]
    assert LOST not in failed["custom"].get("gpuharden_bootstrap_ready", {})
    node = lab["_core"].read_node(LOST)
    assert node.spec.unschedulable is True
    assert _bootstrap_taints(node) == [(TAINT, "NoSchedule")]
    assert "gpuharden.io/hardened" not in node.metadata.labels
    # without the venv step, pynvml.py went to the node's Python
    shipped = [r for r in failed["results"] if r["_task"] == PYTHON_TASK]
    assert [(r["_host"], r["_event"], r["changed"]) for r in shipped] == [(LOST, "runner_on_ok", True)]
    assert shipped[0]["copied"]["dest"] == shipped[0]["pynvml"]["dest"] == str(node_site_packages() / "pynvml.py")
    assert _ssh(lab, LOST, "%s -c 'import pynvml'" % NODE_PYTHON).returncode == 0
    # the node before it is untouched by the other node's failure
    assert not lab["_core"].read_node(GOOD).spec.unschedulable
