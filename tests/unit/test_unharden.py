# SPDX-License-Identifier: GPL-3.0-or-later
"""The uninstall: every file gpuharden's modules write keeps its original in a record; unharden puts it back only
where the file still holds what gpuharden wrote (a file changed since is left and reported, unless forced), removes
the files gpuharden created and the backups it made, and takes off the Node labels and taints it set (never those
it removed) and only its own cluster objects."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _unharden_cluster as uc
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._node_labels import ORIGINALS_ANNOTATION, merge_patched
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._node_labels import plan as label_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _originals
from ansible_collections.gpuharden.k8s.plugins.modules import unharden_files


class FakeModule:
    def __init__(self, root, name="gpuharden.k8s.containerd_nvidia_runtime", check_mode=False, **params):
        self._name = name
        self.params = dict(root=str(root), unsafe_writes=False, **params)
        self.check_mode = check_mode
        self._diff = True
        self.warnings = []
        self.counter = 0

    def atomic_move(self, src, dest, unsafe_writes=False):
        os.replace(src, dest)

    def backup_local(self, path):
        self.counter += 1
        backup = "%s.%d.2026-01-01@00:00:0%d~" % (path, 4242, self.counter)
        shutil.copy2(path, backup)
        return backup

    def warn(self, text):
        self.warnings.append(text)


def write(path, text, mode=0o640):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def harden(root, path, after, name="gpuharden.k8s.containerd_nvidia_runtime", backup=True):
    module = FakeModule(root, name)
    before = _files.read_text(str(path))
    _files.apply_changes(module, [_files.FileChange(str(path), before, after)], backup=backup)


def unharden(root, check=False, **params):
    options = {name: spec.get("default") for name, spec in unharden_files.argument_spec().items() if name != "root"}
    options.update(params)
    module = FakeModule(root, "gpuharden.k8s.unharden_files", check_mode=check, **options)
    return unharden_files.run(module)


def tree(root):
    """Every file and directory under root, with its content and mode: what must come back byte for byte."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = "dir %o" % (os.stat(os.path.join(dirpath, name)).st_mode & 0o7777)
        for name in filenames:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, root)] = (Path(full).read_bytes(), os.stat(full).st_mode & 0o7777)
    return out


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "node"
    write(root / "etc/containerd/config.toml", "version = 2\n# the admin's\n", 0o600)
    write(root / "var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\n")
    return root


def test_round_trip_is_byte_for_byte(node):
    pristine = tree(node)
    harden(node, node / "etc/containerd/config.toml", "version = 2\n# gpuharden\n")
    harden(node, node / "etc/containerd/conf.d/99-nvidia.toml", "[nvidia]\n")  # created, with its directory
    harden(node, node / "var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\ntopologyManagerPolicy: x\n",
           name="gpuharden.k8s.kubelet_config")
    harden(node, node / "etc/containerd/config.toml", "version = 2\n# gpuharden, second run\n")  # a second write
    assert tree(node) != pristine
    record = _originals.load_record(str(node), "/etc/containerd/config.toml")
    assert record["original"] == "version = 2\n# the admin's\n" and record["original_stat"]["mode"] == 0o600
    assert len(record["backups"]) == 2 and record["others"] == []
    assert oct(os.stat(_originals.record_file(str(node), "/etc/containerd/config.toml")).st_mode & 0o777) == "0o600"

    checked = unharden(node, check=True)
    assert checked["changed"] and sorted(checked["restart"]) == ["containerd", "kubelet"]
    assert {entry["path"]: entry["action"] for entry in checked["files"]} == {
        "/etc/containerd/config.toml": "restore", "/etc/containerd/conf.d/99-nvidia.toml": "remove",
        "/var/lib/kubelet/config.yaml": "restore"}
    assert any(d["after"] == "version = 2\n# the admin's\n" for d in checked["diff"])
    assert tree(node) != pristine  # check mode touched nothing

    done = unharden(node)
    assert done["changed"] and done["conflicts"] == []
    assert tree(node) == pristine  # contents, modes, no backups, no records, no directories of gpuharden's
    again = unharden(node)
    assert not again["changed"] and again["files"] == []


def test_a_file_changed_since_is_left_and_reported_unless_forced(node):
    harden(node, node / "etc/containerd/config.toml", "version = 2\n# gpuharden\n")
    write(node / "etc/containerd/config.toml", "version = 2\n# the admin again\n", 0o600)
    result = unharden(node)
    assert not result["changed"]
    assert result["conflicts"][0]["path"] == "/etc/containerd/config.toml"
    assert "changed since gpuharden wrote it" in result["conflicts"][0]["reason"]
    assert (node / "etc/containerd/config.toml").read_text() == "version = 2\n# the admin again\n"
    assert result["files"][0]["backups_kept"]  # the backups of a file left in conflict stay
    forced = unharden(node, force=True)
    assert forced["changed"] and (node / "etc/containerd/config.toml").read_text() == "version = 2\n# the admin's\n"
    assert len(forced["backups_made"]) == 1
    assert Path(str(node) + forced["backups_made"][0]).read_text() == "version = 2\n# the admin again\n"
    # gpuharden's own backups hold the original, which is back in place: they go; the admin's content stays
    assert sorted(p.name for p in (node / "etc/containerd").iterdir()) == ["config.toml", Path(forced["backups_made"][0]).name]


def test_a_change_between_two_gpuharden_runs_is_remembered(node):
    harden(node, node / "etc/containerd/config.toml", "version = 2\n# gpuharden\n")
    write(node / "etc/containerd/config.toml", "version = 2\n# the admin, between runs\n", 0o600)
    harden(node, node / "etc/containerd/config.toml", "version = 2\n# gpuharden over the admin\n")
    result = unharden(node)
    assert [c["path"] for c in result["conflicts"]] == ["/etc/containerd/config.toml"]
    assert "between two gpuharden runs" in result["conflicts"][0]["reason"]


def test_writers_limit_what_is_undone(node):
    harden(node, node / "etc/containerd/config.toml", "version = 2\n# gpuharden\n")
    harden(node, node / "var/lib/kubelet/config.yaml", "kind: KubeletConfiguration\nx: 1\n", name="gpuharden.k8s.kubelet_config")
    result = unharden(node, writers=["containerd_nvidia_runtime"])
    assert result["restart"] == ["containerd"]
    assert (node / "var/lib/kubelet/config.yaml").read_text().endswith("x: 1\n")
    assert [entry["path"] for entry in unharden(node, check=True)["files"]] == ["/var/lib/kubelet/config.yaml"]


def test_a_removed_checkpoint_needs_the_disruptive_path(node):
    write(node / "var/lib/kubelet/cpu_manager_state", '{"policyName":"none"}')
    harden(node, node / "var/lib/kubelet/cpu_manager_state", None, name="gpuharden.k8s.kubelet_config", backup=False)
    write(node / "var/lib/kubelet/cpu_manager_state", '{"policyName":"static"}')  # the kubelet's new one
    result = unharden(node, check=True)
    assert result["disruptive"] and result["conflicts"][0]["path"] == "/var/lib/kubelet/cpu_manager_state"
    done = unharden(node, checkpoints=True)
    assert done["changed"] and (node / "var/lib/kubelet/cpu_manager_state").read_text() == '{"policyName":"none"}'
    # no checkpoint before gpuharden: the kubelet's goes
    harden(node, node / "var/lib/kubelet/memory_manager_state", '{"policyName":"None"}', name="gpuharden.k8s.kubelet_config")
    write(node / "var/lib/kubelet/memory_manager_state", '{"policyName":"Static"}')
    assert unharden(node, checkpoints=True)["changed"] and not (node / "var/lib/kubelet/memory_manager_state").exists()


def test_an_already_stale_checkpoint_never_comes_back(node):
    """The seeded failure: the kubelet refused its checkpoint before gpuharden came (policy none in the checkpoint,
    static configured).  Putting it back would stop the kubelet again, so the uninstall removes the kubelet's new one
    (it writes a fresh one for the restored policy) and says why."""
    write(node / "var/lib/kubelet/cpu_manager_state", '{"policyName":"none"}')
    module = FakeModule(node, "gpuharden.k8s.kubelet_config")
    change = _files.FileChange(str(node / "var/lib/kubelet/cpu_manager_state"), '{"policyName":"none"}', None,
                               reason="stale checkpoint: checkpoint policy none differs from configured policy static")
    change.restorable = False
    _files.apply_changes(module, [change], backup=False)
    write(node / "var/lib/kubelet/cpu_manager_state", '{"policyName":"static"}')  # the kubelet's new one
    done = unharden(node, checkpoints=True)
    entry = next(entry for entry in done["files"] if entry["path"] == "/var/lib/kubelet/cpu_manager_state")
    assert entry["action"] == "remove" and "already stale" in entry["reason"], entry
    assert not (node / "var/lib/kubelet/cpu_manager_state").exists()
    assert unharden(node, checkpoints=True)["changed"] is False


def test_an_unreadable_record_changes_nothing(node):
    harden(node, node / "etc/containerd/config.toml", "version = 2\n# gpuharden\n")
    with open(_originals.record_file(str(node), "/etc/containerd/config.toml"), "w") as handle:
        handle.write("{not json")
    with pytest.raises(Exception) as caught:
        unharden(node)
    assert "cannot be read" in str(caught.value)
    assert (node / "etc/containerd/config.toml").read_text() == "version = 2\n# gpuharden\n"


# --- cluster side -------------------------------------------------------------------------------------------

def _node(name, labels=None, taints=None, annotations=None):
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}, "resourceVersion": "3"},
            "spec": {"taints": taints} if taints else {}}


def _labelled(live, nodes, taint=None, state="ignore"):
    """The Nodes after gpu_node_labels applied its patches (merge patch semantics for what it sends)."""
    patches, _b, _a = label_plan(live, nodes, [], {"nvidia.com/gpu.present": "true"}, taint, state)
    return [merge_patched(obj, patches.get(obj["metadata"]["name"]) or {}) for obj in live]


def _objects():
    mine = {"kind": "DaemonSet", "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system",
                                              "labels": {"app.kubernetes.io/managed-by": "gpuharden"},
                                              "managedFields": [{"manager": "gpuharden", "operation": "Apply"}]}}
    helm = {"kind": "DaemonSet", "metadata": {"name": "other", "namespace": "gpu", "labels": {"app.kubernetes.io/managed-by": "gpuharden"},
                                              "managedFields": [{"manager": "helm", "operation": "Update"}]}}
    return [mine, helm]


def test_nodes_get_back_what_gpuharden_set_and_only_its_objects_go():
    taint = {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}
    live = [_node("a", {"keep": "1"}), _node("b", {"nvidia.com/gpu.present": "yes"})]
    hardened = _labelled(live, ["a", "b"], taint, "present")
    plan = uc.plan(hardened, ["a", "b"], _objects())
    assert plan["conflicts"] == []
    assert plan["patches"]["a"]["metadata"]["labels"] == {"nvidia.com/gpu.present": None}
    assert plan["patches"]["a"]["spec"] == {"taints": None}
    assert plan["patches"]["b"]["metadata"]["labels"] == {"nvidia.com/gpu.present": "yes"}
    assert plan["patches"]["a"]["metadata"]["annotations"] == {ORIGINALS_ANNOTATION: None}
    assert [o["metadata"]["name"] for o in plan["remove"]] == ["nvidia-device-plugin-daemonset"]  # not helm's


def test_a_label_changed_since_is_a_conflict_and_objects_stay_while_other_nodes_are_hardened():
    live = [_node("a"), _node("b")]
    hardened = _labelled(live, ["a", "b"])
    hardened[0]["metadata"]["labels"]["nvidia.com/gpu.present"] = "false"  # someone else's value now
    plan = uc.plan(hardened, ["a"], _objects())
    assert plan["conflicts"][0]["label"] == "nvidia.com/gpu.present"
    assert "annotations" not in (plan["patches"].get("a") or {}).get("metadata", {})
    assert plan["remove"] == [] and "b" in plan["kept"][0]["reason"]
    assert uc.plan(hardened, ["a"], [], force=True)["patches"]["a"]["metadata"]["labels"] == {"nvidia.com/gpu.present": None}


def test_a_node_gpuharden_never_labelled_is_left_alone():
    assert uc.plan([_node("a", {"nvidia.com/gpu.present": "true"})], ["a"], [])["patches"] == {}


class FakeClient:
    """Records the requests unharden_cluster makes; answers LISTs from fixed objects."""

    def __init__(self, nodes, objects):
        self.nodes, self.objects, self.calls, self.requests = nodes, objects, [], 0
        self.api = type("Api", (), {"close": lambda self: None})()

    def list(self, kind, page_limit, namespace=None, **selectors):
        self.calls.append(("list", kind, namespace, selectors.get("label_selector")))
        if kind == "Node":
            return self.nodes
        return [o for o in self.objects if o["kind"] == kind and (namespace is None or o["metadata"].get("namespace") == namespace)]

    def merge_patch(self, kind, name, patch, dry_run, namespace=None):
        self.calls.append(("patch", kind, name, dry_run))

    def delete(self, kind, name, namespace, dry_run):
        self.calls.append(("delete", kind, name, dry_run))


@pytest.mark.parametrize("check", [True, False])
def test_unharden_cluster_module_lists_once_and_dry_runs_in_check_mode(monkeypatch, check):
    from ansible_collections.gpuharden.k8s.plugins.modules import unharden_cluster

    hardened = _labelled([_node("a")], ["a"])
    objects = [dict(o, kind=o["kind"]) for o in _objects()] + [
        {"kind": "ConfigMap", "metadata": {"name": "nvidia-device-plugin-config", "namespace": "kube-system",
                                           "labels": {"app.kubernetes.io/managed-by": "gpuharden"},
                                           "managedFields": [{"manager": "gpuharden", "operation": "Apply"}]}}]
    fake = FakeClient(hardened, objects)
    monkeypatch.setattr(unharden_cluster._k8s_objects, "Client", lambda api, who: fake)
    monkeypatch.setattr(unharden_cluster._k8s, "api_client", lambda params: None)
    module = FakeModule("/", "gpuharden.k8s.unharden_cluster", check_mode=check, nodes=["a"], force=False,
                        remove_objects=True, namespace="kube-system", page_limit=500)
    result = unharden_cluster.run(module)
    assert result["changed"]
    assert sorted(result["objects_removed"]) == ["ConfigMap kube-system/nvidia-device-plugin-config",
                                                 "DaemonSet kube-system/nvidia-device-plugin-daemonset"]
    lists = [call for call in fake.calls if call[0] == "list"]
    assert ("list", "ConfigMap", "kube-system", "app.kubernetes.io/managed-by=gpuharden") in lists
    # the RBAC grants ConfigMaps only in the plugin's namespace: none cluster-wide, none where another installer's DaemonSet is
    assert [call[2] for call in lists if call[1] == "ConfigMap"] == ["kube-system"]
    assert [call for call in fake.calls if call[0] == "patch"] == ([] if check else [("patch", "Node", "a", False)])
    assert {call[3] for call in fake.calls if call[0] == "delete"} == {check}  # dryRun=All in check mode


# -- issue 47: a record whose fields hold what gpuharden never writes is refused before anything is restored ---------


@pytest.mark.parametrize(("field", "value"), [
    ("original_stat", {"mode": "0644", "uid": 0, "gid": 0}),
    ("original_stat", {"mode": 0o644, "uid": -1, "gid": 0}),
    ("backups", ["relative/backup~"]),
    ("original", 42),
    ("kind", "socket"),
])
def test_an_edited_record_is_refused_naming_the_record_and_the_field(tmp_path, field, value):
    from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

    record = {"version": 1, "path": "/etc/x.conf", "writer": "kubelet_config", "kind": "file", "recorded": "now",
              "original": "a\n", "original_stat": {"mode": 0o644, "uid": 0, "gid": 0}, "created_dirs": [], "written": None,
              "previous": None, "others": [], "backups": []}
    record[field] = value
    target = _originals.record_file(str(tmp_path), "/etc/x.conf")
    os.makedirs(os.path.dirname(target))
    with open(target, "w") as handle:
        json.dump(record, handle)
    with pytest.raises(GpuhardenError) as caught:
        _originals.load_records(str(tmp_path))
    assert caught.value.msg.startswith("%s: field %s" % (target, field)) and "\n" not in caught.value.msg
