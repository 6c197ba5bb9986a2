# SPDX-License-Identifier: GPL-3.0-or-later
"""The uninstall on the fresh-fleet lab (2 L4 nodes on the real kubelet and containerd, never hardened; the lab
inventory opts into the static CPU Manager, so harden drains each node and removes the CPU Manager checkpoint the
real kubelet wrote for its default policy; containerd is set up without the
nvidia runtime first, fresh-0 version 3 with a conf.d import (harden creates a drop-in) and fresh-1 version 2 in one file
(harden edits it and keeps a backup)): harden, then unharden, and every
file the nodes wrote under /etc and /var/lib is byte for byte (and mode for mode) what it was, the Nodes carry the
labels and taints they had, gpuharden's DaemonSets, ConfigMap and RuntimeClass are gone, and a second unharden
changes nothing.

Compared: every regular file, symlink, whiteout and directory in the nodes' overlay upper layers of /etc and /var/lib
(what the node changed on top of the host; a host directory overlayfs copied up unchanged is the same directory to the
node), except the runtime state the real kubelet, containerd, the CNI plugins and the NVML double keep there
(VOLATILE), which changes with time whatever gpuharden does.  Exceptions the user can choose and this test does not:
gpuharden_unharden_keep_backups=true would keep the backups harden made (here they must be gone too).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import sys
import tempfile
import time
from pathlib import Path

import ansible_runner
import pytest
from gpuharden_lab import REPO_ROOT, layout, manager
from gpuharden_lab.nodefiles import containerd_files
from kubernetes import client

from tests.integration.cluster_side import admin
from tests.labfixtures import running_lab

# real_nodes: fresh-fleet's nodes run the real kubelet and containerd (they need real-components; `make real-nodes` runs only these).
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
NODES = ["fresh-0", "fresh-1"]
LAYERS = ("etc", "var-lib")
LOWER = {"etc": "/etc", "var-lib": "/var/lib"}  # the host directories each layer lies over (gpuharden_lab.node)
# Runtime state the real kubelet, containerd, the CNI plugins and the NVML double rewrite as pods come and go (not
# configuration): never compared.  The kubelet's pod checkpoints appear with the first pod it admits, here the plugin
# pod harden deployed (pkg/kubelet/allocation: allocated_pods_state, actuated_pods_state; pkg/kubelet/cm/dra:
# dra_manager_state); host-local IPAM keeps its leases under /var/lib/cni.
VOLATILE = ("var-lib/kubelet/pods", "var-lib/kubelet/device-plugins", "var-lib/kubelet/pod-resources",
            "var-lib/kubelet/plugins", "var-lib/kubelet/plugins_registry", "var-lib/containerd", "var-lib/nvml-double",
            "var-lib/kubelet/checkpoints", "var-lib/kubelet/state", "var-lib/lab", "var-lib/cni",
            "var-lib/kubelet/allocated_pods_state", "var-lib/kubelet/actuated_pods_state", "var-lib/kubelet/dra_manager_state")
MANAGED = "app.kubernetes.io/managed-by=gpuharden"


def playbook(state, name, check=False, extravars=None):
    """A playbook through ansible-runner over the lab inventory: (rc, stats, custom stats, seconds, stdout)."""
    with tempfile.TemporaryDirectory(prefix="gpuharden-unharden-test-") as private:
        started = time.monotonic()
        runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=state["inventory"],
                                    playbook=str(REPO_ROOT / "playbooks" / name), extravars=extravars or {},
                                    cmdline="--check --diff" if check else None, quiet=True)
        seconds = time.monotonic() - started
        custom = {}
        for event in runner.events:
            if event.get("event") == "playbook_on_stats":
                custom = event["event_data"].get("artifact_data") or {}
        return runner.rc, runner.stats or {}, custom, seconds, runner.stdout.read()


def _volatile(relative):
    return any(relative == prefix or relative.startswith(prefix + "/") for prefix in VOLATILE)


def files(name):
    """Every non-volatile entry a node wrote over the host's /etc and /var/lib: {path: (kind, sha256 or target, mode)}."""
    out = {}
    base = layout.NODES_DIR / name / "upper"
    for layer in LAYERS:
        top = base / layer
        for dirpath, dirnames, filenames in os.walk(top):
            for entry in dirnames + filenames:
                full = os.path.join(dirpath, entry)
                relative = os.path.relpath(full, base)
                if _volatile(relative):
                    continue
                info = os.lstat(full)
                if stat.S_ISDIR(info.st_mode):
                    lower = Path(LOWER[layer]) / os.path.relpath(full, top)
                    if lower.is_dir() and (lower.stat().st_mode & 0o7777) == (info.st_mode & 0o7777):
                        continue  # a host directory copied up when a file was written in it: the node sees the same
                    out[relative] = ("dir", "", info.st_mode & 0o7777)
                elif stat.S_ISLNK(info.st_mode):
                    out[relative] = ("link", os.readlink(full), 0)
                elif stat.S_ISCHR(info.st_mode):
                    out[relative] = ("whiteout", "", 0)
                else:
                    with open(full, "rb") as handle:
                        out[relative] = ("file", hashlib.sha256(handle.read()).hexdigest(), info.st_mode & 0o7777)
    return out


def snapshot():
    return {name: files(name) for name in NODES}


# Taints the control plane sets and lifts on its own: a cordon's, and the node lifecycle controller's while a kubelet
# reports NotReady or stops reporting (pkg/controller/nodelifecycle/node_lifecycle_controller.go, NotReadyTaintTemplate
# and UnreachableTaintTemplate), as a real kubelet does for a moment after its containerd restarts.
CONTROL_PLANE_TAINTS = ("node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def cluster(api):
    """The Nodes' labels, taints and cordon (without the taints the control plane sets and lifts itself), and the
    objects gpuharden manages."""
    core, apps, nodev1 = client.CoreV1Api(api), client.AppsV1Api(api), client.NodeV1Api(api)
    nodes = {}
    for name in NODES:
        node = core.read_node(name)
        nodes[name] = {"labels": dict(node.metadata.labels or {}),
                       "taints": sorted((t.key, t.value or "", t.effect) for t in node.spec.taints or []
                                        if t.key not in CONTROL_PLANE_TAINTS),
                       "unschedulable": bool(node.spec.unschedulable),
                       "originals": (node.metadata.annotations or {}).get("gpuharden.io/originals")}
    objects = sorted(["DaemonSet %s/%s" % (o.metadata.namespace, o.metadata.name)
                      for o in apps.list_daemon_set_for_all_namespaces(label_selector=MANAGED).items]
                     + ["ConfigMap %s/%s" % (o.metadata.namespace, o.metadata.name)
                        for o in core.list_config_map_for_all_namespaces(label_selector=MANAGED).items]
                     + ["RuntimeClass %s" % o.metadata.name for o in nodev1.list_runtime_class(label_selector=MANAGED).items])
    return {"nodes": nodes, "objects": objects}


def changes(before, after):
    """{node: {path: (before, after)}} of what differs."""
    out = {}
    for name in before:
        paths = set(before[name]) | set(after[name])
        diff = {path: (before[name].get(path), after[name].get(path)) for path in sorted(paths)
                if before[name].get(path) != after[name].get(path)}
        if diff:
            out[name] = diff
    return out


def changed_count(stats):
    return sum((stats.get("changed") or {}).values())


def without_nvidia_runtime(state):
    """containerd as a node without the NVIDIA toolkit's runtime has it: fresh-0 (version 3) imports conf.d/*.toml, fresh-1
    (version 2) is one file."""
    for name, (version, layout_name) in zip(NODES, ((3, "conf.d"), (2, "single")), strict=True):
        script = "rm -rf /etc/containerd/conf.d /etc/containerd/config.toml.*~\n"
        for path, text in containerd_files({"version": version, "layout": layout_name, "nvidia": False, "systemd_cgroup": False}).items():
            script += "cat > %s <<'EOF'\n%sEOF\n" % (path, text)
        done = manager.ssh(state["nodes"][name]["address"], script + "systemctl restart containerd")
        assert done.returncode == 0, (name, done.stderr)


@pytest.fixture(scope="module")
def lab():
    with running_lab("fresh-fleet", node_count=len(NODES)) as state:
        without_nvidia_runtime(state)
        api = admin(state)
        state["_api"] = api
        state["_pristine"] = snapshot()
        state["_pristine_cluster"] = cluster(api)
        yield state
        api.close()


@pytest.fixture(scope="module")
def hardened(lab):
    rc, stats, _custom, seconds, output = playbook(lab, "harden_gpu_nodes.yml")
    print("harden: %.1fs" % seconds)
    assert rc == 0, output[-6000:]
    lab["_hardened"] = snapshot()
    lab["_hardened_cluster"] = cluster(lab["_api"])
    return lab


@pytest.fixture(scope="module")
def checked(hardened):
    rc, stats, _custom, seconds, output = playbook(hardened, "unharden_gpu_nodes.yml", check=True)
    print("unharden --check: %.1fs" % seconds)
    return {"rc": rc, "stats": stats, "output": output, "snapshot": snapshot(), "cluster": cluster(hardened["_api"])}


@pytest.fixture(scope="module")
def unhardened(hardened, checked):
    rc, stats, custom, seconds, output = playbook(hardened, "unharden_gpu_nodes.yml")
    print("unharden: %.1fs" % seconds)
    assert rc == 0, output[-6000:]
    return {"stats": stats, "custom": custom, "snapshot": snapshot(), "cluster": cluster(hardened["_api"])}


@pytest.fixture(scope="module")
def again(unhardened, lab):
    rc, stats, _custom, seconds, output = playbook(lab, "unharden_gpu_nodes.yml")
    print("second unharden: %.1fs" % seconds)
    assert rc == 0, output[-6000:]
    return {"stats": stats, "output": output, "snapshot": snapshot()}


def test_the_nodes_start_unhardened(lab):
    pristine = lab["_pristine_cluster"]
    assert pristine["objects"] == []
    for name in NODES:
        assert "nvidia.com/gpu.present" not in pristine["nodes"][name]["labels"]
        ours = [path for path in lab["_pristine"][name] if path == "var-lib/gpuharden" or path.startswith("var-lib/gpuharden/")]
        assert ours == [], ours


def test_harden_changed_files_labels_and_objects(hardened):
    changed = changes(hardened["_pristine"], hardened["_hardened"])
    for name in NODES:
        paths = set(changed.get(name, {}))
        assert "etc/modprobe.d/zz-gpuharden-nvidia.conf" in paths, sorted(paths)
        # the durable route: gpuharden's drop-in and --config-dir in /etc/default/kubelet (created), kubeadm's config.yaml untouched
        assert {"etc/kubernetes/kubelet.conf.d/50-gpuharden.conf", "etc/default/kubelet", "var-lib/kubelet/cpu_manager_state"} <= paths, sorted(paths)
        assert "var-lib/kubelet/config.yaml" not in paths, sorted(paths)
    assert "etc/containerd/conf.d/99-nvidia.toml" in changed[NODES[0]], sorted(changed[NODES[0]])  # created
    assert "etc/containerd/config.toml" in changed[NODES[1]], sorted(changed[NODES[1]])  # edited, with a backup
    assert any(path.startswith("etc/containerd/config.toml.") for path in changed[NODES[1]]), sorted(changed[NODES[1]])
    for name in NODES:
        assert any(path.startswith("var-lib/gpuharden/originals/") for path in changed[name]), sorted(changed[name])
        assert hardened["_hardened_cluster"]["nodes"][name]["labels"].get("nvidia.com/gpu.present") == "true"
        assert hardened["_hardened_cluster"]["nodes"][name]["originals"]
    objects = hardened["_hardened_cluster"]["objects"]
    assert "RuntimeClass nvidia" in objects and any(o.startswith("DaemonSet ") for o in objects), objects
    assert any(o.startswith("ConfigMap ") for o in objects), objects


def test_check_mode_reports_and_changes_nothing(hardened, checked):
    assert checked["rc"] == 0, checked["output"][-6000:]
    assert changed_count(checked["stats"]) > 0
    assert changes(hardened["_hardened"], checked["snapshot"]) == {}
    assert checked["cluster"] == hardened["_hardened_cluster"]


def test_every_node_file_is_back_byte_for_byte(lab, unhardened):
    assert changes(lab["_pristine"], unhardened["snapshot"]) == {}
    assert "gpuharden_unharden_conflicts" not in unhardened["custom"]


def test_nodes_and_cluster_objects_are_back(lab, unhardened):
    assert unhardened["cluster"]["objects"] == []
    assert unhardened["cluster"]["nodes"] == lab["_pristine_cluster"]["nodes"]


def test_a_second_unharden_changes_nothing(unhardened, again):
    assert changed_count(again["stats"]) == 0, again["output"][-6000:]
    assert changes(unhardened["snapshot"], again["snapshot"]) == {}


# --- someone changed a file after gpuharden wrote it: left as it is (the host fails at the end), unless forced -----

ADMIN_LINE = "# the admin's own change, after gpuharden\n"


def sh(state, name, command):
    done = manager.ssh(state["nodes"][name]["address"], command)
    assert done.returncode == 0, (name, command, done.stderr)
    return done.stdout


@pytest.fixture(scope="module")
def conflicted(again, lab):
    rc, _stats, _custom, seconds, output = playbook(lab, "harden_gpu_nodes.yml")
    print("harden again: %.1fs" % seconds)
    assert rc == 0, output[-6000:]
    sh(lab, NODES[1], "printf %%s %s >> /etc/containerd/config.toml" % shlex.quote(ADMIN_LINE))
    edited = sh(lab, NODES[1], "cat /etc/containerd/config.toml")
    rc, _stats, custom, seconds, output = playbook(lab, "unharden_gpu_nodes.yml")
    print("unharden with a conflict: %.1fs" % seconds)
    return {"rc": rc, "custom": custom, "output": output, "snapshot": snapshot(), "edited": edited,
            "left": sh(lab, NODES[1], "cat /etc/containerd/config.toml")}


@pytest.fixture(scope="module")
def forced(conflicted, lab):
    rc, _stats, _custom, seconds, output = playbook(lab, "unharden_gpu_nodes.yml", extravars={"gpuharden_unharden_force": True})
    print("unharden forced: %.1fs" % seconds)
    assert rc == 0, output[-6000:]
    return {"snapshot": snapshot(), "backups": sh(lab, NODES[1], "cat /etc/containerd/config.toml.*.gpuharden-unharden~")}


def test_a_file_changed_since_is_left_reported_and_fails_the_host(lab, conflicted):
    assert ADMIN_LINE in conflicted["edited"]
    assert conflicted["rc"] != 0
    assert conflicted["left"] == conflicted["edited"]  # not clobbered
    reported = conflicted["custom"].get("gpuharden_unharden_conflicts") or {}
    assert list(reported) == [NODES[1]], reported
    assert [c["path"] for c in reported[NODES[1]]] == ["/etc/containerd/config.toml"], reported
    assert changes(lab["_pristine"], conflicted["snapshot"]).get(NODES[0]) is None  # the other node is all back
    rest = changes(lab["_pristine"], conflicted["snapshot"])[NODES[1]]
    assert "etc/modprobe.d/zz-gpuharden-nvidia.conf" not in rest and "etc/default/kubelet" not in rest, sorted(rest)
    assert "etc/containerd/config.toml" in rest  # and its record and backup stay for a later (forced) run
    assert any(path.startswith("var-lib/gpuharden/originals/") for path in rest), sorted(rest)


def test_force_restores_it_and_keeps_the_change_next_to_it(lab, forced, conflicted):
    left = changes(lab["_pristine"], forced["snapshot"])
    # The one exception to "byte for byte": the copy of the admin's content a forced restore keeps next to the file.
    assert list(left) == [NODES[1]], left
    assert len(left[NODES[1]]) == 1 and next(iter(left[NODES[1]])).endswith(".gpuharden-unharden~"), left
    assert forced["backups"] == conflicted["edited"]
