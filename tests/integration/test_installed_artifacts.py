# SPDX-License-Identifier: GPL-3.0-or-later
"""The adopter's path on the healthy lab (real nodes that this checkout's harden run left compliant), away from this
checkout: a new virtualenv with only the CLI's wheel (and what it requires, from PyPI), the collection tarball
installed into a scratch collections path, and the playbooks run by their FQCN from a directory with no ansible.cfg.

What the lab's hosts need from the controller's Ansible settings: nothing of this repository's ansible.cfg.  The
inventory the lab writes carries the connection itself (ansible_user root, the lab's SSH key, its known_hosts file
with StrictHostKeyChecking=yes, the nodes' Python); collections_path becomes ANSIBLE_COLLECTIONS_PATH (the scratch
path); the playbooks name roles by FQCN, so roles_path is not needed; pipelining, ControlPersist and forks only make
runs faster.  The only ANSIBLE_* variables set here are the collections path and, for results as data rather than
stdout, the ansible.builtin.tree callback.

The archives are those in dist/ when `make dist` built them after the last change to their sources, else built here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.distfixtures import REPO, built_or_build
from tests.integration.cluster_side import recap_changed
from tests.labfixtures import shared_lab

# real_nodes: the healthy lab's nodes run the real kubelet and containerd (they need real-components; `make real-nodes` runs only these).
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

COLLECTION = ("gpuharden", "k8s")


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    return built_or_build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def adopter(archives, tmp_path_factory):
    """A new virtualenv with the wheel, the tarball installed into a scratch collections path, and the environment
    an adopter's shell would have: the new venv's bin first, nothing of this checkout's venv, no ANSIBLE_* settings."""
    home = tmp_path_factory.mktemp("adopter")
    assert not home.resolve().is_relative_to(REPO.resolve()), home
    venv = home / "venv"
    # sys.executable is this checkout's venv; `-m venv` bases the new one on the interpreter underneath, without
    # its site-packages (no --system-site-packages: that would hide a missing requirement).
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(archives.wheel)],
                               capture_output=True, text=True, check=False)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("ANSIBLE_", "PYTHON", "VIRTUAL_ENV", "GPUHARDEN_"))}
    path = [entry for entry in os.environ["PATH"].split(os.pathsep) if entry and not Path(entry).resolve().is_relative_to(REPO.resolve())]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["ANSIBLE_COLLECTIONS_PATH"] = str(home / "collections")
    subprocess.run([str(venv / "bin" / "ansible-galaxy"), "collection", "install", "-p", str(home / "collections"), str(archives.collection)],
                   env=env, cwd=home, check=True, capture_output=True)
    return {"home": home, "bin": venv / "bin", "env": env,
            "collection": home / "collections" / "ansible_collections" / COLLECTION[0] / COLLECTION[1]}


@pytest.fixture(scope="module")
def lab():
    with shared_lab("healthy") as state:  # read-only here
        yield state


def _run(adopter, *argv, env=None):
    return subprocess.run([str(adopter["bin"] / argv[0]), *argv[1:]], cwd=adopter["home"], env=dict(adopter["env"], **(env or {})),
                          capture_output=True, text=True, check=False)


def _lab_hosts(state):
    return set(yaml.safe_load(Path(state["inventory"]).read_text())["all"]["children"]["gpu_nodes"]["hosts"])


def _playbook(adopter, name, inventory, *args):
    """ansible-playbook gpuharden.k8s.NAME; its rc and each host's last ok/failed result (the tree callback)."""
    tree = adopter["home"] / ("tree-%s" % name)
    completed = _run(adopter, "ansible-playbook", "%s.%s.%s" % (*COLLECTION, name), "-i", inventory, *args,
                     env={"ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree", "ANSIBLE_CALLBACK_TREE_DIR": str(tree)})
    results = {path.name: json.loads(path.read_text()) for path in tree.iterdir()} if tree.is_dir() else {}
    return completed, results


def test_installed_without_the_checkout_or_the_lab(adopter):
    version = _run(adopter, "ansible", "--version")
    assert version.returncode == 0, version.stderr
    assert "config file = None" in version.stdout, version.stdout
    assert str(adopter["bin"] / "python") in version.stdout or str(adopter["bin"]) in version.stdout, version.stdout
    assert not (adopter["collection"] / "tests").exists() and (adopter["collection"] / "MANIFEST.json").is_file()
    lab = _run(adopter, "python", "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('gpuharden_lab') is not None)")
    assert lab.returncode == 0, "gpuharden_lab is importable from the adopter's venv"
    usage = _run(adopter, "gpuharden", "--help")
    assert usage.returncode == 0 and "drift" in usage.stdout, usage.stdout + usage.stderr
    assert _run(adopter, "gpuharden", "lab", "status").returncode == 2, "`gpuharden lab` without the gpuharden-lab distribution"


def test_every_playbook_resolves_from_the_installed_collection(adopter):
    """Each identifier-named playbook by FQCN, each hyphenated wrapper by its installed path: one syntax check."""
    playbooks = sorted((adopter["collection"] / "playbooks").glob("*.yml"))
    names = [path.stem for path in playbooks if path.stem.isidentifier()]
    assert {"harden_gpu_nodes", "bootstrap_gpu_node", "drift_check", "audit_node", "postcheck"} <= set(names), names
    wrappers = [str(path) for path in playbooks if not path.stem.isidentifier()]
    completed = _run(adopter, "ansible-playbook", "--syntax-check", "-i", "localhost,",
                     *["%s.%s.%s" % (*COLLECTION, name) for name in names], *wrappers)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]


def test_drift_check_by_fqcn(adopter, lab):
    completed, results = _playbook(adopter, "drift_check", lab["inventory"], "-e", "gpuharden_drift_fail=false")
    # 0: every host audited; findings (if any) are data here, not failures (2) or unreachable hosts (4)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    hosts = _lab_hosts(lab)
    assert set(results) == hosts, (sorted(results), completed.stdout[-2000:])
    for host, result in results.items():
        # each host's last result is the set_stats of its node_audit report
        audit = result["ansible_stats"]["data"]["gpuharden_drift"][host]
        assert audit["node"] == host and isinstance(audit["findings"], list), audit
        assert audit["checks"] and "stages" in audit["summary"], audit


def test_harden_check_mode_by_fqcn(adopter, lab):
    completed, results = _playbook(adopter, "harden_gpu_nodes", lab["inventory"], "--check")
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-2000:]
    assert _lab_hosts(lab) <= set(results), sorted(results)
    # The lab reached its state by this checkout's harden run: the installed collection predicts no change.
    changed = recap_changed(completed.stdout)
    assert _lab_hosts(lab) <= set(changed) and set(changed.values()) == {0}, completed.stdout[-3000:]


def test_gpuharden_drift_finds_the_installed_collection(adopter, lab):
    report = adopter["home"] / "drift.json"
    completed = _run(adopter, "gpuharden", "drift", "-q", "-i", lab["inventory"], "--report", str(report))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]  # the hardened fleet is clean
    data = json.loads(report.read_text())
    assert set(data["nodes"]) == _lab_hosts(lab), sorted(data["nodes"])
    assert data["summary"]["clean"] == len(_lab_hosts(lab)), data["summary"]
    assert data["summary"]["unreachable"] == 0 and data["summary"]["failed"] == 0, data["summary"]


def test_the_readme_steps_from_the_adopters_venv(adopter, lab):
    """Issue 46's walk: README steps 1 to 5 with the installed artifacts only.  Step 1's node packages go into a venv
    on a node whose system Python refuses pip (PEP 668: the lab's nodes run this host's Debian Python), air-gapped
    from wheels `pip download` made; step 2 writes the tool's kubeconfig with `gpuharden kubeconfig`; step 4's drift
    with it exports the credential's expiry; step 5's harden, in check mode, changes nothing
    (test_harden_check_mode_by_fqcn)."""
    import re
    import time

    node = "gpu-l4-0"
    venv, wheels = "/var/lib/gpuharden/adopter-venv", adopter["home"] / "wheels"
    # the node's system Python is externally managed: pip into it is refused there
    pip = _run(adopter, "ansible", "gpu_nodes", "-i", lab["inventory"], "-l", node, "-m", "ansible.builtin.command",
               "-a", "/usr/bin/python3 -m pip install --dry-run --no-index tomlkit")
    assert pip.returncode != 0 and "externally-managed-environment" in pip.stdout, pip.stdout[-2000:]
    downloaded = _run(adopter, "pip", "download", "-q", "-d", str(wheels), "-r", str(REPO / "requirements-node.txt"))
    assert downloaded.returncode == 0, downloaded.stderr[-2000:]
    # README step 1, for nodes already in service (the lab's /opt is the host's: the venv goes under /var/lib)
    made = _run(adopter, "ansible", "gpu_nodes", "-i", lab["inventory"], "-l", node, "-b", "-m", "ansible.builtin.include_role",
                "-a", "name=gpuharden.k8s.node_prerequisites", "-e", "ansible_python_interpreter=/usr/bin/python3",
                "-e", "node_prerequisites_venv=%s" % venv, "-e", "node_prerequisites_wheels=%s" % wheels,
                "-e", "node_prerequisites_wheels_dest=/var/lib/gpuharden/wheels")
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-2000:]
    imports = _run(adopter, "ansible", "gpu_nodes", "-i", lab["inventory"], "-l", node, "-m", "ansible.builtin.command",
                   "-a", "%s/bin/python3 -c 'import pynvml, ruamel.yaml, tomlkit, yaml'" % venv)
    assert imports.returncode == 0, imports.stdout[-2000:]
    # README step 2: the tool's identity, from the admin kubeconfig
    tool = adopter["home"] / "gpuharden.kubeconfig"
    asked = time.time()
    made = _run(adopter, "gpuharden", "kubeconfig", "--admin-kubeconfig", lab["cluster"]["admin_kubeconfig"], "-o", str(tool), "--duration", "24h")
    assert made.returncode == 0, made.stdout + made.stderr
    # README step 4: drift with it, its expiry in the metrics
    metrics = adopter["home"] / "gpuharden.prom"
    drift = _run(adopter, "gpuharden", "drift", "-q", "-i", lab["inventory"], "-e", "gpuharden_kubeconfig=%s" % tool, "--prometheus", str(metrics))
    assert drift.returncode == 0, drift.stdout[-3000:] + drift.stderr[-3000:]
    match = re.search(r"^gpuharden_credential_expiry_timestamp_seconds (\S+)$", metrics.read_text(), re.M)
    assert match and asked + 24 * 3600 - 5 <= float(match.group(1)) <= time.time() + 24 * 3600 + 5, metrics.read_text()[-2000:]
