# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden explain against a fake API server: one test per cause rule (fires / does not fire), the JSON schema, the
exit codes, the three states (401, 403, unreachable) and the requests each symptom costs."""

from __future__ import annotations

import io
import json
import os
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from gpuharden import cli, explain
from tests.unit.conftest import JsonHandler

PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.18.2"
NVML_MESSAGE = "failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND"


def node(name, allocatable=None, labels=None, unschedulable=False, annotations=None, taints=None):
    allocatable = {"cpu": "8", "memory": "32Gi", **(allocatable or {})}
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": dict({"unschedulable": True} if unschedulable else {}, **({"taints": taints} if taints else {})),
            "status": {"capacity": dict(allocatable), "allocatable": dict(allocatable),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def gpu_node(name, count=2, **kwargs):
    return node(name, {"nvidia.com/gpu": str(count)}, labels={"nvidia.com/gpu.present": "true"}, **kwargs)


def pod(name, limits=None, namespace="ml", node_name=None, phase="Pending", reason=None, message=None, scheduler=None,
        ready=False, runtime_class=None, container_statuses=None, tolerations=None):
    spec = {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits if limits is not None else {"nvidia.com/gpu": "1"}}}]}
    if node_name:
        spec["nodeName"] = node_name
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if tolerations:
        spec["tolerations"] = tolerations
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if scheduler:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": scheduler})
    status = {"phase": phase, "conditions": conditions, "containerStatuses": container_statuses or []}
    if reason:
        status["reason"], status["message"] = reason, message
    return {"metadata": {"name": name, "namespace": namespace, "uid": "uid-" + name}, "spec": spec, "status": status}


def plugin_pod(node_name, ready=True, waiting=None, restarts=0, last_message=None):
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    status = {"name": "nvidia-device-plugin-ctr", "ready": ready, "restartCount": restarts, "state": state}
    if last_message:
        status["lastState"] = {"terminated": {"exitCode": 1, "message": last_message}}
    return {"metadata": {"name": "nvidia-device-plugin-" + node_name, "namespace": "kube-system", "labels": {"name": "nvidia-device-plugin-ds"}},
            "spec": {"nodeName": node_name, "runtimeClassName": "nvidia", "containers": [{"name": "nvidia-device-plugin-ctr", "image": PLUGIN_IMAGE}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [status]}}


PLUGIN_DS = {"metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
             "spec": {"selector": {"matchLabels": {"name": "nvidia-device-plugin-ds"}},
                      "template": {"spec": {"containers": [{"name": "nvidia-device-plugin-ctr", "image": PLUGIN_IMAGE}]}}}}


class FakeApi:
    """The API paths explain reads, over lists of objects; every request is recorded as (path, query).  ``status``:
    every request answered with that HTTP status instead (401, 403)."""

    def __init__(self, nodes=(), pods=(), events=(), daemonsets=(PLUGIN_DS,), status=None):
        self.nodes, self.pods, self.daemonsets = list(nodes), list(pods), list(daemonsets)
        self.events = None if events is None else list(events)
        self.status, self.requests = status, []
        api = self

        class Handler(JsonHandler):
            def do_GET(self):
                url = urlparse(self.path)
                query = {key: values[0] for key, values in parse_qs(url.query).items()}
                api.requests.append((url.path, query))
                if api.status:
                    return self.send_json(api.status, {"kind": "Status", "message": 'pods is forbidden: User "bob" cannot get resource'})
                found = api.answer(url.path.strip("/").split("/"), query)
                if found == "forbidden":
                    return self.send_json(403, {"kind": "Status", "message": 'events is forbidden: User "tool" cannot list resource "events"'})
                if found is None:
                    return self.send_json(404, {"kind": "Status", "reason": "NotFound", "message": "not found"})
                return self.send_json(200, found)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def answer(self, parts, query):
        def listed(items):
            return {"kind": "List", "metadata": {}, "items": items}

        fields = dict(pair.split("=", 1) for pair in query.get("fieldSelector", "").split(",") if "=" in pair and "!=" not in pair)
        if parts == ["api", "v1", "nodes"]:
            return listed(self.nodes)
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            return next((n for n in self.nodes if n["metadata"]["name"] == parts[3]), None)
        if parts == ["apis", "apps", "v1", "daemonsets"]:
            return listed(self.daemonsets)
        if parts == ["api", "v1", "pods"]:
            pods = [p for p in self.pods if "spec.nodeName" not in fields or p["spec"].get("nodeName") == fields["spec.nodeName"]]
            if "status.phase!=Succeeded" in query.get("fieldSelector", ""):
                pods = [p for p in pods if p["status"].get("phase") != "Succeeded"]
            return listed(pods)
        if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["pods"] and "metadata.name" in fields:
            return listed([p for p in self.pods if p["metadata"]["namespace"] == parts[3] and p["metadata"]["name"] == fields["metadata.name"]])
        if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["pods"]:
            labels = dict(pair.split("=", 1) for pair in query.get("labelSelector", "").split(",") if pair)
            return listed([p for p in self.pods if p["metadata"]["namespace"] == parts[3]
                           and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())])
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
            return next((p for p in self.pods if p["metadata"]["namespace"] == parts[3] and p["metadata"]["name"] == parts[5]), None)
        if parts[:3] == ["api", "v1", "namespaces"] and parts[4:] == ["events"]:
            if self.events is None:
                return "forbidden"
            return listed([e for e in self.events if e["involvedObject"]["name"] == fields.get("involvedObject.name")])
        return None

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def lib():
    return explain.load_collection()


@pytest.fixture
def cluster():
    made = []

    def make(**kwargs):
        made.append(FakeApi(**kwargs))
        return made[-1]

    yield make
    for api in made:
        api.close()


def run(lib, api, target, report=None, trip=None):
    kind, _, name = target.partition(" ")
    if kind == "--failing":
        parsed = {"kind": "failing"}
    else:
        args = cli.build_parser().parse_args(["explain", kind, name])
        parsed = explain.parse_target(args)
    return explain.explain(lib, parsed, {"host": api.url, "api_key": "t"}, trip=trip, report=report, report_source="drift report r.json")


# ---------------------------------------------------------------------------------------------------------------
# The rules: each fires on its symptom, and does not on a look-alike


def test_misspelled_resource_names_the_closest_advertised_one_with_no_node_trip(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a"), node("cpu-a")], pods=[pod("train-0", {"nvidia.com/gpus": "1"},
                                                                        scheduler="0/2 nodes are available: 2 Insufficient nvidia.com/gpus.")])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "resource_not_advertised"
    summary = document["verdict"]["summary"]
    assert "nvidia.com/gpus" in summary and "did you mean nvidia.com/gpu? (the closest name a node advertises)" in summary
    assert document["verdict"]["finding_id"] == "requested_resource_not_advertised"
    # the pod and the Nodes: no plugin pods, no events, no node object of its own
    assert api.requests == [("/api/v1/namespaces/ml/pods", {"fieldSelector": "metadata.name=train-0", "limit": "500"}),
                            ("/api/v1/nodes", {"limit": "500"})]
    assert document["api_requests"] == 2
    assert explain.text(document).splitlines()[0].startswith("ml/train-0: requests nvidia.com/gpus, which no node advertises")


def test_misspelled_resource_on_a_cluster_that_advertises_no_gpu_yet(lib, cluster):
    api = cluster(nodes=[node("cpu-a")], pods=[pod("train-0", {"nvidia.com/gpus": "1"})])
    summary = run(lib, api, "pod ml/train-0")["verdict"]["summary"]
    assert summary.endswith("did you mean nvidia.com/gpu? (the NVIDIA device plugin's name; no node advertises a GPU resource yet)")


def test_a_correct_name_is_not_a_misspelling(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", scheduler="0/1 nodes are available: 1 Insufficient nvidia.com/gpu."),
                                                    plugin_pod("gpu-a")])
    assert run(lib, api, "pod ml/train-0")["verdict"]["cause"] != "resource_not_advertised"


def test_no_device_plugin_on_the_gpu_nodes(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a", count=0), node("cpu-a")], pods=[pod("train-0")])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "no_device_plugin", document
    assert document["verdict"]["stage"] == "device_plugin" and any("--tags device_plugin -l gpu-a" in line for line in document["fix"])
    assert ("/apis/apps/v1/daemonsets", {"limit": "500"}) in api.requests


def test_a_plugin_that_runs_is_not_missing(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a", count=0)], pods=[pod("train-0"), plugin_pod("gpu-a")])
    assert run(lib, api, "pod ml/train-0")["verdict"]["cause"] != "no_device_plugin"


def test_crash_looping_plugin_without_the_nvidia_runtime(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a", count=0)], pods=[
        pod("train-0", node_name="gpu-a", phase="Failed", reason="UnexpectedAdmissionError",
            message="Allocate failed due to no healthy devices present; cannot allocate unhealthy devices nvidia.com/gpu"),
        plugin_pod("gpu-a", ready=False, waiting="CrashLoopBackOff", restarts=7, last_message=NVML_MESSAGE)])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "device_plugin_failing", document
    assert "CrashLoopBackOff (7 restarts)" in document["verdict"]["summary"] and "NVML" in document["verdict"]["summary"]
    assert any("--tags container_runtime,runtime_class,device_plugin -l gpu-a" in line for line in document["fix"])
    # bound: the node's own pods, by field selector
    assert ("/api/v1/pods", {"fieldSelector": "spec.nodeName=gpu-a", "limit": "500"}) in api.requests
    assert any(e["where"] == "pod kube-system/nvidia-device-plugin-gpu-a status.containerStatuses" for e in document["evidence"])


def test_a_ready_plugin_is_not_failing(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a", count=0)], pods=[pod("train-0", node_name="gpu-a", phase="Pending"), plugin_pod("gpu-a", restarts=2)])
    assert run(lib, api, "pod ml/train-0")["verdict"]["cause"] not in ("device_plugin_failing", "no_device_plugin")


def test_mig_name_on_a_node_of_the_single_strategy(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", {"nvidia.com/mig-1g.10gb": "1"})])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "mig_strategy_mismatch", document
    assert "migStrategy none or single, not mixed" in document["verdict"]["summary"] and document["verdict"]["finding_id"] == "mig_not_advertised"
    assert document["verdict"]["stage"] is None and "(no harden stage fixes it)" in explain.text(document)  # the catalogue: never


def test_mig_profile_not_in_the_layout_and_gpu_on_mixed_nodes(lib, cluster):
    mixed = node("gpu-a", {"nvidia.com/mig-2g.20gb": "3"}, labels={"nvidia.com/gpu.present": "true"})
    api = cluster(nodes=[mixed], pods=[pod("a", {"nvidia.com/mig-1g.10gb": "1"}), pod("b", {"nvidia.com/gpu": "1"})])
    first = run(lib, api, "pod ml/a")
    assert first["verdict"]["cause"] == "mig_strategy_mismatch" and "nvidia.com/mig-2g.20gb" in first["verdict"]["summary"]
    second = run(lib, api, "pod ml/b")
    assert second["verdict"]["cause"] == "mig_strategy_mismatch" and "migStrategy mixed" in second["verdict"]["summary"]


def test_an_advertised_mig_name_is_no_mismatch(lib, cluster):
    mixed = node("gpu-a", {"nvidia.com/mig-1g.10gb": "7"}, labels={"nvidia.com/gpu.present": "true"})
    api = cluster(nodes=[mixed], pods=[pod("a", {"nvidia.com/mig-1g.10gb": "1"}, scheduler="0/1 nodes are available: 1 Insufficient nvidia.com/mig-1g.10gb.")])
    document = run(lib, api, "pod ml/a")
    assert document["verdict"]["cause"] == "gpus_all_allocated", document


def test_insufficient_gpus_all_allocated_reads_the_events(lib, cluster):
    event = {"involvedObject": {"kind": "Pod", "name": "train-0"}, "type": "Warning", "reason": "FailedScheduling",
             "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}
    api = cluster(nodes=[gpu_node("gpu-a", 4), gpu_node("gpu-b", 4)], pods=[pod("train-0", scheduler=event["message"]), plugin_pod("gpu-a"),
                                                                            plugin_pod("gpu-b")], events=[event])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "gpus_all_allocated" and "2 node(s) advertise 8 in all" in document["verdict"]["summary"]
    assert ("/api/v1/namespaces/ml/events", {"fieldSelector": "involvedObject.kind=Pod,involvedObject.name=train-0", "limit": "500"}) in api.requests


def test_events_the_identity_may_not_list_are_named_not_checked(lib, cluster):
    scheduler = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    api = cluster(nodes=[gpu_node("gpu-a", 4)], pods=[pod("train-0", scheduler=scheduler), plugin_pod("gpu-a")], events=None)
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "gpus_all_allocated" and document["state"] == "cause"
    assert document["not_checked"][0]["what"] == "the events of pod ml/train-0" and "forbidden" in document["not_checked"][0]["cause"]


def test_not_insufficient_when_the_scheduler_says_otherwise(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a", 4)], pods=[pod("train-0", scheduler="0/1 nodes are available: 1 node(s) didn't match Pod's node affinity."),
                                                       plugin_pod("gpu-a")])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] is None and document["state"] == "undecided"
    assert "node affinity" in json.dumps(document["evidence"])


@pytest.mark.parametrize("reason", ["TopologyAffinityError", "UnexpectedAdmissionError"])
def test_kubelet_admission_rejection_is_named(lib, cluster, reason):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", {"nvidia.com/gpu": "2"}, node_name="gpu-a", phase="Failed", reason=reason,
                                                       message="Pod was rejected: Resources cannot be allocated with Topology locality"),
                                                   plugin_pod("gpu-a")])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "admission_rejected"
    assert document["verdict"]["summary"].startswith("the kubelet on gpu-a rejected the pod at admission: %s" % reason)


def test_other_failed_reasons_are_not_admission(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", node_name="gpu-a", phase="Failed", reason="Evicted", message="low memory"),
                                                   plugin_pod("gpu-a")])
    assert run(lib, api, "pod ml/train-0")["verdict"]["cause"] != "admission_rejected"


def test_gpu_nodes_cordoned_by_gpuharden_or_by_someone_else(lib, cluster):
    record = json.dumps({"owner": "harden-run-42", "at": "2026-12-06T20:00:00Z", "for": "kubelet_topology"})
    ours = gpu_node("gpu-a", unschedulable=True, annotations={"gpuharden.io/cordon": record})
    theirs = gpu_node("gpu-b", taints=[{"key": "maintenance", "value": "true", "effect": "NoSchedule"}])
    api = cluster(nodes=[ours, theirs], pods=[pod("train-0", scheduler="0/2 nodes are available: 1 node(s) were unschedulable."),
                                              plugin_pod("gpu-a"), plugin_pod("gpu-b")])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "gpu_nodes_unschedulable", document
    assert "gpu-a cordoned by gpuharden, run harden-run-42" in document["verdict"]["summary"]
    assert "gpu-b tainted maintenance=true:NoSchedule by someone else" in document["verdict"]["summary"]
    assert document["verdict"]["finding_id"] == "node_left_cordoned" and any("-l gpu-a" in line for line in document["fix"])
    alone = cluster(nodes=[gpu_node("gpu-b", unschedulable=True)], pods=[pod("train-0", scheduler="unschedulable"), plugin_pod("gpu-b")])
    other = run(lib, alone, "pod ml/train-0")
    assert "cordoned by someone else" in other["verdict"]["summary"] and other["verdict"]["finding_id"] is None


def test_a_joining_node_under_gpuharden_s_bootstrap_taint(lib, cluster):
    joining = gpu_node("gpu-a", unschedulable=True, taints=[{"key": "gpuharden.io/bootstrap", "value": "pending", "effect": "NoSchedule"}])
    api = cluster(nodes=[joining], pods=[pod("train-0", scheduler="x"), plugin_pod("gpu-a")])
    document = run(lib, api, "pod ml/train-0")
    assert "gpu-a tainted gpuharden.io/bootstrap=pending:NoSchedule by gpuharden's bootstrap" in document["verdict"]["summary"]
    assert document["fix"][0].startswith("ansible-playbook -i INVENTORY gpuharden.k8s.bootstrap_gpu_node -l gpu-a")


def test_a_harden_run_s_cordon_and_a_joining_node_each_get_their_command(lib, cluster):
    record = json.dumps({"owner": "harden-run-7", "at": "2026-12-07T00:00:00Z", "for": "kubelet_topology"})
    ours = gpu_node("gpu-a", unschedulable=True, annotations={"gpuharden.io/cordon": record})
    joining = gpu_node("gpu-b", taints=[{"key": "gpuharden.io/bootstrap", "value": "pending", "effect": "NoSchedule"}])
    api = cluster(nodes=[ours, joining], pods=[pod("train-0", scheduler="x"), plugin_pod("gpu-a"), plugin_pod("gpu-b")])
    fix = run(lib, api, "pod ml/train-0")["fix"][0]
    assert "gpuharden.k8s.bootstrap_gpu_node -l gpu-b" in fix and "gpuharden.k8s.harden_gpu_nodes -l gpu-a" in fix, fix


def test_a_tolerated_taint_does_not_block(lib, cluster):
    tainted = gpu_node("gpu-a", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    api = cluster(nodes=[tainted], pods=[pod("train-0", scheduler="x", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]),
                                         plugin_pod("gpu-a")])
    assert run(lib, api, "pod ml/train-0")["verdict"]["cause"] != "gpu_nodes_unschedulable"


def test_a_running_pod_is_not_called_healthy_without_its_node_read(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", node_name="gpu-a", phase="Running", ready=True)])
    document = run(lib, api, "pod ml/train-0")
    assert document["state"] == "undecided" and len(api.requests) == 1 and document["node_trips"] == 0
    assert document["verdict"]["summary"].startswith("ml/train-0 is Running and Ready, but what its containers can open on gpu-a was not checked")
    assert "-i INVENTORY" in document["not_checked"][0]["fix"]


def test_a_running_pod_whose_node_audit_finds_nothing_against_it_is_healthy(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", node_name="gpu-a", phase="Running", ready=True)])
    other = finding("isolation_breach", pod="uid-someone-else", container="x", gpu=1)
    document = run(lib, api, "pod ml/train-0", report=drift_report({"gpu-a": [other]}))
    assert document["state"] == "healthy" and "the audit of node gpu-a finds nothing against it" in document["verdict"]["summary"]
    assert len(api.requests) == 1


def test_bound_pod_without_a_cluster_side_cause_names_the_node_check_it_did_not_make(lib, cluster):
    crashing = {"name": "main", "ready": False, "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"message": "Failed to initialize NVML: Unknown Error"}}}
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", node_name="gpu-a", phase="Running", container_statuses=[crashing]),
                                                   plugin_pod("gpu-a")])
    document = run(lib, api, "pod ml/train-0")
    assert document["state"] == "undecided" and document["not_checked"][0]["fix"].startswith("run again with -i INVENTORY")
    assert "Failed to initialize NVML: Unknown Error" in json.dumps(document["evidence"])
    assert explain.text(document).startswith("could not decide why ml/train-0 fails: node-side causes on gpu-a")


def test_a_pod_without_gpus_is_not_judged(lib, cluster):
    api = cluster(pods=[pod("web", {}, phase="Pending")])
    document = run(lib, api, "pod ml/web")
    assert document["state"] == "undecided" and "explain judges GPU pods" in document["not_checked"][0]["cause"]


# The cluster-side causes as the real components show them (tests/integration/test_explain.py reproduces each)

INCOMPATIBLE = "Incompatible strategy detected auto"


def runc_node(name, handlers=("", "runc")):
    """A GPU node that advertises nothing, whose containerd 2.x reports ``handlers`` (no nvidia: runc is its default)."""
    found = gpu_node(name, count=0)
    found["status"]["runtimeHandlers"] = [{"name": handler, "features": {}} for handler in handlers]
    return found


def crashing_plugin(node_name, runtime_class=None, running=False, message=None):
    """The real plugin as the kubelet reports it between two restarts: no termination message (terminationMessagePolicy
    File), exit code 1; ``running``: in the second it runs before it exits again (no readiness probe: Ready)."""
    found = plugin_pod(node_name, ready=running, waiting=None if running else "CrashLoopBackOff", restarts=4, last_message=message)
    found["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", **({"message": message} if message else {})}}
    if runtime_class:
        found["spec"]["runtimeClassName"] = runtime_class
    else:
        found["spec"].pop("runtimeClassName")
    return found


def pinned(name, node_name, limits=None):
    found = pod(name, limits, scheduler="0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector.")
    found["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    return found


def with_hostname(found):
    found["metadata"]["labels"]["kubernetes.io/hostname"] = found["metadata"]["name"]
    return found


def test_plugin_without_the_nvidia_runtime_on_the_node_a_pod_selects_names_the_container_runtime_stage(lib, cluster):
    api = cluster(nodes=[with_hostname(gpu_node("gpu-a", 8)), with_hostname(runc_node("gpu-runc"))],
                  pods=[pinned("train-0", "gpu-runc"), plugin_pod("gpu-a"), crashing_plugin("gpu-runc")])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "device_plugin_failing", document
    summary = document["verdict"]["summary"]
    assert "the device plugin on gpu-runc is CrashLoopBackOff (4 restarts)" in summary, summary
    assert "gpu-runc's containerd has no nvidia runtime (runtime handlers '', 'runc') and the plugin pod names no RuntimeClass" in summary
    assert any("--tags container_runtime,runtime_class,device_plugin -l gpu-runc" in line for line in document["fix"])
    assert {"what": "runtime handlers of gpu-runc", "where": "node gpu-runc status.runtimeHandlers", "value": ["", "runc"]} in document["evidence"]


def test_the_same_pod_without_its_selector_is_no_plugin_failure(lib, cluster):
    # gpu-a advertises nvidia.com/gpu: an unpinned pod is no question for gpu-runc's plugin
    api = cluster(nodes=[with_hostname(gpu_node("gpu-a", 8)), with_hostname(runc_node("gpu-runc"))],
                  pods=[pod("train-0", scheduler="0/2 nodes are available: 2 Insufficient nvidia.com/gpu."), plugin_pod("gpu-a"),
                        crashing_plugin("gpu-runc")])
    assert run(lib, api, "pod ml/train-0")["verdict"]["cause"] == "gpus_all_allocated"


def test_the_plugin_caught_running_between_two_restarts_is_still_failing(lib, cluster):
    api = cluster(nodes=[with_hostname(runc_node("gpu-runc"))], pods=[pinned("train-0", "gpu-runc"), crashing_plugin("gpu-runc", running=True)])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "device_plugin_failing", document
    assert "is restarting after exit code 1 (4 restarts)" in document["verdict"]["summary"]


def test_the_plugin_s_own_words_name_the_runtime_and_a_failure_with_the_nvidia_runtime_does_not(lib, cluster):
    words = cluster(nodes=[runc_node("gpu-a", handlers=("", "nvidia", "runc"))],
                    pods=[pod("train-0", node_name="gpu-a"), crashing_plugin("gpu-a", runtime_class="nvidia", message=INCOMPATIBLE)])
    document = run(lib, words, "pod ml/train-0")
    assert "(%s)" % INCOMPATIBLE in document["verdict"]["summary"] and "container_runtime,runtime_class,device_plugin" in document["fix"][0]
    other = cluster(nodes=[runc_node("gpu-a", handlers=("", "nvidia", "runc"))],
                    pods=[pod("train-0", node_name="gpu-a"), crashing_plugin("gpu-a", runtime_class="nvidia", message="invalid --device-list-strategy option")])
    document = run(lib, other, "pod ml/train-0")
    assert document["verdict"]["cause"] == "device_plugin_failing" and "--tags device_plugin -l gpu-a" in document["fix"][0]


def test_node_rule_names_the_runtime_stage_for_a_runc_node(lib, cluster):
    api = cluster(nodes=[runc_node("gpu-runc")], pods=[crashing_plugin("gpu-runc")])
    document = run(lib, api, "node gpu-runc")
    assert document["verdict"]["cause"] == "node_device_plugin_failing" and "container_runtime,runtime_class,device_plugin" in document["fix"][0]


def rejected(limits_by_container, init=None):
    found = pod("train-0", node_name="gpu-a", phase="Failed", reason="TopologyAffinityError",
                message="Pod was rejected: Resources cannot be allocated with Topology locality")
    found["spec"]["containers"] = [{"name": name, "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": str(count)}}}
                                   for name, count in limits_by_container]
    if init:
        found["spec"]["initContainers"] = [{"name": name, "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": str(count)}}}
                                           for name, count in init]
    return found


@pytest.mark.parametrize(("containers", "init", "admits", "why"), [
    # one container over one NUMA node: restricted takes the fewest NUMA nodes, best-effort admits every pod
    ([("main", 5)], None, ["topologyManagerPolicy: restricted", "topologyManagerPolicy: best-effort"], "container main asks for 5 GPUs"),
    # two containers that fit alone: scope container first (scope_container.go aligns each alone)
    ([("a", 4), ("b", 4)], None, ["topologyManagerScope: container", "topologyManagerPolicy: restricted", "topologyManagerPolicy: best-effort"],
     "its containers ask for 8 GPUs together (a 4 at most)"),
    # an init container's GPUs are not added to the app containers' (pod_gpus: the larger of the two)
    ([("main", 4)], [("warmup", 4)], ["topologyManagerPolicy: restricted", "topologyManagerPolicy: best-effort"], "asks for 4 GPUs"),
    # one GPU always fits one NUMA node: what did not align is the CPUs, memory or the free GPUs
    ([("main", 1)], None, ["topologyManagerPolicy: best-effort"], "which one NUMA node holds"),
])
def test_topology_affinity_error_names_the_settings_that_admit_the_pod(lib, cluster, containers, init, admits, why):
    api = cluster(nodes=[gpu_node("gpu-a", 8)], pods=[rejected(containers, init), plugin_pod("gpu-a")])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "admission_rejected", document
    summary = document["verdict"]["summary"]
    assert why in summary and summary.endswith(": %s admits it" % " or ".join(admits)), summary
    assert summary.startswith("the kubelet on gpu-a rejected the pod at admission: TopologyAffinityError (Pod was rejected:")
    for setting in admits:
        assert setting in document["fix"][0]
    assert "-e kubelet_topology_topology_manager_policy=best-effort" in document["fix"][0]


def test_all_allocated_does_not_hide_gpu_nodes_that_all_refuse_the_pod(lib, cluster):
    record = json.dumps({"owner": "harden@ctl", "at": "2026-12-07T00:00:00Z", "for": "kubelet_topology"})
    api = cluster(nodes=[gpu_node("gpu-a", unschedulable=True, annotations={"gpuharden.io/cordon": record}), runc_node("gpu-runc")],
                  pods=[pod("train-0", scheduler="0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."),
                        plugin_pod("gpu-a")])
    document = run(lib, api, "pod ml/train-0")
    assert document["verdict"]["cause"] == "gpu_nodes_unschedulable", document
    assert document["fix"][0].startswith("ansible-playbook -i INVENTORY gpuharden.k8s.harden_gpu_nodes -l gpu-a")


# ---------------------------------------------------------------------------------------------------------------
# explain node


def test_node_rules(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a"), gpu_node("gpu-b", count=0), gpu_node("gpu-c", count=0), gpu_node("gpu-d", unschedulable=True)],
                  pods=[plugin_pod("gpu-a"), plugin_pod("gpu-c", ready=False, waiting="CrashLoopBackOff", restarts=4, last_message=NVML_MESSAGE),
                        plugin_pod("gpu-d")])
    healthy = run(lib, api, "node gpu-a")
    assert healthy["state"] == "healthy" and "advertises nvidia.com/gpu=2" in healthy["verdict"]["summary"]
    assert run(lib, api, "node gpu-b")["verdict"]["cause"] == "node_no_device_plugin"
    failing = run(lib, api, "node gpu-c")
    assert failing["verdict"]["cause"] == "node_device_plugin_failing" and "container_runtime,runtime_class,device_plugin" in failing["fix"][0]
    cordoned = run(lib, api, "node gpu-d")
    assert cordoned["verdict"]["cause"] == "node_unschedulable" and "cordoned by someone else" in cordoned["verdict"]["summary"]


def test_node_with_a_ready_plugin_advertising_nothing_is_undecided(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a", count=0)], pods=[plugin_pod("gpu-a")])
    document = run(lib, api, "node gpu-a")
    assert document["state"] == "undecided" and document["not_checked"][0]["fix"] == "gpuharden drift -i INVENTORY -l gpu-a"


# ---------------------------------------------------------------------------------------------------------------
# --failing


def test_failing_lists_every_failing_gpu_pod_with_three_requests(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a"), gpu_node("gpu-b", count=0)], pods=[
        pod("typo", {"nvidia.com/gpus": "1"}), pod("ok", node_name="gpu-a", phase="Running", ready=True),
        pod("web", {}, phase="Pending"), pod("done", phase="Succeeded"),
        pod("rejected", node_name="gpu-a", phase="Failed", reason="TopologyAffinityError", message="numa"),
        plugin_pod("gpu-a"), plugin_pod("gpu-b", ready=False, waiting="CrashLoopBackOff", restarts=9, last_message=NVML_MESSAGE),
        pod("stuck", node_name="gpu-b")])
    document = run(lib, api, "--failing")
    causes = {entry["target"]["name"]: entry["verdict"]["cause"] for entry in document["pods"]}
    assert causes == {"ml/typo": "resource_not_advertised", "ml/rejected": "admission_rejected", "ml/stuck": "device_plugin_failing",
                      "kube-system/nvidia-device-plugin-gpu-b": "node_device_plugin_failing"}
    assert [path for path, _ in api.requests] == ["/api/v1/pods", "/api/v1/nodes"] and document["state"] == "cause"
    assert explain.text(document).splitlines()[0] == "4 failing GPU pod(s)"


# ---------------------------------------------------------------------------------------------------------------
# Three states, schema, exit codes


@pytest.mark.parametrize(("status", "kind"), [(401, "credentials"), (403, "forbidden")])
def test_rejected_credentials_are_not_checked_with_the_fix_first(lib, cluster, status, kind):
    from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s  # noqa: PLC0415

    api = cluster(status=status)
    document = run(lib, api, "pod ml/train-0")
    assert document["state"] == "undecided" and document["verdict"]["summary"].startswith("could not check ml/train-0")
    assert document["not_checked"][0]["fix"] == _k8s.ACCESS_FIXES[kind]
    lines = explain.text(document).splitlines()
    assert lines[0].startswith("could not check ml/train-0: gpuharden explain") and lines[2] == "    fix: " + _k8s.ACCESS_FIXES[kind]


def test_unreachable_api_server(lib):
    document = explain.explain(lib, {"kind": "node", "name": "gpu-a"}, {"host": "http://127.0.0.1:9", "api_key": "t", "request_timeout": 2})
    assert document["state"] == "undecided" and "cannot reach the API server" in document["not_checked"][0]["cause"]


def test_json_schema(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", {"nvidia.com/gpus": "1"})])
    document = run(lib, api, "pod ml/train-0")
    assert set(document) == {"schema", "target", "state", "verdict", "evidence", "fix", "not_checked", "api_requests", "api_retries", "node_trips",
                             "node_seconds"}
    assert document["schema"] == 1 and document["target"] == {"kind": "pod", "name": "ml/train-0"}
    assert set(document["verdict"]) == {"cause", "finding_id", "stage", "summary"}
    assert all(set(entry) == {"what", "where", "value"} for entry in document["evidence"]) and document["evidence"]
    assert all(isinstance(line, str) for line in document["fix"]) and document["fix"]
    assert json.loads(json.dumps(document)) == document


def kubeconfig(tmp_path, url):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                                "clusters": [{"name": "k", "cluster": {"server": url}}],
                                "users": [{"name": "u", "user": {"token": "t"}}],
                                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return str(path)


def cli_run(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_exit_codes_through_the_command(lib, cluster, tmp_path, capsys):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("typo", {"nvidia.com/gpus": "1"}), pod("ok", node_name="gpu-a", phase="Running", ready=True),
                                                   plugin_pod("gpu-a")])
    config = kubeconfig(tmp_path, api.url)
    code, out, _ = cli_run(["explain", "pod", "ml/typo", "-e", "gpuharden_kubeconfig=%s" % config], capsys)
    assert code == 1 and "did you mean nvidia.com/gpu?" in out.splitlines()[0]
    code, out, _ = cli_run(["explain", "pod", "ml/ok", "--kubeconfig", config, "--json"], capsys)
    assert code == 4 and json.loads(out)["state"] == "undecided"  # its node was not read
    report = tmp_path / "report.json"
    report.write_text(json.dumps(drift_report({"gpu-a": []})))
    code, out, _ = cli_run(["explain", "pod", "ml/ok", "--kubeconfig", config, "--json", "--from-report", str(report)], capsys)
    assert code == 0 and json.loads(out)["state"] == "healthy"
    code, _, err = cli_run(["explain", "pod", "ml/ok", "--kubeconfig", config, "--from-report", str(report), "-i", str(report)], capsys)
    assert code == 2 and "not both" in err
    code, _, err = cli_run(["explain", "pod", "ml/ok", "--kubeconfig", config, "--host", "h"], capsys)
    assert code == 2 and "give -i INVENTORY too" in err
    code, _, err = cli_run(["explain", "pod", "ml/missing", "--kubeconfig", config], capsys)
    assert code == 2 and "pod ml/missing: no such pod" in err
    code, _, err = cli_run(["explain", "pod", "no-namespace", "--kubeconfig", config], capsys)
    assert code == 2 and "NAMESPACE/NAME" in err
    code, _, err = cli_run(["explain", "--kubeconfig", config], capsys)
    assert code == 2 and "--failing" in err
    code, out, _ = cli_run(["explain", "--failing", "--kubeconfig", str(tmp_path / "nope")], capsys)
    assert code == 4 and out.startswith("could not check the failing GPU pods: k8s auth: option kubeconfig=")


def test_explain_is_a_subcommand_with_documented_exit_codes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["explain", "--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out and "4    could not decide" in out


def test_text_output_order(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a", count=0)], pods=[pod("train-0", node_name="gpu-a"),
                                                            plugin_pod("gpu-a", ready=False, waiting="CrashLoopBackOff", restarts=1,
                                                                       last_message=NVML_MESSAGE)])
    lines = explain.text(run(lib, api, "pod ml/train-0")).splitlines()
    assert lines[0].startswith("ml/train-0: requests nvidia.com/gpu, but the device plugin on gpu-a is CrashLoopBackOff")
    assert lines.index("  evidence:") < lines.index("  fix:")
    assert io.StringIO  # the text goes to the stream main() is given


def test_every_rule_is_tested_and_maps_to_the_catalogue(lib):
    """The rules are data: each has a test here that fires it (its id asserted), and its finding id is the catalogue's."""
    source = Path(__file__).read_text(encoding="utf-8")
    rules = lib.rules.POD_RULES + lib.rules.NODE_RULES + lib.rules.NODE_SIDE_POD_RULES + lib.rules.NODE_SIDE_NODE_RULES
    assert len({rule.id for rule in rules}) == len(rules)
    node_side = set(lib.rules.NODE_SIDE_POD_RULES + lib.rules.NODE_SIDE_NODE_RULES)
    for rule in rules:
        assert '== "%s"' % rule.id in source, "no test fires rule %s" % rule.id
        assert set(rule.needs) <= set(lib.rules.EVIDENCE)
        # the cluster-side tables never read the node: a cause the cluster shows costs no trip
        assert rule.needs_node_trip is (rule in node_side) and ("node_audit" in rule.needs) is (rule in node_side)
        if rule.finding_id:
            assert lib.findings.stage_of(rule.finding_id) is not None or rule.finding_id in lib.findings.CATALOGUE


# ---------------------------------------------------------------------------------------------------------------
# Node-side causes: the node's audit (one drift check of it, or a drift report) weighed for the pod


def finding(ident, severity="error", **context):
    return dict({"id": ident, "check": "device_cgroups", "severity": severity, "expected": "e", "found": "f", "hint": "h", "remediable": False},
                **context)


def drift_report(findings_by_node, checks=None, unreachable=None):
    read = {"device_cgroups": {"status": "ok", "details": {"allocation_source": "pod-resources", "pod_resources": {"reason": None}}}}
    nodes = {name: {"node": name, "status": "attention" if found else "clean", "findings": found, "not_checked": [], "refused": [],
                    "checks": dict(read, **(checks or {}).get(name, {}))} for name, found in findings_by_node.items()}
    return {"version": 1, "nodes": nodes, "unreachable": unreachable or {}, "failed": {},
            "node_names": {name: name for name in list(findings_by_node) + list(unreachable or {})}}


class FakeTrip:
    """A NodeTrip that answers from a drift report and counts its trips (no Ansible)."""

    def __init__(self, report):
        self.report, self.trips, self.seconds, self.inventory, self.host = report, 0, 0.0, "inv.yml", None

    def audit(self, node):
        self.trips += 1
        return explain.node_audit_of(self.report, node, "gpuharden drift -i inv.yml -l %s" % node)

    def run(self, limit):
        self.trips += 1
        return self.report


def sneaky_pod(name="sneaky", env=True, runtime_class="nvidia"):
    sneaky = pod(name, {}, node_name="gpu-a", phase="Running", ready=True, runtime_class=runtime_class)
    if env:
        sneaky["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return sneaky


def test_a_pod_without_a_gpu_request_that_can_open_gpus(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[sneaky_pod()])
    seen = finding("visible_devices_without_request", check="consistency", pod={"namespace": "ml", "name": "sneaky", "uid": "uid-sneaky"},
                   found={"containers": {"main": "all"}})
    document = run(lib, api, "pod ml/sneaky", trip=FakeTrip(drift_report({"gpu-a": [seen]})))
    assert document["verdict"]["cause"] == "gpu_access_without_request" and document["verdict"]["finding_id"] == "visible_devices_without_request"
    assert "requests no GPU, yet its container main can open GPUs (NVIDIA_VISIBLE_DEVICES=all)" in document["verdict"]["summary"]
    assert "the pod sets NVIDIA_VISIBLE_DEVICES itself" in document["verdict"]["summary"] and document["node_trips"] == 1
    assert "remove NVIDIA_VISIBLE_DEVICES" in document["fix"][0]
    # the same pod on a node whose audit names another pod: nothing against it
    other = dict(seen, pod={"namespace": "ml", "name": "other", "uid": "uid-other"})
    assert run(lib, api, "pod ml/sneaky", report=drift_report({"gpu-a": [other]}))["state"] == "healthy"


def test_a_pod_without_a_request_on_a_node_whose_default_runtime_is_nvidia(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[sneaky_pod("web", env=False, runtime_class=None)])
    breach = finding("gpu_access", severity="info", pod="UID-WEB", container="main", gpu=0, gpu_uuid="GPU-0")
    checks = {"gpu-a": {"containerd": {"status": "ok", "details": {"runtime_name": "nvidia", "default_runtime_name": "nvidia"}}}}
    document = run(lib, api, "pod ml/web", report=drift_report({"gpu-a": [breach]}, checks))
    assert document["verdict"]["cause"] == "gpu_access_without_request" and "containerd's default runtime" in document["verdict"]["summary"]
    assert "default_runtime_name" in document["fix"][0]


def test_a_pod_that_can_open_another_pods_gpu(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("greedy", node_name="gpu-a", phase="Running", ready=True)])
    shared = finding("device_used_by_other_container", severity="critical", check="consistency", container="main", gpu=1,
                     pod={"namespace": "ml", "name": "greedy", "uid": "uid-greedy"}, found={"device": "GPU-1", "allocated_to": ["ml/train-1/main"]})
    document = run(lib, api, "pod ml/greedy", report=drift_report({"gpu-a": [shared]}))
    assert document["verdict"]["cause"] == "another_pods_gpu" and "allocated to ml/train-1/main" in document["verdict"]["summary"]
    assert document["state"] == "cause"
    # a pod without a GPU request is the other rule's
    assert lib.rules.other_pods_gpu(explain.Facts(None, pod=pod("x", {}), node_audit={"state": "checked", "findings": [shared]})) is None


def test_a_container_whose_device_program_no_longer_grants_its_gpu(lib, cluster):
    crashing = {"name": "main", "ready": False, "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"message": "Failed to initialize NVML: Unknown Error"}}}
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", node_name="gpu-a", phase="Running", container_statuses=[crashing]),
                                                   plugin_pod("gpu-a")])
    lost = finding("broken_allocation", pod="uid-train-0", container="main", gpu=0, gpu_uuid="GPU-0", device="/dev/nvidia0")
    document = run(lib, api, "pod ml/train-0", report=drift_report({"gpu-a": [lost]}))
    assert document["verdict"]["cause"] == "device_program_revoked" and "can no longer open GPU 0 (GPU-0)" in document["verdict"]["summary"]
    assert any("--tags device_permissions -l gpu-a" in line for line in document["fix"])


def test_an_unhealthy_gpu_allocated_to_the_pod(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", node_name="gpu-a", phase="Running", ready=True)])
    ecc = finding("ecc_uncorrectable", check="nvml", gpu={"index": 1, "uuid": "GPU-1"}, hint="drain the node and reset the GPU")

    def report(allocated):
        answer = [{"namespace": "ml", "name": "train-0", "containers": [{"name": "main", "devices": [
            {"resource_name": "nvidia.com/gpu", "device_ids": [allocated]}]}]}]
        report = drift_report({"gpu-a": [ecc]})
        report["nodes"]["gpu-a"]["pod_resources"] = answer
        return report

    document = run(lib, api, "pod ml/train-0", report=report("GPU-1"))
    assert document["verdict"]["cause"] == "allocated_gpu_unhealthy" and document["verdict"]["finding_id"] == "ecc_uncorrectable"
    assert "GPU 1 (GPU-1) on gpu-a, allocated to the pod, is unhealthy: ecc_uncorrectable" in document["verdict"]["summary"]
    assert run(lib, api, "pod ml/train-0", report=report("GPU-0"))["state"] == "healthy"


def test_device_node_permissions_and_nvml_and_stale_checkpoints_on_a_failing_pod(lib, cluster):
    crashing = {"name": "main", "ready": False, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    failing = pod("train-0", node_name="gpu-a", phase="Running", container_statuses=[crashing])
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[failing, plugin_pod("gpu-a"), pod("ok", node_name="gpu-a", phase="Running", ready=True)])
    perms = finding("device_node_permissions", check="device_nodes", path="/dev/nvidia0", found="0600 root:root", remediable=True)
    assert run(lib, api, "pod ml/train-0", report=drift_report({"gpu-a": [perms]}))["verdict"]["cause"] == "device_permissions"
    # a GPU pod Running and Ready is affected too (its CUDA calls fail, not its container); a pod without GPUs is not
    assert run(lib, api, "pod ml/ok", report=drift_report({"gpu-a": [perms]}))["verdict"]["cause"] == "device_permissions"
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[sneaky_pod("web", env=False, runtime_class="nvidia")])
    assert run(lib, api, "pod ml/web", report=drift_report({"gpu-a": [perms]}))["state"] == "healthy"
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[failing, plugin_pod("gpu-a")])
    nvml = finding("nvml_init_failed", check="nvml", found="Driver Not Loaded", hint="load the driver")
    assert run(lib, api, "pod ml/train-0", report=drift_report({"gpu-a": [nvml]}))["verdict"]["cause"] == "nvml_unusable"
    stale = finding("kubelet_stale_checkpoint", check="kubelet", path="/var/lib/kubelet/cpu_manager_state", found="policy none")
    pending = pod("waiting", node_name="gpu-a")
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pending, plugin_pod("gpu-a")])
    document = run(lib, api, "pod ml/waiting", report=drift_report({"gpu-a": [stale]}))
    assert document["verdict"]["cause"] == "stale_checkpoint" and "/var/lib/kubelet/cpu_manager_state" in document["verdict"]["summary"]
    assert "--tags kubelet_topology -l gpu-a" in document["fix"][0]


def test_a_cause_the_cluster_shows_costs_no_trip_and_a_node_side_one_costs_one(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("typo", {"nvidia.com/gpus": "1"}), pod("train-0", node_name="gpu-a", phase="Running", ready=True)])
    trip = FakeTrip(drift_report({"gpu-a": []}))
    assert run(lib, api, "pod ml/typo", trip=trip)["node_trips"] == 0
    assert run(lib, api, "pod ml/train-0", trip=trip)["node_trips"] == 1


def test_a_node_the_run_could_not_audit_is_not_checked(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", node_name="gpu-a", phase="Running", ready=True)])
    document = run(lib, api, "pod ml/train-0", report=drift_report({}, unreachable={"gpu-a": "ssh: connect refused"}))
    assert document["state"] == "undecided" and "host gpu-a unreachable: ssh: connect refused" in document["not_checked"][0]["cause"]
    document = run(lib, api, "pod ml/train-0", report=drift_report({"gpu-b": []}))
    assert document["state"] == "undecided" and "--host HOST" in document["not_checked"][0]["fix"]


def test_explain_node_with_its_audit(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[plugin_pod("gpu-a")])
    drifted = finding("kubelet_setting", check="kubelet", stage="kubelet_topology", remediable=True, hint="the kubelet reads x")
    document = run(lib, api, "node gpu-a", report=drift_report({"gpu-a": [drifted, finding("gpu_access", severity="info")]}))
    assert document["verdict"]["cause"] == "node_audit_findings" and "--tags kubelet_topology -l gpu-a" in document["fix"][0]
    assert "1 finding(s): kubelet_setting" in document["verdict"]["summary"]
    clean = run(lib, api, "node gpu-a", report=drift_report({"gpu-a": [finding("gpu_access", severity="info")]}))
    assert clean["state"] == "healthy" and "its audit finds nothing above info" in clean["verdict"]["summary"]


def test_failing_with_the_nodes_audits_lists_the_pods_they_flag(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[sneaky_pod(), pod("ok", node_name="gpu-a", phase="Running", ready=True), plugin_pod("gpu-a"),
                                                   pod("typo", {"nvidia.com/gpus": "1"})])
    seen = finding("visible_devices_without_request", check="consistency", pod={"namespace": "ml", "name": "sneaky", "uid": "uid-sneaky"},
                   found={"containers": {"main": "all"}})
    trip = FakeTrip(drift_report({"gpu-a": [seen]}))
    document = run(lib, api, "--failing", trip=trip)
    causes = {entry["target"]["name"]: entry["verdict"]["cause"] for entry in document["pods"]}
    assert causes == {"ml/sneaky": "gpu_access_without_request", "ml/typo": "resource_not_advertised"} and document["node_trips"] == 1
    # without the nodes' audits, the Running pod is not listed (nothing flags it) and no node is read
    assert {entry["target"]["name"] for entry in run(lib, api, "--failing")["pods"]} == {"ml/typo"}


def test_a_drift_report_carries_the_failing_pods_of_its_nodes_and_never_fails_the_run(lib, cluster, tmp_path):
    api = cluster(nodes=[gpu_node("gpu-a"), gpu_node("gpu-b")],
                  pods=[sneaky_pod(), pod("elsewhere", {"nvidia.com/gpus": "1"}, node_name="gpu-b", phase="Pending"), pod("typo", {"nvidia.com/gpus": "1"})])
    seen = finding("visible_devices_without_request", check="consistency", pod={"namespace": "ml", "name": "sneaky", "uid": "uid-sneaky"},
                   found={"containers": {"main": "all"}})
    report = drift_report({"gpu-a": [seen]})
    document = explain.for_drift_report(report, {"gpuharden_kubeconfig": kubeconfig(tmp_path, api.url), "gpuharden_run_owner": "x"})
    # gpu-b was not in the run: its pod is left out; the pending pod is in
    assert {entry["target"]["name"]: entry["verdict"]["cause"] for entry in document["pods"]} == {
        "ml/sneaky": "gpu_access_without_request", "ml/typo": "resource_not_advertised"}
    assert document["target"] == {"kind": "failing"} and document["api_requests"] == 2
    blind = explain.for_drift_report(report, {"gpuharden_kubeconfig": str(tmp_path / "missing")})
    assert blind["state"] == "undecided" and blind["pods"] == [] and "kubeconfig" in blind["not_checked"][0]["cause"]


def test_a_running_gpu_pod_whose_allocation_the_audit_could_not_read_is_not_called_healthy(lib, cluster):
    api = cluster(nodes=[gpu_node("gpu-a")], pods=[pod("train-0", node_name="gpu-a", phase="Running", ready=True), plugin_pod("gpu-a")])
    blind = {"gpu-a": {"device_cgroups": {"status": "ok", "details": {
        "allocation_source": "none", "pod_resources": {"reason": "pod-resources API not available: kubelet.sock: No such file or directory"}}}}}
    document = run(lib, api, "pod ml/train-0", report=drift_report({"gpu-a": []}, blind))
    assert document["state"] == "undecided" and "pod-resources API not available" in document["verdict"]["summary"]
    assert "can open only the GPUs" in document["not_checked"][0]["what"]
    # --failing does not list it (it is not failing, and nothing flags it), but says what was not checked
    failing = run(lib, api, "--failing", report=drift_report({"gpu-a": []}, blind))
    assert failing["pods"] == [] and failing["state"] == "undecided" and "ml/train-0" in failing["not_checked"][0]["what"]


def test_failing_lists_a_plugin_pod_stopped_by_its_nodes_kubelet(lib, cluster):
    pending = plugin_pod("gpu-a", ready=False)
    pending["status"] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}], "containerStatuses": []}
    api = cluster(nodes=[gpu_node("gpu-a", count=0)], pods=[pending])
    stale = finding("kubelet_stale_checkpoint", check="kubelet", path="/var/lib/kubelet/cpu_manager_state", found="policy none")
    document = run(lib, api, "--failing", report=drift_report({"gpu-a": [stale]}))
    assert [entry["verdict"]["cause"] for entry in document["pods"]] == ["stale_checkpoint"]
    assert document["pods"][0]["target"] == {"kind": "pod", "name": "kube-system/nvidia-device-plugin-gpu-a", "node": "gpu-a"}


def test_a_trip_to_a_node_the_inventory_cannot_reach_is_not_checked_with_its_fix(tmp_path):
    trip = explain.NodeTrip(str(tmp_path / "missing.yml"))
    audit = trip.audit("gpu-a")
    assert audit["state"] == "not_checked" and "does not exist" in audit["cause"] and trip.trips == 0
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        other-node: {ansible_connection: local}\n")
    audit = explain.NodeTrip(str(inventory), timeout=60).audit("gpu-a")
    # no host of the inventory is gpu-a: the drift check ran on no host, and says so
    assert audit["state"] == "not_checked" and "--host HOST" in audit["fix"], audit


def test_the_trips_cluster_context_holds_for_the_trip_only(tmp_path, monkeypatch):
    """The play and drift's own cluster check read the context from K8S_AUTH_CONTEXT: set for the trip, then put back."""
    monkeypatch.setenv("K8S_AUTH_CONTEXT", "the-users")
    seen = []
    monkeypatch.setattr(explain.drift_check, "check", lambda *args, **kwargs: seen.append(os.environ.get("K8S_AUTH_CONTEXT")) or {})
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all: {}\n")
    explain.NodeTrip(str(inventory), auth={"context": "explains"}).run("gpu-a")
    assert seen == ["explains"] and os.environ["K8S_AUTH_CONTEXT"] == "the-users"
    monkeypatch.delenv("K8S_AUTH_CONTEXT")
    explain.NodeTrip(str(inventory), auth={"context": "explains"}).run("gpu-a")
    assert seen[-1] == "explains" and "K8S_AUTH_CONTEXT" not in os.environ
    # no context of its own: the trip leaves the environment's as it is
    monkeypatch.setenv("K8S_AUTH_CONTEXT", "the-users")
    explain.NodeTrip(str(inventory)).run("gpu-a")
    assert seen[-1] == "the-users"
