# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 46, item 2: the node_prerequisites role on a node whose system Python is externally managed (PEP 668).

The lab's nodes see the host's /usr/bin/python3 and its stdlib directory: on this Debian 12 host that Python carries
the EXTERNALLY-MANAGED marker (the test checks it first), so a plain `pip install` into it fails on the node with
pip's externally-managed-environment error.  The role then makes a venv from the same Python, air-gapped: wheels made
on the controller with `pip download` are copied to the node and installed with `--no-index`.  The venv lives under
/var/lib, one of the node's own overlay trees (/opt is the host's in the lab).  Nothing here needs the cluster.
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

from tests.integration import cluster_side as cs
from tests.labfixtures import running_lab

pytestmark = [pytest.mark.lab]

SYSTEM_PYTHON = "/usr/bin/python3"
VENV = "/var/lib/gpuharden/venv"
WHEELS_DEST = "/var/lib/gpuharden/wheels"
PACKAGES = ["nvidia-ml-py>=12.535,<14", "ruamel.yaml>=0.18,<0.20", "tomlkit>=0.13,<0.16", "PyYAML>=6,<7"]
ROLE_TASK = "Node prerequisites | create the venv with the node packages"

# As bootstrap_gpu_node.yml does it: the play takes the node tasks' Python from vars/node_python.yml, the role's action
# runs with the host's own Python (here the system one: the test's inventory says so) by itself, gpu_facts then with the venv's.
PLAYBOOK = """
- hosts: all
  gather_facts: false
  vars_files: [%(vars)s]
  tasks:
    - name: the role (its action takes the host's own Python)
      ansible.builtin.include_role:
        name: gpuharden.k8s.node_prerequisites
    - name: gpu_facts with the play's Python
      gpuharden.k8s.gpu_facts:
    - name: gpu_facts with the host's own Python
      gpuharden.k8s.gpu_facts:
      vars:
        ansible_python_interpreter: "{{ __gpuharden_host_python }}"
""" % {"vars": REPO_ROOT / "playbooks" / "vars" / "node_python.yml"}


def _inventory(state, private):
    """The lab's inventory with the node's system Python as the host's interpreter (the lab's own is a venv)."""
    with open(state["inventory"]) as handle:
        inventory = yaml.safe_load(handle)
    inventory["all"]["vars"]["ansible_python_interpreter"] = SYSTEM_PYTHON
    path = os.path.join(private, "hosts.yml")
    with open(path, "w") as handle:
        yaml.safe_dump(inventory, handle)
    return path


def _run(state, check=False, **extravars):
    """One ansible-runner run of PLAYBOOK over the lab inventory, in a private data dir of its own (ansible-runner keeps
    a run's command line there)."""
    envvars = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
               "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    with tempfile.TemporaryDirectory(prefix="gpuharden-node-prerequisites-test-") as private:
        with open(os.path.join(private, "play.yml"), "w") as handle:
            handle.write(PLAYBOOK)
        started = time.monotonic()
        runner = ansible_runner.run(private_data_dir=private, project_dir=private, inventory=_inventory(state, private), envvars=envvars,
                                    playbook=os.path.join(private, "play.yml"), extravars=extravars, quiet=True,
                                    cmdline="--check" if check else None)
        events = list(runner.events)
        stdout = runner.stdout.read()
    found = cs.results(events)
    return {"rc": runner.rc, "results": found, "stdout": stdout, "seconds": time.monotonic() - started,
            "changed": [r["_task"] for r in found if r["_event"] == "runner_on_ok" and r.get("changed")]}


def _result(run, task):
    return [r for r in run["results"] if r["_task"] == task]


@pytest.fixture(scope="module")
def lab():
    with running_lab("fresh-fleet", node_count=1, with_cluster=False, stand_ins=True) as state:
        yield state


@pytest.fixture(scope="module")
def node(lab):
    name = sorted(lab["nodes"])[0]
    return name, lab["nodes"][name]["address"]


@pytest.fixture(scope="module")
def wheels():
    """The node packages as wheels for the node's Python, as an admin makes them for an air-gapped node."""
    with tempfile.TemporaryDirectory(prefix="gpuharden-node-wheels-") as directory:
        subprocess.run([SYSTEM_PYTHON, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", directory, *PACKAGES], check=True)
        yield directory


@pytest.fixture(scope="module")
def runs(lab, wheels):
    options = {"node_prerequisites_venv": VENV, "node_prerequisites_wheels": wheels, "node_prerequisites_wheels_dest": WHEELS_DEST}
    done = {"check": _run(lab, check=True, **options)}
    done["first"] = _run(lab, **options)
    done["second"] = _run(lab, **options)
    for name, run in done.items():
        print("%s run: %.1fs" % (name, run["seconds"]))
    return done


def _ssh(node, command):
    return manager.ssh(node[1], command)


def test_the_system_python_refuses_pip_install(node, wheels):
    """PEP 668 on the node: the marker is in the system Python's stdlib directory, and pip refuses to install into it."""
    marker = _ssh(node, "%s -c 'import os, sysconfig; print(os.path.join(sysconfig.get_path(\"stdlib\"), \"EXTERNALLY-MANAGED\"))'" % SYSTEM_PYTHON)
    assert _ssh(node, "test -f %s" % marker.stdout.strip()).returncode == 0, "the lab host's Python is not marked externally managed"
    refused = _ssh(node, "%s -m pip install --no-index --find-links %s tomlkit" % (SYSTEM_PYTHON, wheels))
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr, refused
    assert _ssh(node, "%s -c 'import tomlkit'" % SYSTEM_PYTHON).returncode != 0


def test_check_mode_reports_the_venv_and_creates_nothing(node, runs):
    check = runs["check"]
    assert check["rc"] == 0, check["stdout"][-3000:]
    [venv] = _result(check, ROLE_TASK)
    assert venv["changed"] and venv["created"] and venv["installed"] == PACKAGES and not venv["ready"]
    # no venv yet: the play's node tasks keep the host's own Python, which lacks pynvml (reported, not a failure)
    [facts] = _result(check, "gpu_facts with the play's Python")
    assert facts["ansible_facts"]["gpuharden"]["nvml"]["reason"]["code"] == "pynvml_missing"


def test_the_role_makes_the_venv_and_a_node_module_runs_with_it(node, runs):
    first = runs["first"]
    assert first["rc"] == 0, first["stdout"][-3000:]
    [venv] = _result(first, ROLE_TASK)
    assert venv["changed"] and venv["created"] and venv["ready"] and venv["python"] == VENV + "/bin/python3"
    assert _ssh(node, "%s/bin/python3 -c 'import pynvml, ruamel.yaml, tomlkit, yaml'" % VENV).returncode == 0
    assert _ssh(node, "%s -c 'import tomlkit'" % SYSTEM_PYTHON).returncode != 0  # the system Python stays as it was
    [with_venv] = _result(first, "gpu_facts with the play's Python")
    facts = with_venv["ansible_facts"]["gpuharden"]
    assert facts["nvml"]["available"] is True and facts["gpu_count"] == 2, facts["nvml"]
    [with_system] = _result(first, "gpu_facts with the host's own Python")
    assert with_system["ansible_facts"]["gpuharden"]["nvml"]["reason"]["code"] == "pynvml_missing"


def test_a_second_run_changes_nothing(runs):
    second = runs["second"]
    assert second["rc"] == 0, second["stdout"][-3000:]
    assert second["changed"] == []
    [venv] = _result(second, ROLE_TASK)
    assert venv["installed"] == [] and all(state["satisfied"] for state in venv["packages"])
