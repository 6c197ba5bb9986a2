# SPDX-License-Identifier: GPL-3.0-or-later
"""topology_check: GPU layouts from the NVML double's fixtures (through gpu_facts) and pure data; workload
extraction from API objects (gpu_workloads_info's logic); the malformed inputs."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _gpu_workloads, _topology
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _gpu_facts as gpu_facts
from ansible_collections.gpuharden.k8s.plugins.modules import gpu_workloads_info

from tests.unit.conftest import run_module

DGX = [{"index": i, "numa_node": 0 if i < 4 else 1} for i in range(8)]


def _workload(name, *gpus, kind="Deployment", namespace="ml", **extra):
    return dict({"kind": kind, "namespace": namespace, "name": name,
                 "containers": [{"name": "c%d" % i, "gpus": count} for i, count in enumerate(gpus)]}, **extra)


def _ids(result):
    return sorted((entry["id"], entry["severity"]) for entry in result["findings"])


def _blocked(result):
    return [entry["workload"]["name"] for entry in result["findings"] if entry["id"] == "workload_cannot_fit_numa"]


def test_eight_gpu_workload_cannot_fit_a_4_plus_4_dgx_from_the_fixture(make_node):
    node = make_node("dgx-a100-80gb")
    gpus = gpu_facts.gather(str(node.root))["gpus"]
    result = _topology.evaluate("dgx-1", gpus, "single-numa-node", cpu_policy="static",
                                workloads=[_workload("train-8g", 8), _workload("train-4g", 4), _workload("infer", 1)])
    assert _ids(result) == [("workload_cannot_fit_numa", "error")]
    entry = result["findings"][0]
    assert entry["node"] == "dgx-1"
    assert entry["workload"] == {"kind": "Deployment", "namespace": "ml", "name": "train-8g"}
    assert entry["found"]["gpus"] == {"c0": 8}
    assert entry["expected"]["max_gpus_per_container"] == 4
    assert entry["expected"]["numa_nodes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    assert entry["fitting_policy"] == {"topologyManagerPolicy": "restricted"}
    assert "TopologyAffinityError" in entry["hint"] and "Deployment ml/train-8g" in entry["hint"]
    assert result["workloads_blocked"] == ["Deployment ml/train-8g"]
    assert set(result["workloads_landing"]) == {"Deployment ml/train-8g", "Deployment ml/train-4g", "Deployment ml/infer"}


def test_h100_and_l4_layouts_from_the_fixtures(make_node):
    h100 = gpu_facts.gather(str(make_node("h100-sxm5-80gb").root))["gpus"]
    result = _topology.evaluate("h", h100, "single-numa-node", cpu_policy="static", workloads=[_workload("w3", 3), _workload("w2", 2)])
    assert _blocked(result) == ["w3"] and result["max_gpus_per_numa_node"] == 2
    l4 = gpu_facts.gather(str(make_node("l4").root))["gpus"]
    assert _topology.evaluate("l", l4, "single-numa-node", cpu_policy="static")["numa_nodes"] == {"0": [0], "1": [1]}


def test_only_single_numa_node_rejects():
    workloads = [_workload("train-8g", 8)]
    for policy in ("restricted", "best-effort", "none"):
        assert _blocked(_topology.evaluate("n", DGX, policy, cpu_policy="static", workloads=workloads)) == []


def test_pod_scope_counts_the_whole_pod_and_suggests_container_scope():
    two_by_four = [_workload("pair", 4, 4)]
    assert _blocked(_topology.evaluate("n", DGX, "single-numa-node", cpu_policy="static", workloads=two_by_four)) == []
    result = _topology.evaluate("n", DGX, "single-numa-node", scope="pod", cpu_policy="static", workloads=two_by_four)
    assert _blocked(result) == ["pair"]
    assert result["findings"][0]["found"]["gpus"] == {"pod": 8}
    assert result["findings"][0]["fitting_policy"] == {"topologyManagerScope": "container", "or": {"topologyManagerPolicy": "restricted"}}


def test_more_than_two_numa_nodes_suggests_prefer_closest():
    gpus = [{"index": i, "numa_node": i // 2} for i in range(8)]
    result = _topology.evaluate("n", gpus, "single-numa-node", cpu_policy="static", workloads=[_workload("w", 4)])
    assert result["findings"][0]["fitting_policy"] == {
        "topologyManagerPolicy": "restricted", "topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "true"}}


def test_workloads_that_cannot_land_are_not_reported():
    taints = [{"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}, {"key": "soft", "effect": "PreferNoSchedule"}]
    labels = {"pool": "dgx", "gen": "4"}
    tolerate = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    workloads = [
        _workload("untolerated", 8),
        _workload("tolerated", 8, tolerations=tolerate),
        _workload("tolerate-all", 8, tolerations=[{"operator": "Exists"}]),
        _workload("other-pool", 8, tolerations=tolerate, node_selector={"pool": "l4"}),
        _workload("this-pool", 8, tolerations=tolerate, node_selector={"pool": "dgx"}),
        _workload("bound-here", 8, kind="Pod", node_name="n"),
        _workload("bound-there", 8, kind="Pod", node_name="m"),
        _workload("affinity-in", 8, tolerations=tolerate, node_affinity=[
            {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["dgx"]}]},
            {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["3"]}, {"key": "pool", "operator": "Exists"}]}]),
        _workload("affinity-out", 8, tolerations=tolerate, node_affinity=[
            {"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["4"]}]}]),
        _workload("fields", 8, tolerations=tolerate, node_affinity=[{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]),
        _workload("too-big-for-node", 16, tolerations=tolerate),
        _workload("no-gpu", 0, tolerations=tolerate),
    ]
    result = _topology.evaluate("n", DGX, "single-numa-node", cpu_policy="static", workloads=workloads, labels=labels, taints=taints)
    assert sorted(_blocked(result)) == ["affinity-in", "bound-here", "fields", "this-pool", "tolerate-all", "tolerated"]
    bound = next(entry for entry in result["findings"] if entry["workload"]["name"] == "bound-here")
    assert bound["pod"] == "ml/bound-here"


def test_init_containers_and_sidecars():
    workload = _workload("w", 2, init_containers=[{"name": "warm", "gpus": 6}, {"name": "side", "gpus": 2, "sidecar": True}])
    checked = _topology.check_workloads([workload])[0]
    assert _topology.pod_gpus(checked) == 6
    assert _blocked(_topology.evaluate("n", DGX, "single-numa-node", cpu_policy="static", workloads=[workload])) == ["w"]
    sidecar_heavy = _topology.check_workloads([_workload("s", 3, init_containers=[{"name": "side", "gpus": 2, "sidecar": True}])])[0]
    assert _topology.pod_gpus(sidecar_heavy) == 5


def test_gpus_without_numa_node():
    gpus = [{"index": 0, "numa_node": 0}, {"index": 1, "numa_node": -1}, {"index": 2, "numa_node": None},
            {"index": 3, "error": {"code": "nvml_error"}}]
    result = _topology.evaluate("n", gpus, "single-numa-node", cpu_policy="static")
    assert [(entry["id"], entry["gpu"]["index"]) for entry in result["findings"]] == [("gpu_numa_unknown", 1), ("gpu_numa_unknown", 2)]
    assert result["gpus_without_numa"] == [1, 2]
    no_hints = _topology.evaluate("n", [{"index": i, "numa_node": -1} for i in range(8)], "single-numa-node",
                                  cpu_policy="static", workloads=[_workload("w", 8)])
    assert _blocked(no_hints) == []  # no GPU gives a hint: nothing is aligned, nothing rejected for GPUs


def test_policy_findings():
    assert _ids(_topology.evaluate("n", DGX, "single-numa-node", cpu_policy="none")) == [("cpu_policy_not_static", "warning")]
    assert _ids(_topology.evaluate("n", DGX, "single-numa-node", cpu_policy=None)) == [("cpu_policy_not_static", "warning")]
    assert _ids(_topology.evaluate("n", DGX, "none", cpu_policy="none")) == [("topology_policy_no_alignment", "warning")]
    assert _ids(_topology.evaluate("n", DGX, "best-effort", cpu_policy="static")) == [("topology_policy_no_alignment", "warning")]
    assert _ids(_topology.evaluate("n", DGX[:4], "none", cpu_policy="none")) == []  # one NUMA node: nothing to align
    assert _ids(_topology.evaluate("n", DGX, None)) == [("topology_policy_unknown", "info")]
    assert _ids(_topology.evaluate("n", DGX, "restricted", cpu_policy="none")) == []


def test_module_run():
    result = run_module("topology_check", {"node_name": "dgx-1", "gpus": DGX, "topology_manager_policy": "single-numa-node",
                                           "cpu_manager_policy": "static", "workloads": [_workload("train-8g", 8)], "fail_on": "error"}, {})
    assert result["failed"] is True and "workload_cannot_fit_numa" in result["msg"]
    assert result["workloads_blocked"] == ["Deployment ml/train-8g"] and result["max_severity"] == "error"


# --- gpu_workloads_info's extraction from API objects --------------------------------------------------------


def _spec(*requests, limits_only=False, init=()):
    def container(name, value):
        key = "limits" if limits_only else "requests"
        return {"name": name, "resources": {key: {"nvidia.com/gpu": value}} if value is not None else {}}
    return {"containers": [container("c%d" % i, value) for i, value in enumerate(requests)],
            "initContainers": [dict(container("i%d" % i, value), restartPolicy="Always") for i, value in enumerate(init)],
            "nodeSelector": {"pool": "dgx"}, "tolerations": [{"operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": []}]}}}}


def test_workload_extraction():
    meta = lambda name, **extra: dict({"name": name, "namespace": "ml"}, **extra)  # noqa: E731
    objects = {
        "Deployment": [{"metadata": meta("train-8g"), "spec": {"template": {"spec": _spec("8")}}},
                       {"metadata": meta("cpu-only"), "spec": {"template": {"spec": _spec(None)}}}],
        "CronJob": [{"metadata": meta("nightly"), "spec": {"jobTemplate": {"spec": {"template": {"spec": _spec(2, limits_only=True)}}}}}],
        "Job": [{"metadata": meta("nightly-123", ownerReferences=[{"kind": "CronJob", "controller": True}]), "spec": {"template": {"spec": _spec(2)}}},
                {"metadata": meta("once"), "spec": {"template": {"spec": _spec("1", init=[1])}}}],
        "Pod": [{"metadata": meta("bare"), "spec": dict(_spec(4), nodeName="dgx-1"), "status": {"phase": "Pending"}},
                {"metadata": meta("done"), "spec": _spec(4), "status": {"phase": "Succeeded"}},
                {"metadata": meta("owned", ownerReferences=[{"kind": "ReplicaSet", "controller": True}]), "spec": _spec(8), "status": {"phase": "Running"}}],
        "StatefulSet": [], "DaemonSet": [],
    }
    found = _gpu_workloads.collect(objects, ["nvidia.com/gpu"])
    assert [(w["kind"], w["name"], w["max_container_gpus"]) for w in found] == [
        ("CronJob", "nightly", 2), ("Deployment", "train-8g", 8), ("Job", "once", 1), ("Pod", "bare", 4)]
    bare = found[-1]
    assert bare["node_name"] == "dgx-1" and bare["phase"] == "Pending" and bare["node_selector"] == {"pool": "dgx"}
    assert found[2]["init_containers"] == [{"name": "i0", "sidecar": True, "gpus": 1}]
    # What the module returns is what topology_check takes.
    assert _blocked(_topology.evaluate("dgx-1", DGX, "single-numa-node", cpu_policy="static", workloads=found,
                                       labels={"pool": "dgx"})) == ["train-8g"]
    node = _gpu_workloads.node_summary({"metadata": {"name": "dgx-1", "labels": {"a": "b"}},
                                        "spec": {"taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "x"}]},
                                        "status": {"allocatable": {"nvidia.com/gpu": "8"}}}, ["nvidia.com/gpu"])
    assert node == {"labels": {"a": "b"}, "taints": [{"key": "k", "value": None, "effect": "NoSchedule"}], "gpu_allocatable": 8}


def test_fractional_gpu_request_is_refused():
    with pytest.raises(GpuhardenError, match=r"Deployment ml/x container c0: nvidia.com/gpu='500m' is not a whole number"):
        _gpu_workloads.collect({"Deployment": [{"metadata": {"name": "x", "namespace": "ml"}, "spec": {"template": {"spec": _spec("500m")}}}]},
                               ["nvidia.com/gpu"])


def test_gpu_workloads_info_options():
    assert {"kubeconfig", "resources", "page_limit"} <= set(gpu_workloads_info.argument_spec())
    params = {"page_limit": 0, "resources": ["nvidia.com/gpu"]}
    with pytest.raises(GpuhardenError, match="option page_limit=0 must be a positive number"):
        gpu_workloads_info.gather(params)
    with pytest.raises(GpuhardenError, match="option resources is empty"):
        gpu_workloads_info.gather({"page_limit": 5, "resources": [""]})


def _listing(monkeypatch, objects):
    """gpu_workloads_info with its LISTs answered from ``objects`` (kind -> API objects as dicts)."""
    class Api:
        def close(self):
            pass
    monkeypatch.setattr(gpu_workloads_info._k8s, "api_client", lambda params: Api())
    requested = []

    def list_kind(name, api, kind, page_limit):
        requested.append(kind)
        return [dict(entry) for entry in objects.get(kind, [])], 1
    monkeypatch.setattr(gpu_workloads_info, "list_kind", list_kind)
    return requested


def test_the_topology_option_weighs_every_node_as_topology_check_does(monkeypatch):
    pool = {"metadata": {"name": "dgx-1", "labels": {"pool": "dgx"}}, "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    other = {"metadata": {"name": "dgx-2", "labels": {"pool": "other"}}, "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    train = {"metadata": {"name": "train-8g", "namespace": "ml"}, "spec": {"template": {"spec": _spec("8")}}}
    requested = _listing(monkeypatch, {"Node": [pool, other], "Deployment": [train]})
    single = {"gpus": DGX, "topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static"}
    result = gpu_workloads_info.gather({"page_limit": 500, "resources": ["nvidia.com/gpu"], "topology": {
        "dgx-1": single, "dgx-2": single, "dgx-3": dict(single, topology_manager_policy="restricted")}})
    assert sorted(requested) == sorted(gpu_workloads_info.KINDS)  # one LIST per kind, whatever the node count
    assert sorted(result["topology"]) == ["dgx-1", "dgx-2", "dgx-3"]
    # dgx-1 (selected by the Deployment's nodeSelector) cannot admit it; dgx-2 is never chosen; dgx-3 admits it
    assert _blocked(result["topology"]["dgx-1"]) == ["train-8g"] and result["topology"]["dgx-1"]["max_severity"] == "error"
    assert result["topology"]["dgx-2"]["workloads_landing"] == [] and result["topology"]["dgx-3"]["findings"] == []
    # each entry is what topology_check returns for that node, given the same labels and taints
    alone = run_module("topology_check", dict(single, node_name="dgx-1", workloads=result["workloads"],
                                              node_labels={"pool": "dgx"}), {})
    assert {key: alone[key] for key in result["topology"]["dgx-1"]} == result["topology"]["dgx-1"]
    assert "topology" in gpu_workloads_info.gather({"page_limit": 500, "resources": ["nvidia.com/gpu"], "topology": {}})


@pytest.mark.parametrize("entry, message", [
    ({"topology_manager_policy": "single-numa-node"}, r"option topology\.dgx-1: no gpus"),
    ({"gpus": DGX, "policy": "x"}, r"option topology\.dgx-1: unknown keys policy"),
    ({"gpus": DGX, "topology_manager_policy": "strict"}, r"gpu_workloads_info: option topology\.dgx-1\.topology_manager_policy: 'strict'"),
    ({"gpus": [{"index": 0, "numa_node": "zero"}]}, r"gpu_workloads_info: option topology\.dgx-1\.gpus"),
    ("dgx", r"option topology\.dgx-1: expected a dictionary"),
])
def test_a_malformed_topology_entry_is_refused_before_any_request(monkeypatch, entry, message):
    requested = _listing(monkeypatch, {})
    with pytest.raises(GpuhardenError, match=message):
        gpu_workloads_info.gather({"page_limit": 500, "resources": ["nvidia.com/gpu"], "topology": {"dgx-1": entry}})
    assert requested == []


# --- malformed inputs: the module names the option, the entry and the value ---------------------------------

MALFORMED = [
    ({"gpus": "eight"}, "gpus"),
    ({"gpus": [7]}, "Elements value for option 'gpus' is of type int"),
    ({"gpus": [{"index": 0}]}, "option gpus[0]: field numa_node is missing"),
    ({"gpus": [{"numa_node": 0}]}, "option gpus[0]: field index is missing"),
    ({"gpus": [{"index": 0, "numa_node": "zero"}]}, "option gpus[0].numa_node: 'zero' is not an integer"),
    ({"gpus": [{"index": 0, "numa_node": -2}]}, "option gpus[0].numa_node: -2 is below -1"),
    ({"gpus": [{"index": 0, "numa_node": 0}, {"index": 0, "numa_node": 1}]}, "option gpus: GPU indexes repeat: [0, 0]"),
    ({"topology_manager_policy": "single-numa"}, "option topology_manager_policy: 'single-numa' is not one of none, best-effort"),
    ({"topology_manager_scope": "node"}, "option topology_manager_scope: 'node' is not one of container, pod"),
    ({"cpu_manager_policy": "Static"}, "option cpu_manager_policy: 'Static' is not one of none, static"),
    ({"workloads": [{"kind": "Deployment"}]}, "option workloads[0].name: missing or not a string: None"),
    ({"workloads": [_workload("w", "lots")]}, "option workloads[0].containers[0].gpus: 'lots' is not an integer"),
    ({"workloads": [_workload("w", -1)]}, "option workloads[0].containers[0].gpus: -1 is below 0"),
    ({"workloads": [_workload("w", 1, tolerations=[{"operator": "Matches"}])]},
     "option workloads[0].tolerations[0].operator: 'Matches' is not Equal or Exists"),
    ({"workloads": [_workload("w", 1, node_affinity=[{"matchExpressions": [{"key": "a", "operator": "Like"}]}])]},
     "option workloads[0].node_affinity[0].matchExpressions[0].operator: 'Like' is not a node selector operator"),
    ({"workloads": [_workload("w", 1, node_affinity=[{"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1", "2"]}]}])]},
     "option workloads[0].node_affinity[0].matchExpressions[0].values: Gt needs exactly one integer value"),
    ({"workloads": [_workload("w", 1, node_selector={"pool": 7})]}, "option workloads[0].node_selector: 'pool': 7 must map strings to strings"),
    ({"node_taints": [{"key": "k", "effect": "NoRun"}]}, "option node_taints[0].effect: 'NoRun' is not one of NoSchedule"),
    ({"node_labels": {"a": ["b"]}}, "option node_labels: 'a': ['b'] must map strings to strings"),
    ({"node_name": ""}, "option node_name is empty"),
]


@pytest.mark.parametrize(("args", "message"), MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_input_fails_clearly(args, message):
    result = run_module("topology_check", dict({"node_name": "n", "gpus": DGX, "topology_manager_policy": "single-numa-node"}, **args), {})
    assert result.get("failed") is True, result
    assert message in result["msg"]


# ---------------------------------------------------------------------------------------------
# harden's admission check, predicted by the drift check (issue 43, item 8): a node it keeps is no remediable drift


def _plan(policy=("none", "single-numa-node"), scope=(None, None), cpu_changed=True):
    return {"sources": {"topologyManagerPolicy": {"before": policy[0], "after": policy[1]},
                        "topologyManagerScope": {"before": scope[0], "after": scope[1]}},
            "cpu_manager_policy_changed": cpu_changed}


@pytest.mark.parametrize(("plan", "switch"), [
    (_plan(), {"policy": "single-numa-node", "scope": "container"}),
    (_plan(("best-effort", "restricted"), cpu_changed=False), {"policy": "restricted", "scope": "container"}),
    (_plan(("single-numa-node", "single-numa-node"), ("container", "pod"), False), {"policy": "single-numa-node", "scope": "pod"}),
    (_plan(("single-numa-node", "single-numa-node"), cpu_changed=True), {"policy": "single-numa-node", "scope": "container"}),
    (_plan(("single-numa-node", "single-numa-node"), cpu_changed=False), None),  # nothing that can refuse a pod changes
    (_plan(("none", "best-effort")), None),  # best-effort admits every pod (policy_best_effort.go canAdmitPodResult)
    (_plan((None, None)), None),
    ({}, None),
])
def test_the_admission_check_runs_where_harden_runs_it(plan, switch):
    """The condition of harden's admission check (module_utils/cluster/_kubelet_stage.py stage(), switch)."""
    assert _topology.admission_switch(plan) == switch


def test_a_node_that_could_no_longer_admit_a_workload_is_kept_with_the_reason():
    switch = {"policy": "single-numa-node", "scope": "container"}
    weighed = _topology.check_node("dgx-1", DGX, "single-numa-node", workloads=[_workload("train-8g", 8), _workload("infer", 1)])
    kept = _topology.kept_by_admission(switch, weighed)
    assert kept["workloads"] == [{"kind": "Deployment", "namespace": "ml", "name": "train-8g"}]
    assert kept["fields"] == list(_topology.KEPT_FIELDS) and kept["policy"] == "single-numa-node"
    assert "Deployment ml/train-8g" in kept["reason"] and "kubelet_topology_ignore_unadmittable_workloads=true" in kept["reason"]
    fits = _topology.check_node("dgx-1", DGX, "single-numa-node", workloads=[_workload("train-4g", 4)])
    assert _topology.kept_by_admission(switch, fits) is None
    blind = _topology.kept_by_admission(switch, None, "gpu_consistency: list deployments: forbidden")
    assert blind["workloads"] == [] and "could not be listed" in blind["reason"] and "forbidden" in blind["reason"]
