# SPDX-License-Identifier: GPL-3.0-or-later
"""node_maintenance: the pure drain planner, the retry loops with a fake clock, the module's flow against a
fake cluster, and the 403 message helper."""

from __future__ import annotations

import importlib
import json
import socket

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _drain
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_access

from tests.unit.conftest import run_module

node_maintenance = importlib.import_module("ansible_collections.gpuharden.k8s.plugins.modules.node_maintenance")


def pod(name, node="n1", namespace="ml", owner=("ReplicaSet", "rs"), phase="Running", labels=None, volumes=None, mirror=False,
        deleting=False, uid=None):
    meta = {"name": name, "namespace": namespace, "uid": uid or "uid-" + name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner[0], "name": owner[1], "controller": True}]
    if mirror:
        meta["annotations"] = {_drain.MIRROR_ANNOTATION: "x"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node, "volumes": volumes or []}, "status": {"phase": phase}}


def pdb(name, match, allowed, namespace="ml"):
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": {"matchLabels": match}},
            "status": {"disruptionsAllowed": allowed}}


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


# ---------------------------------------------------------------------------------------------
# classify


def test_classify_sorts_pods_like_kubectl_drain():
    pods = [
        pod("web-1"),
        pod("plugin", owner=("DaemonSet", "nvidia-device-plugin")),
        pod("static", owner=("Node", "n1"), mirror=True),
        pod("bare", owner=None),
        pod("scratch", volumes=[{"name": "tmp", "emptyDir": {}}]),
        pod("done", owner=None, phase="Succeeded"),
        pod("leaving", deleting=True),
        pod("elsewhere", node="n2"),
    ]
    plan = _drain.classify(pods, ["n1"])
    assert [ref["name"] for ref in plan["evict"]] == ["done", "web-1"]
    assert {ref["name"]: ref["reason"] for ref in plan["skipped"]} == {
        "plugin": "DaemonSet pod", "static": "mirror pod (static pod of the kubelet)"}
    assert [ref["name"] for ref in plan["waiting"]] == ["leaving"]
    refused = {ref["name"]: ref["reason"] for ref in plan["refused"]}
    assert set(refused) == {"bare", "scratch"}
    assert "force" in refused["bare"] and "delete_emptydir_data" in refused["scratch"]


def test_classify_force_and_emptydir_flags():
    pods = [pod("bare", owner=None), pod("scratch", volumes=[{"name": "tmp", "emptyDir": {}}])]
    assert [r["name"] for r in _drain.classify(pods, ["n1"], force=True)["evict"]] == ["bare"]
    plan = _drain.classify(pods, ["n1"], force=True, delete_emptydir_data=True)
    assert [r["name"] for r in plan["evict"]] == ["bare", "scratch"] and plan["refused"] == []


def test_refusal_message_names_pods_and_reasons():
    plan = _drain.classify([pod("bare", owner=None)], ["n1"])
    message = _drain.refusal_message(plan["refused"])
    assert "ml/bare on n1" in message and "no controller" in message and "Nothing was evicted" in message


# ---------------------------------------------------------------------------------------------
# PodDisruptionBudgets


def test_pdb_selector_matching():
    ref = {"namespace": "ml", "labels": {"app": "web", "tier": "front"}}
    assert _drain.matching_pdbs(ref, [pdb("a", {"app": "web"}, 1)]) == ["a"]
    assert _drain.matching_pdbs(ref, [pdb("a", {"app": "db"}, 1)]) == []
    assert _drain.matching_pdbs(ref, [pdb("a", {"app": "web"}, 1, namespace="other")]) == []
    everything = {"metadata": {"name": "all", "namespace": "ml"}, "spec": {"selector": {}}}
    nothing = {"metadata": {"name": "none", "namespace": "ml"}, "spec": {}}
    assert _drain.matching_pdbs(ref, [everything, nothing]) == ["all"]
    expressions = {"metadata": {"name": "expr", "namespace": "ml"}, "spec": {"selector": {"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["front"]}, {"key": "canary", "operator": "DoesNotExist"}]}}}
    assert _drain.matching_pdbs(ref, [expressions]) == ["expr"]
    expressions["spec"]["selector"]["matchExpressions"].append({"key": "app", "operator": "NotIn", "values": ["web"]})
    assert _drain.matching_pdbs(ref, [expressions]) == []


def test_predict_blocks_consumes_disruptions_in_order():
    pods = [pod("web-%d" % n, labels={"app": "web"}) for n in range(3)] + [pod("db-0", labels={"app": "db"})]
    plan = _drain.classify(pods, ["n1"])
    blocked = _drain.predict_blocks(plan["evict"], [pdb("web", {"app": "web"}, 1), pdb("db", {"app": "db"}, 0)])
    assert [(ref["name"], ref["pdb"]) for ref in blocked] == [("db-0", ["db"]), ("web-1", ["web"]), ("web-2", ["web"])]
    assert "allows no more disruptions" in blocked[0]["message"]


def test_predict_blocks_two_budgets_and_pending_pods():
    pods = [pod("web-0", labels={"app": "web"}), pod("web-1", labels={"app": "web"}, phase="Pending")]
    plan = _drain.classify(pods, ["n1"])
    blocked = _drain.predict_blocks(plan["evict"], [pdb("a", {"app": "web"}, 5), pdb("b", {"app": "web"}, 5)])
    assert [ref["name"] for ref in blocked] == ["web-0"]  # the Pending pod is not counted by budgets
    assert _drain.MULTIPLE_PDBS in blocked[0]["message"]


# ---------------------------------------------------------------------------------------------
# Eviction answers and the loops


def test_eviction_body_has_uid_precondition_and_grace():
    body = _drain.eviction_body({"name": "p", "namespace": "ml", "uid": "u1"}, grace_period=30)
    assert body["apiVersion"] == "policy/v1" and body["kind"] == "Eviction"
    assert body["deleteOptions"] == {"gracePeriodSeconds": 30, "preconditions": {"uid": "u1"}}
    assert "deleteOptions" not in _drain.eviction_body({"name": "p", "namespace": "ml"})


@pytest.mark.parametrize(("status", "body", "outcome"), [
    (201, {}, "evicted"),
    (200, {}, "evicted"),
    (404, {"message": "pods \"p\" not found"}, "gone"),
    (409, {"message": "Precondition failed: UID in precondition: u1, UID in object meta: u2"}, "gone"),
    (429, {"message": "Cannot evict pod as it would violate the pod's disruption budget.",
           "details": {"causes": [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]}},
     "retry"),
    (500, {"message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."}, "blocked"),
    (500, {"message": "etcd is down"}, None),
])
def test_eviction_outcome(status, body, outcome):
    assert _drain.eviction_outcome(status, body)[0] == outcome


def test_eviction_outcome_keeps_the_budget_cause():
    body = {"message": "Cannot evict pod", "details": {"causes": [{"message": "The disruption budget web needs 2 healthy pods"}]}}
    assert "The disruption budget web needs 2 healthy pods" in _drain.eviction_outcome(429, body)[1]


def test_run_evictions_retries_429_until_timeout_then_blocked():
    clock = Clock()
    answers = {"a": iter([("retry", "budget"), ("evicted", "")]), "b": iter([("retry", "budget web")] * 100)}
    refs = [{"name": "a", "namespace": "ml", "uid": "1"}, {"name": "b", "namespace": "ml", "uid": "2"}]
    evicted, gone, blocked = _drain.run_evictions(refs, lambda ref: next(answers[ref["name"]]), clock, clock.sleep, deadline=12, retry_interval=5)
    assert [ref["name"] for ref in evicted] == ["a"]
    assert gone == []
    assert [(ref["name"], ref["message"]) for ref in blocked] == [("b", "budget web")]
    assert clock.sleeps == [5, 5] and clock.now == 10


def test_run_evictions_gone_and_permanently_blocked():
    clock = Clock()
    outcomes = {"a": ("gone", ""), "b": ("blocked", "more than one PodDisruptionBudget")}
    refs = [{"name": "a"}, {"name": "b"}]
    evicted, gone, blocked = _drain.run_evictions(refs, lambda ref: outcomes[ref["name"]], clock, clock.sleep, 100, 5)
    assert evicted == [] and [r["name"] for r in gone] == ["a"] and [r["name"] for r in blocked] == ["b"]
    assert clock.sleeps == []


def test_wait_gone_until_deadline():
    clock = Clock()
    present = [{"1", "2"}, {"2"}, {"2"}, {"2"}]
    refs = [{"uid": "1"}, {"uid": "2"}]
    remaining = _drain.wait_gone(refs, lambda: present.pop(0) if present else {"2"}, clock, clock.sleep, deadline=2.5, poll_interval=1)
    assert remaining == [{"uid": "2"}]
    clock = Clock()
    assert _drain.wait_gone(refs, lambda: set(), clock, clock.sleep, 10, 1) == []


def test_cordon_plan_and_patch():
    current = {"a": False, "b": True}
    assert _drain.cordon_plan(["a", "b"], current, "drained") == {"a": True}
    assert _drain.cordon_plan(["a", "b"], current, "cordoned") == {"a": True}
    assert _drain.cordon_plan(["a", "b"], current, "uncordoned") == {"b": False}
    assert _drain.cordon_patch(True) == {"spec": {"unschedulable": True}}
    assert _drain.cordon_patch(False) == {"spec": {"unschedulable": None}}


# ---------------------------------------------------------------------------------------------
# Malformed input: a clear message, nothing touched


def params(**overrides):
    base = {"nodes": ["n1"], "state": "drained", "force": False, "delete_emptydir_data": False, "disable_eviction": False,
            "grace_period": None, "timeout": 30.0, "retry_interval": 5.0, "poll_interval": 1.0, "page_limit": 500,
            "ready_timeout": 0.0, "owner": "", "purpose": ""}
    base.update(overrides)
    return base


@pytest.mark.parametrize(("overrides", "message"), [
    ({"nodes": []}, "option nodes is empty"),
    ({"nodes": [""]}, "nodes[0]=''"),
    ({"nodes": ["a,b"]}, "nodes[0]='a,b' is not a node name"),
    ({"nodes": ["ok", "spec.nodeName=x"]}, "nodes[1]="),
    ({"nodes": ["with space"]}, "is not a node name"),
    ({"state": "drain"}, "option state='drain' must be one of cordoned, drained, uncordoned"),
    ({"timeout": 0}, "option timeout=0 must be a positive number of seconds"),
    ({"timeout": -5.0}, "option timeout=-5.0"),
    ({"retry_interval": 0}, "option retry_interval=0"),
    ({"poll_interval": -1}, "option poll_interval=-1"),
    ({"grace_period": -1}, "option grace_period=-1 must be 0 or more seconds"),
    ({"page_limit": 0}, "option page_limit=0"),
    ({"ready_timeout": -1.0}, "option ready_timeout=-1.0 must be 0 or more seconds"),
])
def test_malformed_options_are_refused_before_any_request(overrides, message):
    cluster = FakeCluster({"n1": False}, [])
    with pytest.raises(GpuhardenError) as error:
        node_maintenance.run(params(**overrides), False, cluster)
    assert message in error.value.msg
    assert cluster.calls == []


# ---------------------------------------------------------------------------------------------
# The module's flow against a fake cluster


class FakeCluster:
    requests = 0

    def __init__(self, unschedulable, pods, pdbs=(), evictions=None, readiness=None, records=None):
        self.state = dict(unschedulable)
        self.records = dict(records or {})  # node -> the cordon annotation's text
        self.changed_before_release = {}  # node -> (unschedulable, annotation) someone sets between the read and the release
        self.pod_list = list(pods)
        self.pdb_list = list(pdbs)
        self.evictions = evictions or {}
        self.readiness = {node: list(answers) for node, answers in (readiness or {}).items()}  # successive answers, the last repeats
        self.calls = []

    def not_ready(self, node):
        self.calls.append(("ready?", node))
        answers = self.readiness.get(node) or [[]]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def _node(self, node):
        annotations = {_drain.CORDON_ANNOTATION: self.records[node]} if node in self.records else {}
        return {"metadata": {"name": node, "annotations": annotations}, "spec": {"unschedulable": self.state[node]}}

    def cordon_state(self, node):
        self.calls.append(("get", node))
        return _drain.cordon_state(self._node(node))

    def set_unschedulable(self, node, value, record=False):
        self.calls.append(("patch", node, value))
        self.state[node] = value
        if record is None:
            self.records.pop(node, None)
        elif record is not False:
            self.records[node] = _drain.record_value(record)

    def set_record(self, node, record):
        self.calls.append(("record", node))
        self.records[node] = _drain.record_value(record)

    def release(self, node, value):
        self.calls.append(("release", node))
        if node in self.changed_before_release:
            self.state[node], self.records[node] = self.changed_before_release.pop(node)
        if self.records.get(node) != value or not self.state[node]:
            return False  # the JSON patch's test op fails: 422
        self.state[node] = False
        del self.records[node]
        return True

    def pods(self, nodes):
        self.calls.append(("list", "pods"))
        return list(self.pod_list)

    def pdbs(self):
        self.calls.append(("list", "pdbs"))
        return self.pdb_list

    def evict(self, ref, grace_period):
        self.calls.append(("evict", ref["name"]))
        outcome = self.evictions.get(ref["name"], ("evicted", ""))
        if outcome[0] == "evicted":
            self.pod_list = [p for p in self.pod_list if p["metadata"]["uid"] != ref["uid"]]
        return outcome

    def delete(self, ref, grace_period):
        self.calls.append(("delete", ref["name"]))
        return "evicted", ""


def _writes(cluster):
    return [call for call in cluster.calls if call[0] in ("patch", "evict", "delete", "record", "release")]


def test_check_mode_reports_and_changes_nothing():
    pods = [pod("web-0", labels={"app": "web"}), pod("web-1", labels={"app": "web"}), pod("ds", owner=("DaemonSet", "x"))]
    cluster = FakeCluster({"n1": False}, pods, [pdb("web", {"app": "web"}, 1)])
    result = node_maintenance.run(params(), True, cluster)
    assert result["changed"] is True
    assert [p["name"] for p in result["evicted"]] == ["web-0", "web-1"]
    assert [p["name"] for p in result["would_block"]] == ["web-1"]
    assert [p["name"] for p in result["skipped_pods"]] == ["ds"]
    assert not {"skipped", "failed"} & set(result)  # keys Ansible reads as the task's own status
    assert {key: value for key, value in result["nodes"]["n1"].items() if key != "cordon_record_after"} == {
        "unschedulable_before": False, "unschedulable_after": True, "cordon_record_before": None, "preexisting_cordon": False}
    assert result["nodes"]["n1"]["cordon_record_after"]["owner"] == "node_maintenance@" + socket.gethostname()
    assert _writes(cluster) == []


def test_drain_evicts_waits_and_reapply_is_unchanged():
    clock = Clock()
    cluster = FakeCluster({"n1": False}, [pod("web-0"), pod("ds", owner=("DaemonSet", "x"))])
    result = node_maintenance.run(params(), False, cluster, clock, clock.sleep)
    assert result["changed"] is True and [p["name"] for p in result["evicted"]] == ["web-0"]
    assert result["blocked"] == [] and result["not_gone"] == []
    assert _writes(cluster) == [("patch", "n1", True), ("evict", "web-0")]
    cluster.calls = []
    again = node_maintenance.run(params(), False, cluster, clock, clock.sleep)
    assert again["changed"] is False and again["evicted"] == [] and _writes(cluster) == []


def test_blocked_eviction_fails_reported_not_forced():
    clock = Clock()
    cluster = FakeCluster({"n1": False}, [pod("web-0")], evictions={"web-0": ("retry", "The disruption budget web needs 1 healthy pods")})
    with pytest.raises(GpuhardenError) as error:
        node_maintenance.run(params(force=True, timeout=12), False, cluster, clock, clock.sleep)
    assert "blocked by PodDisruptionBudgets" in error.value.msg and "not forced" in error.value.msg
    assert "ml/web-0: The disruption budget web needs 1 healthy pods" in error.value.msg
    assert [p["name"] for p in error.value.result["blocked"]] == ["web-0"]
    assert error.value.result["changed"] is True
    assert not any(call[0] == "delete" for call in cluster.calls)
    assert cluster.state["n1"] is True  # stays cordoned


def test_refused_pods_fail_before_the_cordon():
    cluster = FakeCluster({"n1": False}, [pod("bare", owner=None)])
    with pytest.raises(GpuhardenError) as error:
        node_maintenance.run(params(), False, cluster)
    assert "cannot drain" in error.value.msg and error.value.result["changed"] is False
    assert _writes(cluster) == []


def test_disable_eviction_deletes():
    clock = Clock()
    cluster = FakeCluster({"n1": True}, [pod("web-0")])
    cluster.delete = lambda ref, grace: (cluster.calls.append(("delete", ref["name"])), cluster.pod_list.clear(), ("evicted", ""))[2]
    result = node_maintenance.run(params(disable_eviction=True), False, cluster, clock, clock.sleep)
    assert ("delete", "web-0") in cluster.calls and not any(call[0] == "evict" for call in cluster.calls)
    assert result["changed"] is True


def test_cordon_and_uncordon_only_touch_the_flag():
    cluster = FakeCluster({"n1": False, "n2": True}, [pod("web-0")])
    result = node_maintenance.run(params(nodes=["n1", "n2"], state="cordoned"), False, cluster)
    assert result["changed"] is True and _writes(cluster) == [("patch", "n1", True)]
    cluster.calls = []
    result = node_maintenance.run(params(nodes=["n1", "n2"], state="uncordoned"), False, cluster)
    assert _writes(cluster) == [("patch", "n1", False), ("patch", "n2", False)]
    assert not any(call == ("list", "pods") for call in cluster.calls)
    cluster.calls = []
    assert node_maintenance.run(params(nodes=["n1", "n2"], state="uncordoned"), False, cluster)["changed"] is False


UNKNOWN = ["NotReady (NodeStatusUnknown)"]


def test_uncordon_waits_until_the_node_is_ready():
    """The race it closes: healthz answered after the restart, the node controller still shows the Node Unknown, and
    the next batch's budget counted the node as unavailable."""
    clock = Clock()
    cluster = FakeCluster({"n1": True}, [], readiness={"n1": [UNKNOWN, UNKNOWN, []]})
    result = node_maintenance.run(params(state="uncordoned", ready_timeout=30.0), False, cluster, clock, clock.sleep)
    assert result["changed"] is True and result["not_ready"] == []
    assert cluster.calls == [("get", "n1"), ("ready?", "n1"), ("ready?", "n1"), ("ready?", "n1"), ("patch", "n1", False)]
    assert clock.sleeps == [1.0, 1.0]


def test_a_node_not_ready_at_the_timeout_stays_cordoned_and_fails_the_task_the_ready_one_is_uncordoned():
    clock = Clock()
    cluster = FakeCluster({"n1": True, "n2": True}, [], readiness={"n1": [UNKNOWN], "n2": [UNKNOWN, []]})
    with pytest.raises(GpuhardenError) as error:
        node_maintenance.run(params(nodes=["n1", "n2"], state="uncordoned", ready_timeout=5.0), False, cluster, clock, clock.sleep)
    assert error.value.msg == "node_maintenance: n1 not Ready after 5s, left cordoned: n1: NotReady (NodeStatusUnknown)"
    assert error.value.result["not_ready"] == [{"node": "n1", "reasons": UNKNOWN}]
    assert error.value.result["nodes"]["n1"]["unschedulable_after"] is True
    assert error.value.result["changed"] is True
    assert _writes(cluster) == [("patch", "n2", False)]
    assert cluster.calls.count(("ready?", "n2")) == 2  # found Ready once, not asked again
    assert clock.now <= 5.0


def test_without_ready_timeout_and_in_check_mode_uncordon_does_not_wait():
    cluster = FakeCluster({"n1": True}, [], readiness={"n1": [UNKNOWN]})
    assert node_maintenance.run(params(state="uncordoned"), False, cluster)["changed"] is True
    assert ("ready?", "n1") not in cluster.calls and _writes(cluster) == [("patch", "n1", False)]
    cluster = FakeCluster({"n1": True}, [], readiness={"n1": [UNKNOWN]})
    result = node_maintenance.run(params(state="uncordoned", ready_timeout=30.0), True, cluster)
    assert result["changed"] is True and cluster.calls == [("get", "n1")]
    cluster = FakeCluster({"n1": False}, [], readiness={"n1": [UNKNOWN]})  # already schedulable: nothing to wait for
    assert node_maintenance.run(params(state="uncordoned", ready_timeout=30.0), False, cluster)["changed"] is False
    assert cluster.calls == [("get", "n1")]


@pytest.mark.parametrize(("conditions", "reasons"), [
    ([{"type": "Ready", "status": "True"}], []),
    ([{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}], UNKNOWN),
    ([{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}], ["NotReady (KubeletNotReady)"]),
    ([{"type": "MemoryPressure", "status": "False"}], ["no Ready condition"]),
])
def test_the_module_reads_readiness_as_the_disruption_budget_does_a_cordon_aside(monkeypatch, conditions, reasons):
    cluster = node_maintenance.Cluster.__new__(node_maintenance.Cluster)
    node = {"spec": {"unschedulable": True}, "status": {"conditions": conditions}}
    monkeypatch.setattr(cluster, "node", lambda name: node, raising=False)
    assert cluster.not_ready("n1") == reasons
    assert cluster.cordon_state("n1") == {"unschedulable": True, "record": None, "value": None}


def test_diff_shows_flag_and_evictions():
    cluster = FakeCluster({"n1": False}, [pod("web-0")])
    result = node_maintenance.run(params(owner="harden@1", purpose="kubelet_topology"), True, cluster)
    diff = node_maintenance.diff(result)
    assert diff["before"] == {"n1": {"unschedulable": False, "cordon_record": None}}
    record = result["nodes"]["n1"]["cordon_record_after"]
    assert record["owner"] == "harden@1" and record["for"] == "kubelet_topology"
    assert diff["after"] == {"n1": {"unschedulable": True, "cordon_record": record, "evicted": ["ml/web-0"]}}


# ---------------------------------------------------------------------------------------------
# The device plugin's restart after a MIG layout change

PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.18.2"


def with_containers(item, *containers):
    item["spec"]["containers"] = [dict(container) for container in containers]
    return item


def plugin_pods():
    plugin = {"name": "nvidia-device-plugin-ctr", "image": PLUGIN_IMAGE}
    return [
        with_containers(pod("ours", namespace="kube-system", owner=("DaemonSet", "nvidia-device-plugin-daemonset")), plugin),
        # the Helm chart's plugin with its config-manager sidecar, and its MPS control daemon (the same image)
        with_containers(pod("helm", namespace="nvdp", owner=("DaemonSet", "nvdp-nvidia-device-plugin")),
                        {"name": "config-manager", "image": PLUGIN_IMAGE, "command": ["config-manager"]},
                        {"name": "nvidia-device-plugin-ctr", "image": PLUGIN_IMAGE, "command": ["nvidia-device-plugin"]}),
        with_containers(pod("mps", namespace="nvdp", owner=("DaemonSet", "nvdp-mps-control-daemon")),
                        {"name": "mps-control-daemon-ctr", "image": PLUGIN_IMAGE, "command": ["mps-control-daemon"]}),
        with_containers(pod("gfd", namespace="kube-system", owner=("DaemonSet", "gpu-feature-discovery")),
                        {"name": "gpu-feature-discovery", "image": PLUGIN_IMAGE, "command": ["gpu-feature-discovery"]}),
        with_containers(pod("static", namespace="kube-system", owner=("Node", "n1"), mirror=True), plugin),
        with_containers(pod("bare", namespace="kube-system", owner=None), plugin),
        with_containers(pod("old", namespace="kube-system", owner=("DaemonSet", "nvidia-device-plugin-daemonset"), deleting=True), plugin),
        with_containers(pod("elsewhere", node="n2", namespace="kube-system", owner=("DaemonSet", "nvidia-device-plugin-daemonset")), plugin),
        with_containers(pod("train"), {"name": "train", "image": "nvcr.io/nvidia/pytorch:24.01"}),
    ]


def test_plugin_restart_plan_picks_every_installers_plugin_pod_of_the_node_only():
    plan = _drain.plugin_restart_plan(plugin_pods(), ["n1"])
    assert sorted(ref["name"] for ref in plan["evict"]) == ["helm", "ours"]
    assert {ref["name"]: ref["reason"].split(":")[0] for ref in plan["skipped"]} == {
        "static": "static device plugin pod", "bare": "device plugin pod without a DaemonSet to start it again"}
    assert [ref["name"] for ref in plan["waiting"]] == ["old"]
    assert _drain.cordon_plan(["n1"], {"n1": True}, _drain.RESTART_PLUGIN) == {}


def test_plugin_restart_evicts_the_plugin_pods_waits_and_leaves_the_cordon():
    clock = Clock()
    cluster = FakeCluster({"n1": True}, [p for p in plugin_pods() if p["metadata"]["name"] != "old"])
    checked = node_maintenance.run(params(state=_drain.RESTART_PLUGIN), True, cluster)
    assert checked["changed"] is True and sorted(p["name"] for p in checked["evicted"]) == ["helm", "ours"]
    assert _writes(cluster) == [] and checked["would_block"] == []  # no budget covers the plugin pods
    cluster.calls = []
    result = node_maintenance.run(params(state=_drain.RESTART_PLUGIN), False, cluster, clock, clock.sleep)
    assert result["changed"] is True and sorted(p["name"] for p in result["evicted"]) == ["helm", "ours"]
    assert sorted(_writes(cluster)) == [("evict", "helm"), ("evict", "ours")]  # no patch: the node stays cordoned
    assert cluster.state["n1"] is True
    assert sorted(p["name"] for p in result["skipped_pods"]) == ["bare", "static"] and result["not_gone"] == []


def test_plugin_restart_waits_for_a_terminating_plugin_pod_and_a_timeout_says_so_without_calling_it_a_drain():
    clock = Clock()
    stuck = [p for p in plugin_pods() if p["metadata"]["name"] == "old"]
    cluster = FakeCluster({"n1": False}, stuck)
    with pytest.raises(GpuhardenError) as error:
        node_maintenance.run(params(state=_drain.RESTART_PLUGIN, timeout=3), False, cluster, clock, clock.sleep)
    assert "restart of the device plugin on n1 incomplete" in error.value.msg and "kube-system/old" in error.value.msg
    assert "cordoned" not in error.value.msg and _writes(cluster) == []


# ---------------------------------------------------------------------------------------------
# 403 messages and module-level errors


def test_forbidden_message_names_identity_verb_resource():
    message = ('nodes "gpu-1" is forbidden: User "system:serviceaccount:gpuharden-system:gpuharden" cannot delete resource '
               '"nodes" in API group "" at the cluster scope')
    target = _k8s_access.Target("delete", "nodes", name="gpu-1")
    text = _k8s_access.forbidden_message("node_maintenance", target, message)
    assert text.startswith("node_maintenance: forbidden: system:serviceaccount:gpuharden-system:gpuharden may not delete nodes 'gpu-1'")
    assert "at cluster scope" in text and "deploy/rbac/gpuharden-rbac.yaml" in text and "verb 'delete' on resource 'nodes'" in text
    target = _k8s_access.Target("create", "pods/eviction", namespace="ml", name="p")
    assert "in namespace ml" in _k8s_access.forbidden_message("m", target, "no user here")
    assert "the identity in use" in _k8s_access.forbidden_message("m", target, "no user here")


def test_failure_turns_a_403_into_the_message():
    from kubernetes.client.rest import ApiException

    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "message": 'secrets is forbidden: User "alice" cannot list resource "secrets" in API group "" '
                                                          'in the namespace "kube-system"'})
    converted = _k8s_access.failure("gpu_consistency", _k8s_access.Target("list", "secrets", namespace="kube-system"), error)
    assert "forbidden: alice may not list secrets" in converted.msg
    assert converted.result["forbidden"]["identity"] == "alice" and converted.result["status"] == 403
    other = _k8s_access.failure("m", _k8s_access.Target("get", "nodes"), ApiException(status=500, reason="Internal"))
    assert "500" in other.msg


def test_module_without_reachable_kubeconfig_is_a_clear_error(world_tmp):
    result = run_module("node_maintenance", {"nodes": ["n1"], "kubeconfig": str(world_tmp / "missing")}, {})
    assert result["failed"] is True
    assert "no such file on the controller" in result["msg"]


def test_module_rejects_unknown_state():
    result = run_module("node_maintenance", {"nodes": ["n1"], "state": "drain"}, {})
    assert result["failed"] is True and "state" in result["msg"]


# ---------------------------------------------------------------------------------------------
# The cordon record (issue 43, item 8): every cordon names its run; a cordon another run left is resumed or released


def record(owner, purpose="kubelet_topology", at="2026-07-01T12:00:03Z"):
    return _drain.record_value({"owner": owner, "at": at, "for": purpose})


def test_cordon_record_reading():
    assert _drain.cordon_record({"metadata": {}}) is None
    node = {"metadata": {"annotations": {_drain.CORDON_ANNOTATION: record("harden@a")}}, "spec": {"unschedulable": True}}
    assert _drain.cordon_record(node) == {"owner": "harden@a", "at": "2026-07-01T12:00:03Z", "for": "kubelet_topology"}
    garbage = {"metadata": {"annotations": {_drain.CORDON_ANNOTATION: "by hand"}}}
    assert _drain.cordon_record(garbage) == {"owner": None, "unreadable": "by hand"}
    assert _drain.describe_record(_drain.cordon_record(node)) == "harden@a at 2026-07-01T12:00:03Z (for kubelet_topology)"
    state = _drain.cordon_state(node)
    assert _drain.left_cordon(state, "harden@b") == _drain.cordon_record(node)
    assert _drain.left_cordon(state, "harden@a") is None  # this run's own
    assert _drain.left_cordon(dict(state, unschedulable=False), "harden@b") is None  # uncordoned since: nothing left
    assert _drain.left_cordon(_drain.cordon_state(garbage) | {"unschedulable": True}, "harden@b")["owner"] is None
    assert _drain.cordon_patch(True, {"owner": "o", "at": "t", "for": None}) == {
        "spec": {"unschedulable": True}, "metadata": {"annotations": {_drain.CORDON_ANNOTATION: '{"at":"t","for":null,"owner":"o"}'}}}
    assert _drain.cordon_patch(False, None) == {"spec": {"unschedulable": None}, "metadata": {"annotations": {_drain.CORDON_ANNOTATION: None}}}


def test_a_cordon_records_its_run_and_the_uncordon_removes_the_record():
    cluster = FakeCluster({"n1": False, "n2": True}, [])
    result = node_maintenance.run(params(nodes=["n1", "n2"], state="cordoned", owner="harden@1", purpose="mig"), False, cluster)
    assert json.loads(cluster.records["n1"])["owner"] == "harden@1" and json.loads(cluster.records["n1"])["for"] == "mig"
    assert "n2" not in cluster.records  # someone else's cordon gets no record of ours
    assert result["nodes"]["n2"]["preexisting_cordon"] is True and result["nodes"]["n1"]["preexisting_cordon"] is False
    node_maintenance.run(params(nodes=["n1"], state="uncordoned", owner="harden@1"), False, cluster)
    assert cluster.records == {} and cluster.state["n1"] is False


def test_a_cordon_another_run_left_is_taken_on_not_counted_as_someone_elses():
    """The resume: the next harden drains the node again; the cordon is gpuharden's, so its uncordon ends it."""
    clock = Clock()
    cluster = FakeCluster({"n1": True}, [pod("web-0")], records={"n1": record("harden@interrupted")})
    result = node_maintenance.run(params(owner="harden@next"), False, cluster, clock, clock.sleep)
    assert result["changed"] is True and result["nodes"]["n1"]["preexisting_cordon"] is False
    assert result["nodes"]["n1"]["cordon_record_before"]["owner"] == "harden@interrupted"
    assert json.loads(cluster.records["n1"])["owner"] == "harden@next" == result["nodes"]["n1"]["cordon_record_after"]["owner"]
    assert _writes(cluster) == [("record", "n1"), ("evict", "web-0")]
    cluster.calls = []
    assert node_maintenance.run(params(owner="harden@next"), False, cluster, clock, clock.sleep)["changed"] is False


def test_release_uncordons_only_cordons_other_gpuharden_runs_left_once_ready():
    clock = Clock()
    cluster = FakeCluster({"left": True, "mine": True, "admin": True, "open": False},
                          [], records={"left": record("harden@gone"), "mine": record("harden@now")},
                          readiness={"left": [UNKNOWN, []]})
    checked = node_maintenance.run(params(nodes=["left", "mine", "admin", "open"], state="released", owner="harden@now",
                                          ready_timeout=30.0), True, cluster, clock, clock.sleep)
    assert checked["changed"] is True and checked["released"] == ["left"] and _writes(cluster) == []
    result = node_maintenance.run(params(nodes=["left", "mine", "admin", "open"], state="released", owner="harden@now",
                                         ready_timeout=30.0), False, cluster, clock, clock.sleep)
    assert result["changed"] is True and result["released"] == ["left"]
    assert {entry["node"]: entry["reason"] for entry in result["left_alone"]} == {
        "admin": "cordoned by someone else (no gpuharden record): left as it is",
        "mine": "cordoned by this run (harden@now): its own uncordon ends it", "open": "not cordoned"}
    assert cluster.state == {"left": False, "mine": True, "admin": True, "open": False} and "left" not in cluster.records
    assert cluster.calls.count(("ready?", "left")) == 2 and ("ready?", "admin") not in cluster.calls
    assert result["nodes"]["left"]["cordon_record_after"] is None and result["nodes"]["left"]["unschedulable_after"] is False


def test_release_leaves_a_cordon_made_since_it_was_read_and_a_node_not_ready():
    clock = Clock()
    cluster = FakeCluster({"raced": True, "down": True}, [], records={"raced": record("harden@gone"), "down": record("harden@gone")},
                          readiness={"down": [UNKNOWN]})
    cluster.changed_before_release["raced"] = (True, record("harden@other-controller"))
    with pytest.raises(GpuhardenError) as error:
        node_maintenance.run(params(nodes=["raced", "down"], state="released", owner="harden@now", ready_timeout=4.0),
                             False, cluster, clock, clock.sleep)
    result = error.value.result
    assert "down not Ready after 4s, left cordoned" in error.value.msg and result["changed"] is False
    assert result["released"] == [] and cluster.state == {"raced": True, "down": True}
    [raced] = result["left_alone"]
    assert raced["node"] == "raced" and "changed since it was read" in raced["reason"] and "harden@other-controller" in raced["reason"]
    assert ("release", "down") not in cluster.calls


def test_release_patch_tests_the_record_and_the_flag_before_it_removes_them():
    ops = _drain.release_patch("v")
    assert ops == [{"op": "test", "path": "/metadata/annotations/gpuharden.io~1cordon", "value": "v"},
                   {"op": "remove", "path": "/metadata/annotations/gpuharden.io~1cordon"},
                   {"op": "test", "path": "/spec/unschedulable", "value": True},
                   {"op": "remove", "path": "/spec/unschedulable"}]
