# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden drift runs the consistency check in its own Python (gpuharden/cluster_side.py): the play's hand-over
(gpu_consistency's options and the node reports, as facts) reaches the report, the collection's one check function
(module_utils/cluster/_consistency_run.py, the module's too) runs against an API (the pods from the play's snapshot,
not listed again) and says it ran in the controller process, and a check that cannot run is said so."""

from __future__ import annotations

import json
import os
import threading
from http.server import ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_snapshot

from gpuharden import cluster_side, drift_check, drift_report
from tests.unit.conftest import COLLECTIONS, JsonHandler


def _drift_play(host, **result):
    return {"event": "runner_on_ok", "event_data": {"host": host, "task_action": "gpuharden.k8s.drift_play", "task": "t",
                                                      "res": result}}


def _audit(host):
    return {"event": "runner_on_ok", "event_data": {"host": host, "task_action": "gpuharden.k8s.node_audit", "task": "Audit",
                                                      "res": {"findings": [], "summary": {"findings": 0}, "checks": {}, "seconds": 0.1}}}


def _node(name, gpus):
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
            "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "allocatable": {"nvidia.com/gpu": str(gpus)}}}


def _report_of(gpus):
    return {"gpu_count": gpus, "gpus": [{"index": index, "uuid": "GPU-%d" % index, "minor": index, "mig": None, "processes": []}
                                        for index in range(gpus)], "processes": []}


class FakeRunner:
    def __init__(self, result=None, error=None, access=None):
        self.result, self.error, self.access, self.calls = result, error, access, []

    def run(self, options, node_reports):
        self.calls.append((options, node_reports))
        if self.error:
            raise cluster_side.ClusterSideError(self.error, access=self.access)
        return self.result


def _handed_over(options):
    outcomes = drift_report.Outcomes()
    for host in ("gpu-a", "gpu-b"):
        outcomes.feed(_audit(host))
    outcomes.feed(_drift_play("gpu-a", consistency_options=options, node_reports={"gpu-a": _report_of(1)}))
    return outcomes


def test_the_hand_over_reaches_the_check_and_its_findings_the_report():
    options = {"kubeconfig": None, "nodes": ["gpu-a"], "pods_snapshot": "/tmp/x", "runtime_class": {"name": "nvidia"}}
    outcomes = _handed_over(options)
    finding = {"id": "gpu_not_advertised", "severity": "error", "check": "consistency", "stage": "device_plugin",
               "remediable": True, "expected": 1, "found": 0, "hint": "h", "node": "gpu-b"}
    runner = FakeRunner({"findings": [finding], "runtime_class_check": {"changed": True, "findings": [], "action": "create",
                                                                        "runtime_class": {"metadata": {"name": "nvidia"}}},
                         "api_retries": 4})
    drift_check.run_cluster_side(runner, outcomes)
    assert runner.calls == [(options, {"gpu-a": _report_of(1)})]
    report = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0)
    assert report["cluster"]["consistency_checked"] and report["cluster"]["runtime_class_checked"]
    assert report["cluster"]["ran_in"] == "controller process" and report["cluster"]["api_retries"] == 4
    assert [entry["id"] for entry in report["nodes"]["gpu-b"]["findings"]] == ["gpu_not_advertised"]
    assert [entry["id"] for entry in report["cluster"]["findings"]] == ["runtime_class_differs"]


def test_a_check_that_cannot_run_is_not_checked_with_its_cause_and_fix_and_no_finding():
    outcomes = _handed_over({"nodes": ["gpu-a"], "runtime_class": {"name": "nvidia"}})
    access = {"kind": "kubeconfig", "fix": "give the controller a readable kubeconfig"}
    drift_check.run_cluster_side(FakeRunner(error="k8s auth: cannot load kubeconfig /nope", access=access), outcomes)
    report = drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0)
    assert report["cluster"]["consistency_error"] == "k8s auth: cannot load kubeconfig /nope"
    assert not report["cluster"]["consistency_checked"]
    # could not check: never a finding (neither drift nor clean), the cause and the fix for both checks
    assert report["cluster"]["findings"] == []
    blind = {"state": "not_checked", "cause": "k8s auth: cannot load kubeconfig /nope", "fix": access["fix"]}
    assert report["cluster"]["checks"] == {"consistency": blind, "runtime_class": blind}
    assert report["summary"]["cluster_not_checked"] == ["consistency", "runtime_class"]
    assert drift_report.exit_code(report) == drift_report.EXIT_NOT_CHECKED


def test_without_a_runtime_class_option_a_failure_adds_no_runtime_class_finding():
    outcomes = _handed_over({"nodes": ["gpu-a"], "runtime_class": None})
    drift_check.run_cluster_side(FakeRunner(error="boom"), outcomes)
    assert outcomes.runtime_class is None and outcomes.consistency_error == "boom"


def test_a_signal_or_the_timeout_during_the_check_leaves_the_outcomes_untouched():
    release = threading.Event()

    class Hanging(FakeRunner):
        def run(self, options, node_reports):
            release.wait(5)
            return {"findings": [{"id": "late", "node": "gpu-a"}]}

    outcomes = _handed_over({"nodes": ["gpu-a"], "runtime_class": {"name": "nvidia"}})
    asked = []
    drift_check.run_cluster_side(Hanging(), outcomes, interrupted=lambda: asked.append(1) or len(asked) > 2, poll=0.01)
    release.set()
    assert len(asked) == 3 and outcomes.consistency is None and outcomes.consistency_error is None and outcomes.runtime_class is None


class NodesApi:
    """GET /api/v1/nodes (one page); every request is recorded, anything else is 404."""

    def __init__(self, nodes):
        self.nodes, self.requests = nodes, []
        api = self

        class Handler(JsonHandler):
            def do_GET(self):
                api.requests.append(urlparse(self.path).path)
                if urlparse(self.path).path != "/api/v1/nodes":
                    return self.send_json(404, {"kind": "Status", "message": "not found"})
                return self.send_json(200, {"kind": "NodeList", "metadata": {"continue": ""}, "items": api.nodes})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collection():
    module, error_type = cluster_side.import_check(str(COLLECTIONS))
    return module, error_type


def test_the_module_s_own_code_runs_here_with_the_play_s_pods(collection):
    api = NodesApi([_node("gpu-a", 2), _node("gpu-b", 0)])
    pod = {"metadata": {"name": "train", "namespace": "default", "uid": "u1"}, "spec": {"nodeName": "gpu-a", "containers": [
        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]}, "status": {"phase": "Running"}}
    snapshot = _k8s_snapshot.write("pods", [_consistency.project_pod(pod)])
    try:
        result = cluster_side.check(*collection, {"host": "http://127.0.0.1:%d" % api.server.server_address[1], "api_key": "t",
                                                  "context": None, "nodes": ["gpu-a", "gpu-b"], "pods_snapshot": snapshot},
                                    {"gpu-a": _report_of(4), "gpu-b": _report_of(1)})
    finally:
        api.close()
    found = {(entry["node"], entry["id"]) for entry in result["findings"]}
    # gpu-a: NVML (the node report) sees 4 GPUs, the Node advertises 2, its pod asks for 3
    assert {("gpu-b", "gpu_not_advertised"), ("gpu-a", "gpu_partially_advertised"), ("gpu-a", "allocated_exceeds_declared")} <= found, found
    # the pods came from the play's LIST: only the Nodes were listed here, and the snapshot was read once
    assert api.requests == ["/api/v1/nodes"] and result["api_requests"]["pods"] == 0
    assert not os.path.exists(os.path.dirname(snapshot))
    assert json.loads(json.dumps(result)) == result
    assert result["ran_in"] == "controller process"
    # as _module_shell adds it to the module's result: this fake API server throttles nothing
    assert result["api_retries"] == 0


@pytest.mark.parametrize(("options", "named"), [
    ({"nodes": ["a"], "page_limit": "many"}, "page_limit"),
    ({"nodes": ["a"], "bogus": 1}, "bogus"),
    ({"nodes": ["a"], "page_limit": 0, "host": "http://127.0.0.1:9"}, "page_limit=0"),
    ("not a dict", "consistency_options"),
])
def test_bad_options_are_an_error_that_names_them(collection, options, named):
    with pytest.raises(cluster_side.ClusterSideError) as caught:
        cluster_side.check(*collection, options, {})
    assert named in str(caught.value)


def test_the_collection_is_found_where_ansible_looks_and_only_there(tmp_path):
    assert cluster_side.collection_base([str(tmp_path), str(COLLECTIONS)]) == str(COLLECTIONS)
    assert cluster_side.collection_base([str(tmp_path)]) is None


def test_a_check_imported_from_another_copy_is_refused(tmp_path):
    copy = tmp_path / cluster_side.CHECK_FILE
    copy.parent.mkdir(parents=True)
    copy.write_text("")
    # the check is already imported from the checkout: a second collection below tmp_path would not be the one run
    cluster_side.import_check(str(COLLECTIONS))
    with pytest.raises(cluster_side.ClusterSideError) as caught:
        cluster_side.import_check(str(tmp_path))
    assert "not from" in str(caught.value)
