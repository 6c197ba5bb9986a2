# SPDX-License-Identifier: GPL-3.0-or-later
"""The RuntimeClass handler on the nodes (issue 14): a target Node whose status.runtimeHandlers lacks the handler is
a finding, a Node without the field is counted but never judged, and the finding reaches gpuharden drift's report
as one the container_runtime stage fixes."""

from __future__ import annotations

import copy

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _runtime_class as rc
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.modules import runtime_class as module

from gpuharden import drift_metrics, drift_report
from tests.unit.test_device_plugin import FakeCluster

DEFAULTS = {name: spec.get("default") for name, spec in module.argument_spec().items()}
GPU = {"nvidia.com/gpu.present": "true"}


def params(**overrides):
    out = copy.deepcopy(DEFAULTS)
    out.update(overrides)
    return out


def handlers(*names):
    """status.runtimeHandlers as a kubelet 1.31+ on containerd 2.x writes it."""
    return [{"name": name, "features": {"recursiveReadOnlyMounts": True, "userNamespaces": False}} for name in names]


def node(name, labels=None, runtime_handlers=None, capacity=None):
    status = {"capacity": dict(capacity or {})}
    if runtime_handlers is not None:
        status["runtimeHandlers"] = runtime_handlers
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})}, "status": status}


def audit(nodes, names=(), **overrides):
    return rc.node_handler_audit(nodes, rc.check_params(params(**overrides)), names)


# ------------------------------------------------------------------------------------------------ pure function


def test_handler_present_is_clean_and_counted_as_checked():
    result = audit([node("gpu-0", GPU, handlers("", "nvidia", "runc"))])
    assert result == {"findings": [], "checked": ["gpu-0"], "without_runtime_handlers": [], "not_registered": []}


def test_handler_missing_is_an_error_finding_the_node_side_repairs():
    [finding] = audit([node("gpu-0", GPU, handlers("", "runc"))])["findings"]
    assert finding["id"] == "runtime_class_handler_missing_on_node" and finding["severity"] == "error"
    assert finding["subject"] == "Node gpu-0" and finding["expected"] == "nvidia" and finding["found"] == ["", "runc"]
    assert finding["repair"] == "container_runtime"
    assert list(finding) == ["id", "check", "stage", "severity", "expected", "found", "hint", "remediable", "subject", "repair"]
    assert (finding["check"], finding["stage"], finding["remediable"]) == ("runtime_class", "container_runtime", True)
    message = finding["hint"]
    assert "Node gpu-0" in message and '"" (the default), runc' in message
    assert 'no runtime for "nvidia" is configured' in message and "role container_runtime" in message
    assert "rewriting the RuntimeClass does not fix it" in message


def test_the_default_handler_entry_is_not_the_handler():
    # containerd lists its default runtime under its own name and again as "": a node whose default is runc and
    # that has no nvidia runtime shows only "" and runc, and "" never stands for the RuntimeClass's handler
    [finding] = audit([node("gpu-0", GPU, handlers(""))])["findings"]
    assert finding["found"] == [""]
    # nvidia as containerd's default runtime: it is listed by name as well
    assert audit([node("gpu-0", GPU, handlers("", "nvidia"))])["findings"] == []


def test_a_node_without_the_field_is_counted_not_judged():
    nodes = [node("old-kubelet", GPU), node("kwok-0", GPU, []), node("gpu-0", GPU, handlers("", "runc"))]
    result = audit(nodes)
    assert result["without_runtime_handlers"] == ["kwok-0", "old-kubelet"] and result["checked"] == ["gpu-0"]
    assert [f["subject"] for f in result["findings"]] == ["Node gpu-0"]


def test_without_node_selector_the_gpu_nodes_are_targets():
    nodes = [node("labelled", GPU, handlers("", "runc")),
             node("advertising", None, handlers("", "runc"), capacity={"nvidia.com/gpu": "2"}),
             node("plugin-gone", None, handlers("", "runc"), capacity={"nvidia.com/mig-1g.10gb": "0"}),
             node("cpu-0", {"nvidia.com/gpu.present": "false"}, handlers("", "runc"), capacity={"cpu": "8"})]
    result = audit(nodes)
    assert result["checked"] == ["advertising", "labelled", "plugin-gone"]
    assert [f["subject"] for f in result["findings"]] == ["Node advertising", "Node labelled", "Node plugin-gone"]


def test_with_node_selector_only_matching_nodes_are_targets():
    nodes = [node("pool-a", {"pool": "a"}, handlers("", "runc")),
             node("pool-b", dict(GPU, pool="b"), handlers("", "runc")),
             node("unlabelled", GPU, handlers(""))]
    result = audit(nodes, node_selector={"pool": "a"})
    # a GPU node the selector does not match never runs pods of this RuntimeClass
    assert result["checked"] == ["pool-a"] and [f["subject"] for f in result["findings"]] == ["Node pool-a"]


def test_nodes_narrow_the_targets_and_name_the_unregistered():
    nodes = [node("gpu-0", GPU, handlers("", "runc")), node("gpu-1", GPU, handlers("", "runc")),
             node("fresh", None, handlers("", "runc"))]
    result = audit(nodes, names=["gpu-1", "fresh", "gone"])
    # named nodes are GPU nodes by the inventory's word, even before the label or the plugin's resources
    assert result["checked"] == ["fresh", "gpu-1"] and result["not_registered"] == ["gone"]
    assert [f["subject"] for f in result["findings"]] == ["Node fresh", "Node gpu-1"]
    with_selector = audit(nodes, names=["gpu-1", "fresh"], node_selector=GPU)
    assert with_selector["checked"] == ["gpu-1"]


def test_another_handler_and_runtime_class_name_are_the_ones_named():
    [finding] = audit([node("gpu-0", GPU, handlers("", "nvidia", "runc"))], name="gpu", handler="nvidia-cdi")["findings"]
    assert finding["expected"] == "nvidia-cdi" and "runtimeClassName gpu" in finding["hint"]
    assert 'no runtime for "nvidia-cdi" is configured' in finding["hint"]


# ------------------------------------------------------------------------------------------------ module


class FakeModule:
    def __init__(self, check_mode=False, **overrides):
        self.params = params(**overrides)
        self.check_mode, self._diff, self.warnings = check_mode, False, []

    def warn(self, message):
        self.warnings.append(message)


RUNTIME_CLASS = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "handler": "nvidia",
                 "metadata": {"name": "nvidia", "labels": {"app.kubernetes.io/managed-by": "gpuharden"},
                              "managedFields": [{"manager": "gpuharden", "operation": "Apply"}]}}
NODES = [node("gpu-0", GPU, handlers("", "nvidia", "runc")), node("gpu-1", GPU, handlers("", "runc")), node("gpu-2", GPU)]


def run_fake(monkeypatch, cluster, check_mode=False, **overrides):
    monkeypatch.setattr(module._k8s, "api_client", lambda params: None)
    monkeypatch.setattr(module._k8s_objects, "Client", lambda api, who: cluster)
    return module.run(FakeModule(check_mode, **overrides))


@pytest.mark.parametrize("check_mode", [True, False])
def test_module_reports_the_node_without_the_handler_in_both_modes(monkeypatch, check_mode):
    cluster = FakeCluster(RUNTIME_CLASS, *NODES)
    result = run_fake(monkeypatch, cluster, check_mode=check_mode)
    assert [(f["id"], f["subject"]) for f in result["findings"]] == [("runtime_class_handler_missing_on_node", "Node gpu-1")]
    assert result["node_runtime_handlers"] == {"checked": ["gpu-0", "gpu-1"], "without_runtime_handlers": ["gpu-2"],
                                               "not_registered": []}
    # LIST RuntimeClass, LIST Node, GET RuntimeClass (the fake counts reads; the real client also counts the dry-run
    # apply); no write persists, none is needed: the node side is never repaired from here
    assert result["api_requests"] == 3 and result["action"] == "none" and not result["changed"]
    assert [write for write in cluster.writes if not write[1]] == []


def test_module_restricted_to_nodes(monkeypatch):
    result = run_fake(monkeypatch, FakeCluster(RUNTIME_CLASS, *NODES), nodes=["gpu-0", "gpu-9"])
    assert result["findings"] == []
    assert result["node_runtime_handlers"] == {"checked": ["gpu-0"], "without_runtime_handlers": [], "not_registered": ["gpu-9"]}


def test_module_refusal_still_carries_the_node_findings(monkeypatch):
    legacy = dict(copy.deepcopy(RUNTIME_CLASS), handler="nvidia-legacy")
    with pytest.raises(GpuhardenError, match="handler is immutable") as caught:
        run_fake(monkeypatch, FakeCluster(legacy, *NODES))
    assert {f["id"] for f in caught.value.result["findings"]} == {"runtime_class_handler_mismatch", "runtime_class_handler_missing_on_node"}


# ------------------------------------------------------------------------------------------------ drift report


def test_drift_reports_the_missing_handler_as_a_container_runtime_cluster_finding(monkeypatch):
    result = run_fake(monkeypatch, FakeCluster(RUNTIME_CLASS, *NODES), check_mode=True)
    outcomes = drift_report.Outcomes()
    outcomes.feed({"event": "runner_on_ok", "event_data": {"host": "gpu-0", "task_action": "gpuharden.k8s.node_audit",
                                                           "res": {"findings": [], "summary": {}, "checks": {}}}})
    outcomes.feed({"event": "runner_on_ok", "event_data": {"host": "gpu-0", "task_action": "gpuharden.k8s.runtime_class",
                                                           "res": dict(result, failed_when_result=False)}})
    report = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=0.0, finished=1.0)
    [entry] = report["cluster"]["findings"]
    assert (entry["id"], entry["stage"], entry["severity"], entry["remediable"]) == (
        "runtime_class_handler_missing_on_node", "container_runtime", "error", True)
    assert entry["subject"] == "Node gpu-1" and entry["found"] == ["", "runc"] and entry["expected"] == "nvidia"
    assert entry["repair"] == "container_runtime" and "role container_runtime" in entry["hint"]
    assert report["summary"]["cluster_findings"] == 1 and drift_report.exit_code(report) == drift_report.EXIT_DRIFT
    assert 'gpuharden_drift_cluster_findings{check="runtime_class",severity="error"} 1' in drift_metrics.prometheus_text(report)


# ------------------------------------------------------------------------------------------------ in the consistency run
# The drift check runs the RuntimeClass dry run inside its gpu_consistency module run (option runtime_class): the same
# reconcile() over that module's client, with that module's LIST of Nodes.


def folded(monkeypatch, cluster, option):
    """The dry run as gpu_consistency makes it: over that module's client and its LIST of Nodes."""
    return rc.dry_run(cluster, rc.check_option(option, "gpu_consistency: option runtime_class"), copy.deepcopy(NODES), 500)


@pytest.mark.parametrize("live, names", [((RUNTIME_CLASS,), []), ((RUNTIME_CLASS,), ["gpu-1", "gpu-9"]), ((), []),
                                         ((dict(RUNTIME_CLASS, overhead={"podFixed": {"nvidia.com/gpu": "1"}}),), [])])
def test_the_folded_check_answers_as_the_module_in_check_mode(monkeypatch, live, names):
    alone = run_fake(monkeypatch, FakeCluster(*live, *NODES), check_mode=True, nodes=names)
    cluster = FakeCluster(*live, *NODES)
    inside = folded(monkeypatch, cluster, {"name": "nvidia", "handler": "nvidia", "nodes": names})
    # the module LISTs the Nodes itself; the folded check takes the consistency run's LIST (one request less)
    assert inside.pop("api_requests") == alone.pop("api_requests") - 1
    assert inside == alone
    assert [write for write in cluster.writes if not write[1]] == []


def test_the_folded_check_reports_a_refusal_instead_of_raising(monkeypatch):
    legacy = dict(copy.deepcopy(RUNTIME_CLASS), handler="nvidia-legacy")
    inside = folded(monkeypatch, FakeCluster(legacy, *NODES), {"handler": "nvidia"})
    assert inside["failed"] is True and "handler is immutable" in inside["msg"]
    assert {f["id"] for f in inside["findings"]} == {"runtime_class_handler_mismatch", "runtime_class_handler_missing_on_node"}
    # the drift report reads it as it read the separate task's failure: the findings, no check_failed entry
    assert {f["id"] for f in drift_report.runtime_class_findings(inside)} == {"runtime_class_handler_mismatch",
                                                                       "runtime_class_handler_missing_on_node"}


@pytest.mark.parametrize("option, needle", [
    ({"handlr": "nvidia"}, "unknown key(s) handlr"),
    ({"nodes": "gpu-0"}, "runtime_class.nodes='gpu-0' must be a list"),
    ({"handler": "Not_A_Label"}, "option handler"),
    ({"overhead_pod_fixed": {"nvidia.com/gpu": "1"}}, "phantom GPUs"),
    (["nvidia"], "must be a mapping"),
])
def test_the_folded_option_is_validated_as_the_module_options(option, needle):
    with pytest.raises(GpuhardenError) as caught:
        rc.check_option(option, "gpu_consistency: option runtime_class")
    assert needle in str(caught.value)


def test_the_folded_option_takes_the_module_defaults():
    desired, names = rc.check_option({"nodes": ["gpu-0"]}, "gpu_consistency: option runtime_class")
    assert desired == rc.check_params(params()) and names == ["gpu-0"]


def test_drift_takes_the_runtime_class_check_from_the_consistency_run(monkeypatch):
    inside = folded(monkeypatch, FakeCluster(RUNTIME_CLASS, *NODES), {})
    outcomes = drift_report.Outcomes()
    outcomes.feed({"event": "runner_on_ok", "event_data": {"host": "gpu-0", "task_action": "gpuharden.k8s.node_audit",
                                                           "res": {"findings": [], "summary": {}, "checks": {}}}})
    outcomes.feed({"event": "runner_on_ok", "event_data": {"host": "gpu-0", "task_action": "gpuharden.k8s.gpu_consistency",
                                                           "res": {"findings": [], "runtime_class_check": inside}}})
    report = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=0.0, finished=1.0)
    assert report["cluster"]["runtime_class_checked"] is True
    assert [(f["id"], f["subject"]) for f in report["cluster"]["findings"]] == [("runtime_class_handler_missing_on_node", "Node gpu-1")]


# ------------------------------------------------------------------------------------------------ in harden's plan
# Harden's plan runs the same dry run inside its gpu_pods_info module run (option runtime_class), with no LIST of Nodes
# of its own, and playbooks/harden_gpu_nodes.yml runs the RuntimeClass stage only where it would change or report
# something.


def planned(monkeypatch, cluster, option, nodes=()):
    from ansible_collections.gpuharden.k8s.plugins.modules import gpu_pods_info

    monkeypatch.setattr(gpu_pods_info._k8s, "api_client", lambda params: FakeApi())
    monkeypatch.setattr(gpu_pods_info._k8s_objects, "Client", lambda api, who: cluster)
    monkeypatch.setattr(gpu_pods_info, "list_pods", lambda api, selector, limit: ([], 1))
    spec = gpu_pods_info.argument_spec()
    module_params = {name: entry.get("default") for name, entry in spec.items()}
    module_params.update(nodes=list(nodes), runtime_class=option)
    return gpu_pods_info.gather(module_params)


class FakeApi:
    closed = False

    def close(self):
        self.closed = True


@pytest.mark.parametrize("live, names", [((RUNTIME_CLASS,), []), ((RUNTIME_CLASS,), ["gpu-1", "gpu-9"]), ((), []),
                                         ((dict(RUNTIME_CLASS, overhead={"podFixed": {"nvidia.com/gpu": "1"}}),), [])])
def test_the_plan_check_answers_as_the_module_in_check_mode(monkeypatch, live, names):
    alone = run_fake(monkeypatch, FakeCluster(*live, *NODES), check_mode=True, nodes=names)
    cluster = FakeCluster(*live, *NODES)
    result = planned(monkeypatch, cluster, {"name": "nvidia", "handler": "nvidia", "nodes": names}, nodes=["gpu-0"])
    # the same requests as the module's own run: the plan has no LIST of Nodes to lend it
    assert result["runtime_class_check"] == alone
    assert result["api_requests"] == 1 and result["pod_uids_by_node"] == {"gpu-0": []}
    assert [write for write in cluster.writes if not write[1]] == []


def test_the_plan_check_runs_without_nodes_and_reports_a_refusal(monkeypatch):
    legacy = dict(copy.deepcopy(RUNTIME_CLASS), handler="nvidia-legacy")
    result = planned(monkeypatch, FakeCluster(legacy, *NODES), {"handler": "nvidia"})
    check = result["runtime_class_check"]
    assert check["failed"] is True and "handler is immutable" in check["msg"]
    assert result["pods"] == [] and result["api_requests"] == 0


def test_the_plan_without_the_option_checks_no_runtime_class(monkeypatch):
    cluster = FakeCluster(RUNTIME_CLASS, *NODES)
    result = planned(monkeypatch, cluster, None, nodes=["gpu-0"])
    assert result["runtime_class_check"] is None and cluster.writes == []


def test_the_plan_option_is_validated_before_any_request(monkeypatch):
    cluster = FakeCluster(RUNTIME_CLASS, *NODES)
    with pytest.raises(GpuhardenError) as caught:
        planned(monkeypatch, cluster, {"handlr": "nvidia"}, nodes=["gpu-0"])
    assert "gpu_pods_info: option runtime_class has unknown key(s) handlr" in str(caught.value)
    assert cluster.requests == 0 and cluster.writes == []
