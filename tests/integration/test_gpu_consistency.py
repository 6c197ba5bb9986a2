# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_consistency on the seed-failures lab: nvml_check and process_cgroup_info over SSH on every node feed one
gpu_consistency run on the controller (one LIST of nodes, one of pods).

seed-no-plugin: allocatable 0 with GPUs present.  seed-isolation: sneaky-all-gpus (NVIDIA_VISIBLE_DEVICES=all,
no request) has processes on GPUs it was not allocated - every GPU of the node - and its spec is flagged; train-ok
(1 GPU, its process on 1 GPU) is not.  The plugin seed list-none and MIG under migStrategy none are
caught; the nodes without a consistency seed report nothing.  The resource rename of the typo seed is not a
consistency seed: the real plugin ignores it and advertises nvidia.com/gpu (test_device_plugin reports the config as
plugin_resource_rename_ignored).
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from tests.integration import cluster_side as cs
from tests.labfixtures import shared_lab

pytestmark = pytest.mark.lab

# Nodes whose device plugin runs normally and that carry no allocation seed: nothing to report.
CLEAN = ["seed-dev-perm", "seed-topology-none", "seed-memory-high", "seed-pcie", "seed-resource-typo"]
# The NVML fixtures' own processes carry made-up PIDs; where such a PID happens to exist on the host it is some host
# process outside any pod, correctly reported as gpu_process_outside_pods (see the report: lab change wanted).
FIXTURE_PIDS = {3131, 4242, 5151, 5152, 7001}


@pytest.fixture(scope="module")
def lab():
    with shared_lab("seed-failures") as state:
        core = client.CoreV1Api(cs.admin(state))

        def advertised():
            nodes = {n.metadata.name: n for n in core.list_node().items}
            return all("nvidia.com/gpu" in (nodes[name].status.allocatable or {}) for name in CLEAN + ["seed-isolation"])

        # The kubelet stand-in mirrors the plugin's registration into the Node once the plugin pod runs.
        cs.wait_for(advertised, 120, 1, what="device plugin resources on the plugin nodes")
        yield state


@pytest.fixture(scope="module")
def result(lab):
    found, _stats, seconds = cs.run(lab, playbook="gpu_consistency.yml")
    assert cs.failures(found) == []
    [check] = [r for r in found if r["_action"] == "gpuharden.k8s.gpu_consistency"]
    print("\ngpu_consistency over %d nodes: playbook %.1fs" % (len(check["nodes"]), seconds))
    print(json.dumps([(f["node"], f["id"], f["pod"] and f["pod"]["name"]) for f in check["findings"]], indent=0))
    return check


def _findings(result, node, ident=None):
    return [f for f in result["findings"] if f["node"] == node and (ident is None or f["id"] == ident)
            and not (f["id"] == "gpu_process_outside_pods" and (f["found"] or {}).get("pid") in FIXTURE_PIDS)]


def test_one_list_per_kind(result):
    assert result["api_requests"] == {"nodes": 1, "pods": 1}
    assert result["changed"] is False


def test_no_plugin_allocatable_zero_with_gpus_present(result):
    [item] = _findings(result, "seed-no-plugin", "gpu_not_advertised")
    assert item["severity"] == "critical" and item["expected"]["gpus_present"] >= 1
    assert result["nodes"]["seed-no-plugin"]["physical"]["gpus"] == item["expected"]["gpus_present"]


def test_sneaky_all_gpus_uses_gpus_it_was_not_allocated(lab, result):
    pods = {p["name"]: p for p in lab["pods"]}
    sneaky, train = pods["sneaky-all-gpus"], pods["train-ok"]
    [item] = _findings(result, "seed-isolation", "gpu_process_without_allocation")
    assert item["pod"]["uid"] == sneaky["uid"] and item["severity"] == "critical"
    assert item["found"]["pids"] == [sneaky["pid"]]
    assert sorted(g["minor"] for g in item["found"]["gpus"]) == sorted(sneaky["visible_minors"])
    assert not sneaky["gpu_minors"]
    [spec] = _findings(result, "seed-isolation", "visible_devices_without_request")
    assert spec["pod"]["uid"] == sneaky["uid"]
    assert not [f for f in result["findings"] if f["pod"] and f["pod"]["uid"] == train["uid"]]
    assert result["nodes"]["seed-isolation"]["allocated"] == {"nvidia.com/gpu": 2}  # train-ok + lost-access


def test_plugin_seeds(result):
    assert _findings(result, "seed-list-none", "gpu_not_advertised")
    assert _findings(result, "seed-mig-strategy", "mig_not_advertised")


def test_clean_nodes_report_nothing(result):
    for node in CLEAN:
        assert _findings(result, node) == [], node
        assert result["nodes"][node]["declared"]["nvidia.com/gpu"] == result["nodes"][node]["physical"]["gpus"]


def test_explain_failing_lists_every_failing_gpu_pod_of_the_fleet_with_its_cause(lab):
    """gpuharden explain --failing with the lab inventory: one drift run over the fleet (the nodes' audits), then each
    GPU pod that is not Running and Ready, or that an audit flags, with its cause.  The seeds' failing pods: the device
    plugins that MIG (v0.15.0 under migStrategy none), deviceListStrategy none and a stale CPU Manager checkpoint (the
    real kubelet does not start) stop, and the two seed-isolation pods that can open GPUs they did not request.  The
    stand-in nodes serve no pod-resources API: what their Running GPU pods can open against their allocation is named
    as not checked, never as clean."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gpuharden.cli", "explain", "--failing", "-i", lab["inventory"], "--json",
                           "-e", "gpuharden_kubeconfig=%s" % lab["cluster"]["tool_kubeconfig"]],
                          cwd=cs.REPO_ROOT, capture_output=True, text=True, check=False, timeout=600,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(cs.REPO_ROOT / "ansible.cfg")))
    document = json.loads(done.stdout)
    print(json.dumps([(p["target"], p["verdict"]["summary"]) for p in document["pods"]], indent=1))
    causes = {}
    for entry in document["pods"]:
        namespace, name = entry["target"]["name"].split("/", 1)
        key = ("plugin", entry["target"]["node"]) if namespace == "kube-system" else name
        causes[key] = entry["verdict"]["cause"]
    assert causes == {("plugin", "seed-mig-strategy"): "node_device_plugin_failing", ("plugin", "seed-list-none"): "node_device_plugin_failing",
                      ("plugin", "seed-stale-cpu-state"): "stale_checkpoint",
                      "privileged-debug": "gpu_access_without_request", "sneaky-all-gpus": "gpu_access_without_request"}, causes
    # every failing pod decided: 1, with what could not be checked beside it
    assert done.returncode == 1 and document["node_trips"] == 1, (done.returncode, done.stderr[-2000:])
    unread = " ".join(entry["what"] for entry in document["not_checked"])
    assert "seed-isolation (ml/lost-access, ml/train-ok)" in unread and "seed-memory-high (ml/infer-0, ml/infer-1, ml/notebook)" in unread
