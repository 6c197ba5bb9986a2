# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 45 item 2: one cluster check, two ways for `gpuharden drift` to run it, one report.

The collection's consistency check is one function (module_utils/cluster/_consistency_run.py, consistency_check):
the gpu_consistency module calls it, and `gpuharden drift` calls it in its own process from the play's hand-over
(cluster_side.Runner).  Here both paths run that real function against one fake API server, their results reach the
report the way each reaches it in a run (a module's runner event; run_cluster_side), and the two reports are compared
field by field (tests/drift_parity.py): equal but for cluster.ran_in and the timings.  Then one path is broken on
purpose (a finding dropped) and the comparison must name the difference.  The lab test
(tests/integration/test_drift_parity.py) does the same over a real play and API server.
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency_run

from gpuharden import cluster_side, drift_check, drift_report
from tests.drift_parity import IGNORED, differences
from tests.unit.conftest import COLLECTIONS, JsonHandler
from tests.unit.test_drift_cluster_side import _node, _report_of

POD = {"metadata": {"name": "train", "namespace": "default", "uid": "u1"},
       "spec": {"nodeName": "gpu-a", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]},
       "status": {"phase": "Running"}}
# gpu-a: NVML sees 4 GPUs, the Node advertises 2, its pod asks for 3; gpu-b advertises none of its 1
NODE_REPORTS = {"gpu-a": _report_of(4), "gpu-b": _report_of(1)}


@pytest.fixture
def api():
    """A fake API server with two GPU Nodes and one pod (one page each)."""
    class Handler(JsonHandler):
        def do_GET(self):
            path = urlparse(self.path).path
            if path == "/api/v1/nodes":
                return self.send_json(200, {"kind": "NodeList", "metadata": {"continue": ""}, "items": [_node("gpu-a", 2), _node("gpu-b", 0)]})
            if path == "/api/v1/pods":
                return self.send_json(200, {"kind": "PodList", "metadata": {"continue": ""}, "items": [POD]})
            return self.send_json(404, {"kind": "Status", "message": "not found"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield "http://127.0.0.1:%d" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _event(host, action, result):
    return {"event": "runner_on_ok", "event_data": {"host": host, "task_action": action, "task": "t", "res": result}}


def _play(options):
    """The play's events both paths share: the Node names (drift_play's start step), a node_audit per host, and the
    hand-over (its cluster step under `gpuharden drift`: the consistency check's options and the node reports)."""
    events = []
    events.append(_event("gpu-a", "gpuharden.k8s.drift_play", {"node_names": {"gpu-a": "gpu-a", "gpu-b": "gpu-b"}, "nodes": ["gpu-a", "gpu-b"]}))
    for host in ("gpu-a", "gpu-b"):
        events.append(_event(host, "gpuharden.k8s.node_stages", {"findings": [], "summary": {"findings": 0}, "checks": {}, "seconds": 0.1}))
    events.append(_event("gpu-a", "gpuharden.k8s.drift_play", {"consistency": None, "consistency_options": options, "node_reports": NODE_REPORTS,
                                                               "runtime_class": None, "api_retries": 0}))
    return events


def _report(outcomes):
    return drift_report.build_report(outcomes, inventory="inv", limit=None, fail_severity="warning", started=1.0, finished=2.0,
                                     node_names=outcomes.node_names)


def module_path_report(options):
    """The report as when the play runs the gpu_consistency module: the module's main() calls consistency_check with
    its validated options and RAN_IN_MODULE; its result reaches drift in the drift_play cluster step's runner event."""
    outcomes = drift_report.Outcomes()
    for event in _play(options)[:-1]:
        outcomes.feed(event)
    # the cluster step's module run (plugins/action/drift_play.py): gpu_consistency's result inside the step's
    result = _consistency_run.consistency_check_of_options(options, NODE_REPORTS, _consistency_run.RAN_IN_MODULE)
    identity = {"kubeconfig": options.get("kubeconfig"), "context": options.get("context")}
    outcomes.feed(_event("gpu-a", "gpuharden.k8s.drift_play", {"consistency": result, "consistency_options": None, "node_reports": None,
                                                               "consistency_identity": identity, "runtime_class": None,
                                                               "api_retries": result["api_retries"]}))
    return _report(outcomes)


def in_process_report(options):
    """The report as `gpuharden drift` makes it by default: the hand-over, then the check here (cluster_side.Runner)."""
    outcomes = drift_report.Outcomes()
    for event in _play(options):
        outcomes.feed(event)
    drift_check.run_cluster_side(cluster_side.Runner(str(COLLECTIONS)), outcomes)
    return _report(outcomes)


def test_the_cli_s_ran_in_names_are_the_collection_s():
    assert (drift_report.RAN_IN_MODULE, drift_report.RAN_IN_CONTROLLER) == (_consistency_run.RAN_IN_MODULE, _consistency_run.RAN_IN_CONTROLLER)


def test_both_paths_give_the_same_report_but_for_where_the_check_ran(api):
    options = {"host": api, "api_key": "t", "kubeconfig": None, "context": None, "nodes": ["gpu-a", "gpu-b"]}
    module, here = module_path_report(options), in_process_report(options)
    assert module["cluster"]["ran_in"] == "module" and here["cluster"]["ran_in"] == "controller process"
    found = {(host, entry["id"]) for host, node in here["nodes"].items() for entry in node["findings"]}
    assert {("gpu-b", "gpu_not_advertised"), ("gpu-a", "gpu_partially_advertised"), ("gpu-a", "allocated_exceeds_declared")} <= found
    assert differences(module, here) == []
    # ran_in is ignored by name, nothing else of the cluster section
    assert differences(module, here, ignored={}) == ["cluster.ran_in: 'module' != 'controller process'"]


def test_a_finding_one_path_drops_is_a_difference(api, monkeypatch):
    """The demonstration the issue asks for: break the in-process path on purpose (its check loses gpu-b's finding) and
    the comparison names the field."""
    real = cluster_side.check

    def drops_a_finding(*args):
        result = real(*args)
        return dict(result, findings=[entry for entry in result["findings"] if entry["node"] != "gpu-b"])

    monkeypatch.setattr(cluster_side, "check", drops_a_finding)
    options = {"host": api, "api_key": "t", "nodes": ["gpu-a", "gpu-b"]}
    found = differences(module_path_report(options), in_process_report(options))
    assert "nodes.gpu-b.findings: 1 != 0 entries" in found, found
    assert any(line.startswith(("nodes.gpu-b.status: 'drift' != ", "summary.")) for line in found), found


def test_a_field_only_one_report_has_and_a_changed_value_are_named():
    left = {"cluster": {"ran_in": "module", "findings": [{"id": "a"}]}, "timestamp": 1.0, "nodes": {"n": {"audit_seconds": 1}}}
    right = {"cluster": {"ran_in": "controller process", "findings": [{"id": "b"}], "extra": 1}, "timestamp": 2.0, "nodes": {"n": {}}}
    assert differences(left, right) == ["cluster.extra: only in the right report", "cluster.findings[0].id: 'a' != 'b'"]
    assert "cluster.ran_in" in IGNORED and "timestamp" in IGNORED
