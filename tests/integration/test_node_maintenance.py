# SPDX-License-Identifier: GPL-3.0-or-later
"""node_maintenance on the healthy lab: the real apiserver, the ReplicaSet/DaemonSet/disruption controllers of the
real kube-controller-manager, and real pods that the nodes' real kubelet runs through the real containerd (the image
is the sandbox image each node holds; no registry is reachable), so an eviction ends when the kubelet has stopped the
pod.

gpu-l4-0 runs two ReplicaSet pods under a PodDisruptionBudget minAvailable=2 and a DaemonSet pod.  Check mode
predicts the blocks and changes no resourceVersion; the drain is blocked (429 retried until the timeout),
reported, not forced - even with force; once the budget allows it the drain evicts both, skips the DaemonSet
pod, and a second run is unchanged.  The role wraps a change in cordon_drain/uncordon with serial batches and
keeps a cordon that was there before.  A bare pod is refused before anything changes.  With ready_timeout, uncordon
leaves a node cordoned whose Ready condition is not True, and uncordons it once its real kubelet has posted Ready.
"""

from __future__ import annotations

import pytest
from gpuharden_lab import manager, realnode
from kubernetes import client

from tests.integration import cluster_side as cs
from tests.labfixtures import shared_lab

# real_nodes: the healthy lab's nodes run the real kubelet and containerd (they need real-components; `make real-nodes` runs only these).
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

NODE = "gpu-l4-0"
BARE_NODE = "gpu-h100-0"
NS = "drain-test"
MODULE = "gpuharden.k8s.node_maintenance"
# the role's task files run the module through this action (it reads the role's node_maintenance_* variables)
ROLE_STEP = "gpuharden.k8s.node_maintenance_step"


def _template(labels, node, image):
    return {"metadata": {"labels": labels}, "spec": {
        # Not a blanket toleration: one of node.kubernetes.io/unschedulable would let the replacements onto the cordoned node.
        "nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [{"name": "main", "image": image}]}}


def _web_pods(core):
    return [p for p in core.list_namespaced_pod(NS, label_selector="app=web").items if p.spec.node_name == NODE]


def _ready(pod):
    return pod.status.phase == "Running" and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@pytest.fixture(scope="module")
def lab():
    with shared_lab("healthy") as state:
        config = manager.ssh(state["nodes"][NODE]["address"], "cat /etc/containerd/config.toml").stdout
        image = realnode.sandbox_image_name(config)
        api = cs.admin(state)
        core, apps, policy = client.CoreV1Api(api), client.AppsV1Api(api), client.PolicyV1Api(api)
        cs.ensure_namespace(core, NS)
        apps.create_namespaced_replica_set(NS, {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web"},
                                                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                                                         "template": _template({"app": "web"}, NODE, image)}})
        apps.create_namespaced_daemon_set(NS, {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
                                               "spec": {"selector": {"matchLabels": {"app": "agent"}},
                                                        "template": _template({"app": "agent"}, NODE, image)}})
        policy.create_namespaced_pod_disruption_budget(NS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                                            "metadata": {"name": "web-pdb"},
                                                            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})
        cs.wait_for(lambda: len([p for p in _web_pods(core) if _ready(p)]) == 2, 90, what="2 ready web pods on %s" % NODE)
        cs.wait_for(lambda: [p for p in core.list_namespaced_pod(NS, label_selector="app=agent").items if _ready(p)], 90, what="DaemonSet pod")
        cs.wait_for(lambda: (policy.read_namespaced_pod_disruption_budget("web-pdb", NS).status.current_healthy or 0) == 2, 90,
                    what="budget status")
        yield dict(state, _api=api)
        try:
            cs.put_back(core, NS, [NODE, BARE_NODE])
        finally:
            api.close()


def _drain(lab, check=False, **options):
    args = dict(nodes=[options.pop("node", NODE)], kubeconfig=lab["cluster"]["admin_kubeconfig"], **options)
    found, _stats, seconds = cs.run(lab, module=MODULE, args=cs.module_args(**args), check=check)
    [result] = found
    return result, seconds


def _versions(core):
    """The node's spec (its resourceVersion moves with the kubelet's status updates) and the pods' resourceVersions."""
    node = core.read_node(NODE)
    return node.spec.to_dict(), {p.metadata.uid: p.metadata.resource_version for p in core.list_namespaced_pod(NS).items}


def test_check_mode_predicts_and_changes_nothing(lab):
    core = client.CoreV1Api(lab["_api"])
    before = _versions(core)
    result, _s = _drain(lab, check=True)
    assert result["_event"] == "runner_on_ok", result.get("msg")
    assert result["changed"] is True
    assert sorted(p["name"] for p in result["evicted"]) == sorted(p.metadata.name for p in _web_pods(core))
    assert len(result["would_block"]) == 2 and {tuple(p["pdb"]) for p in result["would_block"]} == {("web-pdb",)}
    assert [p["reason"] for p in result["skipped_pods"] if p["namespace"] == NS] == ["DaemonSet pod"]  # the plugin's too
    entry = result["nodes"][NODE]
    assert (entry["unschedulable_before"], entry["unschedulable_after"], entry["preexisting_cordon"]) == (False, True, False)
    assert entry["cordon_record_before"] is None and entry["cordon_record_after"]["owner"].startswith("node_maintenance@")
    assert _versions(core) == before


def test_blocked_eviction_is_reported_not_forced(lab):
    core = client.CoreV1Api(lab["_api"])
    uids = sorted(p.metadata.uid for p in _web_pods(core))
    result, seconds = _drain(lab, force=True, timeout=6, retry_interval=2)
    assert result["_event"] == "runner_on_failed"
    assert "blocked by PodDisruptionBudgets" in result["msg"] and "not forced" in result["msg"]
    assert "web-pdb" in result["msg"]  # the API server's cause names the budget
    assert sorted(p["uid"] for p in result["blocked"]) == uids and result["evicted"] == []
    assert result["changed"] is True and seconds >= 4  # retried every 2s until another retry would pass the 6s timeout
    assert sorted(p.metadata.uid for p in _web_pods(core)) == uids  # still there: nothing was deleted
    assert core.read_node(NODE).spec.unschedulable is True  # stays cordoned


def test_drain_once_allowed_then_idempotent(lab):
    core, policy = client.CoreV1Api(lab["_api"]), client.PolicyV1Api(lab["_api"])
    policy.patch_namespaced_pod_disruption_budget("web-pdb", NS, {"spec": {"minAvailable": 0}})
    cs.wait_for(lambda: (policy.read_namespaced_pod_disruption_budget("web-pdb", NS).status.disruptions_allowed or 0) == 2, 60,
                what="budget allows 2")
    web = sorted(p.metadata.uid for p in _web_pods(core))
    result, seconds = _drain(lab, timeout=60, retry_interval=2)
    assert result["_event"] == "runner_on_ok", result.get("msg")
    assert result["changed"] is True
    assert sorted(p["uid"] for p in result["evicted"]) == web and result["blocked"] == [] and result["not_gone"] == []
    assert [p["reason"] for p in result["skipped_pods"] if p["namespace"] == NS] == ["DaemonSet pod"]  # the plugin's too
    assert _web_pods(core) == []  # the replacements stay Pending: the node is cordoned
    assert [p.spec.node_name for p in core.list_namespaced_pod(NS, label_selector="app=agent").items] == [NODE]
    before = _versions(core)
    again, _s = _drain(lab, timeout=60)
    assert again["_event"] == "runner_on_ok" and again["changed"] is False and again["evicted"] == []
    assert _versions(core)[0] == before[0]
    print("\nnode_maintenance drain of %s: %.1fs" % (NODE, seconds))


def test_role_wraps_a_change_and_uncordons(lab):
    core = client.CoreV1Api(lab["_api"])
    core.patch_node(NODE, {"spec": {"unschedulable": None}})  # the previous test left it drained
    cs.wait_for(lambda: len([p for p in _web_pods(core) if _ready(p)]) == 2, 90, what="web pods back on %s" % NODE)
    found, _stats, _s = cs.run(lab, playbook="node_maintenance.yml")
    assert cs.failures(found) == []
    modules = [r for r in found if r["_action"] == ROLE_STEP and "nodes" in r]  # the drain and the uncordon (not the budget's verdict)
    assert [r["nodes"][NODE]["unschedulable_after"] for r in modules] == [True, False]
    assert modules[1]["changed"] is True
    assert core.read_node(NODE).spec.unschedulable in (None, False)
    out = manager.ssh(lab["nodes"][NODE]["address"], "cat /var/log/gpuharden-test-maintenance.log").stdout
    assert "change ran while %s was drained" % NODE in out
    cs.wait_for(lambda: len([p for p in _web_pods(core) if _ready(p)]) == 2, 90, what="web pods back on %s" % NODE)


def test_role_keeps_a_cordon_that_was_there_before(lab):
    core = client.CoreV1Api(lab["_api"])
    client.PolicyV1Api(lab["_api"]).patch_namespaced_pod_disruption_budget("web-pdb", NS, {"spec": {"minAvailable": 0}})
    core.patch_node(NODE, {"spec": {"unschedulable": True}})
    found, _stats, _s = cs.run(lab, playbook="node_maintenance.yml")
    assert cs.failures(found) == []
    [uncordon] = [r for r in found if r["_task"] == "Uncordon | make the node schedulable again"]
    assert uncordon["_event"] == "runner_on_skipped"
    assert core.read_node(NODE).spec.unschedulable is True
    core.patch_node(NODE, {"spec": {"unschedulable": None}})


def test_bare_pod_is_refused_before_anything_changes(lab):
    core = client.CoreV1Api(lab["_api"])
    core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"},
                                    "spec": {"nodeName": BARE_NODE, "tolerations": [{"operator": "Exists"}],
                                             "containers": [{"name": "main", "image": "registry.example/app:1"}]}})
    result, _s = _drain(lab, node=BARE_NODE, timeout=30)
    assert result["_event"] == "runner_on_failed"
    assert "%s/bare on %s: no controller" % (NS, BARE_NODE) in result["msg"] and "force: true" in result["msg"]
    assert result["changed"] is False and [p["name"] for p in result["refused"]] == ["bare"]
    assert core.read_node(BARE_NODE).spec.unschedulable in (None, False)
    assert core.read_namespaced_pod("bare", NS).metadata.deletion_timestamp is None


def _ready_condition(core, node):
    return next(c for c in core.read_node(node).status.conditions if c.type == "Ready")


def test_uncordon_waits_for_the_real_kubelet_to_post_ready(lab):
    """The node controller's view after a kubelet restart (Ready Unknown), written by hand while the kubelet is
    stopped: uncordon leaves the node cordoned and fails; once the kubelet is started its first status post makes the
    node Ready, and uncordon then goes through."""
    core = client.CoreV1Api(lab["_api"])
    address = lab["nodes"][BARE_NODE]["address"]
    core.patch_node(BARE_NODE, {"spec": {"unschedulable": True}})
    manager.ssh(address, "systemctl stop kubelet")
    try:
        ready = _ready_condition(core, BARE_NODE)
        core.patch_node_status(BARE_NODE, {"status": {"conditions": [{
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "set by the test",
            "lastHeartbeatTime": ready.last_heartbeat_time.isoformat(), "lastTransitionTime": ready.last_transition_time.isoformat()}]}})
        result, seconds = _drain(lab, node=BARE_NODE, state="uncordoned", ready_timeout=3, poll_interval=1)
        assert result["_event"] == "runner_on_failed"
        assert result["msg"] == "node_maintenance: %s not Ready after 3s, left cordoned: %s: NotReady (NodeStatusUnknown)" % (
            BARE_NODE, BARE_NODE)
        assert result["not_ready"] == [{"node": BARE_NODE, "reasons": ["NotReady (NodeStatusUnknown)"]}]
        assert result["changed"] is False and seconds >= 2
        assert core.read_node(BARE_NODE).spec.unschedulable is True
    finally:
        manager.ssh(address, "systemctl start kubelet")
    result, seconds = _drain(lab, node=BARE_NODE, state="uncordoned", ready_timeout=90, poll_interval=0.5)
    assert result["_event"] == "runner_on_ok", result.get("msg")
    assert result["changed"] is True and result["not_ready"] == []
    assert _ready_condition(core, BARE_NODE).status == "True"
    assert core.read_node(BARE_NODE).spec.unschedulable in (None, False)
    print("\nuncordon of %s waited %.1fs for the started kubelet's Ready" % (BARE_NODE, seconds))
