# SPDX-License-Identifier: GPL-3.0-or-later
"""Drift on the seed-failures lab: node_audit reports a check as drifted exactly when harden_gpu_nodes.yml in check
mode would change it, on every seeded node; `gpuharden drift` reports, exits and writes metrics right, keeps going
past an unreachable and a locked node, and --remediate fixes only the drifted stages."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import ansible_runner
import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s
from gpuharden_lab import REPO_ROOT, layout
from kubernetes import client

from tests.integration import cluster_side as cs
from tests.labfixtures import discard_shared_lab, shared_lab

pytestmark = pytest.mark.lab

NODE_SIDE_STAGES = ("device_permissions", "container_runtime", "kubelet_topology", "cgroup_limits")
# remediation module -> the node_audit check that shares its planner
CHECK_OF_ACTION = {
    "gpuharden.k8s.nvidia_device_nodes": "device_nodes",
    # the action that runs nvidia_device_nodes for role device_permissions (plugins/action/device_permissions_repair.py)
    "gpuharden.k8s.device_permissions_repair": "device_nodes",
    "gpuharden.k8s.containerd_nvidia_runtime": "containerd",
    # the action that runs containerd_nvidia_runtime for role container_runtime's write (plugins/action/container_runtime_stage.py):
    # its result is containerd_nvidia_runtime's
    "gpuharden.k8s.container_runtime_stage": "containerd",
    "gpuharden.k8s.kubelet_config": "kubelet",
    # the action that runs kubelet_config for role kubelet_topology's write (plugins/action/kubelet_topology_apply.py):
    # its result is kubelet_config's
    "gpuharden.k8s.kubelet_topology_apply": "kubelet",
    "gpuharden.k8s.cgroup_memory": "cgroup_memory",
    # the action that runs cgroup_memory on the node for the immediate fix (memory.high of the GPU pods' cgroups)
    "gpuharden.k8s.cgroup_limits_immediate": "cgroup_memory",
}
ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}


@pytest.fixture(scope="module")
def lab():
    # On the seed-failures lab it shares (tests/xdist_shared_lab.py): the remediation test changes three nodes and
    # rolls the plugin out, so the next user starts afresh.
    with shared_lab("seed-failures") as state:
        try:
            yield state
        finally:
            discard_shared_lab()


def _playbook(state, playbook, tmp, *, check=False, tags=None, extravars=None, limit=None):
    """Run a playbook through ansible-runner; its events."""
    events = []
    cmdline = (["--check"] if check else []) + (["--tags", ",".join(tags)] if tags else [])
    runner = ansible_runner.run(private_data_dir=str(tmp), envvars=ENV, inventory=state["inventory"],
                                playbook=str(REPO_ROOT / "playbooks" / playbook), cmdline=" ".join(cmdline) or None,
                                extravars=extravars or {}, limit=limit, quiet=True,
                                event_handler=lambda event: events.append(event) or True)
    assert runner.status in ("successful", "failed"), runner.stdout.read()
    return runner, events


def _drift(state, *args, env=None):
    return subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", state["inventory"], *args],
                          cwd=REPO_ROOT, env=dict(os.environ, **ENV, **(env or {})), capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def drift_results(lab, tmp_path_factory):
    """{module: [results]} of one drift_check.yml run."""
    runner, events = _playbook(lab, "drift_check.yml", tmp_path_factory.mktemp("drift"), extravars={"gpuharden_drift_fail": False})
    assert runner.rc == 0, runner.stdout.read()[-4000:]
    results = {}
    for event in events:
        if event.get("event") == "runner_on_ok" and str(event["event_data"].get("task_action", "")).startswith("gpuharden.k8s."):
            data = event["event_data"]
            results.setdefault(data["task_action"].rsplit(".", 1)[-1], []).append(dict(data["res"], _host=data["host"]))
            # the play's cluster step (gpuharden.k8s.drift_play, step=cluster) runs these modules inside its task: their
            # results are the step's
            for module, key in (("gpu_consistency", "consistency"), ("runtime_class", "runtime_class")):
                if data["task_action"] == "gpuharden.k8s.drift_play" and data["res"].get(key):
                    results.setdefault(module, []).append(dict(data["res"][key], _host=data["host"]))
    return results


@pytest.fixture(scope="module")
def audits(drift_results):
    # drift_check.yml audits through the stage engine, plan only: node_stages' result is node_audit's with the plan
    assert "node_audit" not in drift_results, "node_audit ran outside the engine"
    assert all("stages" not in result for result in drift_results["node_stages"]), "the drift check ran a stage"
    return {result["_host"]: result for result in drift_results["node_stages"]}


def test_drift_lists_the_pods_once(drift_results):
    """The plan's LIST of pods is also the consistency check's: gpu_pods_info (run by the plan's node_plan_pods task,
    tasks/node_plan_inputs.yml) hands it over in a snapshot file, which gpu_consistency reads and removes; the seeded GPU
    process without an allocation is still found."""
    (listed,) = drift_results["node_plan_pods"]
    (checked,) = drift_results["gpu_consistency"]
    assert listed["pods_snapshot"] and listed["api_requests"] >= 1
    assert checked["api_requests"]["pods"] == 0 and checked["api_requests"]["nodes"] >= 1, checked["api_requests"]
    assert not os.path.exists(os.path.dirname(listed["pods_snapshot"])), "the snapshot is removed once read"
    found = {(entry["node"], entry["id"]) for entry in checked["findings"]}
    assert {("seed-isolation", "gpu_process_without_allocation"), ("seed-no-plugin", "gpu_not_advertised")} <= found, found


def test_drift_checks_the_runtime_class_in_the_consistency_run(drift_results):
    """The RuntimeClass dry run rides in the consistency check's module run (its runtime_class option, the same
    identity here): no runtime_class module run of its own, and the scenario's RuntimeClass traps are still found."""
    (checked,) = drift_results["gpu_consistency"]
    assert "runtime_class" not in drift_results, "the separate RuntimeClass dry run ran too"
    found = {entry["id"] for entry in checked["runtime_class_check"]["findings"]}
    assert {"runtime_class_handler_mismatch", "runtime_class_overhead_gpu"} <= found, checked["runtime_class_check"]
    # the wrong handler is immutable: without force the dry run refuses, and says so, rather than predicting a recreate
    assert checked["runtime_class_check"].get("failed") and "handler is immutable" in checked["runtime_class_check"]["msg"]


def _check_mode_harden(lab, tmp_path, skip_compliant_stages):
    """Check-mode harden of the node-side stages: per host, the checks whose stage module ran and those it would change."""
    runner, events = _playbook(lab, "harden_gpu_nodes.yml", tmp_path, check=True, tags=NODE_SIDE_STAGES,
                               extravars={"gpuharden_skip_compliant_stages": skip_compliant_stages})
    ran, would_change = {}, {}
    for event in events:
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_failed" and not data.get("ignore_errors"):
            pytest.fail("check-mode harden failed on %s: %s" % (data.get("host"), (data.get("res") or {}).get("msg")))
        if event.get("event") == "runner_on_ok" and data.get("task_action") in CHECK_OF_ACTION:
            ran.setdefault(data["host"], set()).add(CHECK_OF_ACTION[data["task_action"]])
            if data["res"].get("changed"):
                would_change.setdefault(data["host"], set()).add(CHECK_OF_ACTION[data["task_action"]])
        if event.get("event") == "runner_on_ok" and data.get("task_action") == "gpuharden.k8s.node_stages":
            # the stage engine runs some stages' modules in its own task: each one's result is in its stages
            for name, stage_result in (data["res"].get("stages") or {}).items():
                check = CHECK_OF_ACTION.get(_stage_plan.by_name(name).module)
                if check:
                    ran.setdefault(data["host"], set()).add(check)
                    if stage_result.get("changed"):
                        would_change.setdefault(data["host"], set()).add(check)
    assert runner.rc == 0
    return ran, would_change


def test_audit_iff_check_mode_harden_would_change(lab, audits, tmp_path):
    # Every stage's module runs here (gpuharden_skip_compliant_stages=false): this is what proves the audit right,
    # and so what makes it safe for harden to skip the stages whose check is ok.
    ran, would_change = _check_mode_harden(lab, tmp_path, skip_compliant_stages=False)
    would_change = {host: would_change.get(host, set()) for host in audits}
    assert all(ran.get(host) == set(CHECK_OF_ACTION.values()) for host in audits), ran
    assert len(audits) == 11
    for host, audit in sorted(audits.items()):
        reported = {entry["check"] for entry in audit["findings"] if entry["remediable"]} & set(CHECK_OF_ACTION.values())
        assert reported == would_change[host], (host, reported, would_change[host], audit["checks"])
        assert set(audit["summary"]["would_change"]) & set(CHECK_OF_ACTION.values()) == would_change[host], host
    # the seeded node-side faults are each reported on their node
    expected = {
        "seed-dev-perm": ("device_node_permissions", "/dev/nvidia0"),
        "seed-topology-none": ("kubelet_setting", "topologyManagerPolicy"),
        "seed-stale-cpu-state": ("kubelet_stale_checkpoint", None),
        "seed-no-runtime": ("containerd_nvidia_runtime", None),
        "seed-memory-high": ("gpu-pod-memory-high-unset", None),
    }
    for host, (ident, where) in expected.items():
        found = [entry for entry in audits[host]["findings"] if entry["id"] == ident]
        assert found, (host, ident, [entry["id"] for entry in audits[host]["findings"]])
        if where:
            assert any(where in (entry.get("path"), entry.get("subject")) for entry in found), found
        assert all(entry["remediable"] for entry in found)
    # faults no playbook fixes are reported, and marked as such
    pcie = [entry for entry in audits["seed-pcie"]["findings"] if entry["check"] == "nvml" and entry["gpu"] is not None]
    assert pcie and not any(entry["remediable"] for entry in pcie)
    isolation = {entry["id"] for entry in audits["seed-isolation"]["findings"] if entry["check"] == "device_cgroups"}
    assert "privileged_container" in isolation
    # only the stages with seeded faults besides the fresh node's missing persistence files
    assert "container_runtime" not in audits["seed-dev-perm"]["summary"]["stages"]
    assert "container_runtime" in audits["seed-no-runtime"]["summary"]["stages"]


def test_harden_runs_only_the_stages_whose_check_is_not_ok(lab, audits, tmp_path):
    """The default harden plans with node_audit and runs a node-side stage's module only where that check is not ok;
    what it would change is exactly what the run of every stage would change."""
    ran, would_change = _check_mode_harden(lab, tmp_path, skip_compliant_stages=True)
    for host, audit in sorted(audits.items()):
        not_ok = {check for check in CHECK_OF_ACTION.values() if audit["checks"][check]["status"] != "ok"}
        assert ran.get(host, set()) == not_ok, (host, ran.get(host), {name: audit["checks"][name]["status"] for name in not_ok})
        reported = {entry["check"] for entry in audit["findings"] if entry["remediable"]} & set(CHECK_OF_ACTION.values())
        assert would_change.get(host, set()) == reported, host
    # the seeded faults are spread so that some node skips some stage, or this test would prove nothing
    assert any(ran.get(host, set()) != set(CHECK_OF_ACTION.values()) for host in audits)


def _task_results(log):
    """{task name: {ok, changed, skipping, failed, fatal}} from an ANSIBLE_LOG_PATH file, by the task banners."""
    results, task = {}, None
    for line in log.splitlines():
        banner = re.search(r"\| TASK \[(.*)\] \*+$", line)
        if banner:
            task = banner.group(1)
            results.setdefault(task, set())
            continue
        outcome = re.search(r"\| (ok|changed|skipping|failed|fatal): \[", line)
        if task and outcome:
            results[task].add(outcome.group(1))
    return results


def test_drift_cli_report_metrics_and_unreachable_host(lab, tmp_path):
    inventory = yaml.safe_load(Path(lab["inventory"]).read_text())
    # nothing listens on the discard port of loopback: ssh is refused at once
    inventory["all"]["children"]["gpu_nodes"]["hosts"]["gone-node"] = {"ansible_host": "127.0.0.1", "ansible_port": 9}
    with_gone = tmp_path / "hosts.yml"
    with_gone.write_text(yaml.safe_dump(inventory))
    report, metrics = tmp_path / "report.json", tmp_path / "textfile" / "gpuharden.prom"
    log = tmp_path / "ansible.log"
    completed = subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", str(with_gone), "--report", str(report),
                                "--prometheus", str(metrics), "--wide"], cwd=REPO_ROOT, env=dict(os.environ, **ENV, ANSIBLE_LOG_PATH=str(log)),
                               capture_output=True, text=True, check=False)
    # a node unreachable: the run could not check everything (exit 4), and says so first
    assert completed.returncode == 4, completed.stderr[-3000:]
    assert completed.stdout.startswith("NOT CHECKED: every check (unreachable) on node gone-node: "), completed.stdout[:500]
    # the cluster side ran in the CLI's Python: the play's cluster step (drift_play, step=cluster) handed over the
    # options and ran no gpu_consistency module (which would have made the report's ran_in "module")
    results = _task_results(log.read_text())
    assert results["The cluster side, once for the play (consistency check, RuntimeClass dry run)"] == {"ok"}, results
    data = json.loads(report.read_text())
    assert data["cluster"]["ran_in"] == "controller process", data["cluster"]
    assert data["summary"]["unreachable"] == 1 and "gone-node" in data["unreachable"]
    assert len(data["nodes"]) == 11 and data["summary"]["drifted"] >= 6
    for node in data["nodes"].values():
        for entry in node["findings"]:
            assert {"id", "severity", "expected", "found", "hint", "check", "stage", "remediable"} <= set(entry)
    assert re.search(r"^\[\d+/\d+\] gone-node: UNREACHABLE", completed.stderr, re.M)
    # the cluster side, from the node reports node_audit returned: one LIST per kind, no second trip to the nodes
    assert data["cluster"]["consistency_checked"], data["cluster"]
    # the RuntimeClass traps of the scenario, from one dry run of the runtime_class module: cluster findings
    assert data["cluster"]["runtime_class_checked"]
    assert {"runtime_class_handler_mismatch", "runtime_class_overhead_gpu"} <= {entry["id"] for entry in data["cluster"]["findings"]}
    assert re.search(r'^gpuharden_drift_cluster_findings\{check="runtime_class",severity="error"\} [1-9]', metrics.read_text(), re.M)
    missing_plugin = [entry for entry in data["nodes"]["seed-no-plugin"]["findings"] if entry["check"] == "consistency"]
    assert any(entry["id"] == "gpu_not_advertised" and entry["stage"] == "device_plugin" for entry in missing_plugin), missing_plugin
    assert re.search(r"^seed-no-runtime\s+drift\s+.*container_runtime", completed.stdout, re.M)
    text = metrics.read_text()
    assert "gpuharden_nodes_unreachable 1" in text
    assert re.search(r'^gpuharden_drift_findings\{node="seed-no-runtime",check="containerd",severity="error"\} 1$', text, re.M)
    assert re.search(r"^gpuharden_last_run_timestamp_seconds \d+\.\d+$", text, re.M)
    for host, node in data["nodes"].items():
        total = sum(int(value) for value in re.findall(r'^gpuharden_drift_findings\{node="%s",[^}]*\} (\d+)$' % node["node"], text, re.M))
        assert total == len(node["findings"]), host


# ---------------------------------------------------------------------------------------------
# A blind cluster side (issue 43): could not check, with the cause and the fix; never drift, never clean

BLIND_HOSTS = "seed-pcie,seed-list-none"
TOOL_NAMESPACE, TOOL_ACCOUNT = "gpuharden-system", "gpuharden"
NO_PODS = "gpuharden-drift-no-pods"


def _b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _expired(token):
    """The API server's own service-account token with its validity moved into the past, signed again with the lab's
    service-account key (ES256): what a token looks like once it has expired."""
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec, utils  # noqa: PLC0415

    header, payload, _signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    now = int(time.time())
    claims.update(iat=now - 7200, nbf=now - 7200, exp=now - 3600)
    signing_input = "%s.%s" % (header, _b64url(json.dumps(claims, separators=(",", ":")).encode()))
    key = serialization.load_pem_private_key((layout.CONTROL_PLANE_DIR / "sa.key").read_bytes(), password=None)
    r, s = utils.decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return "%s.%s" % (signing_input, _b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big")))


def _status_with(kubeconfig):
    """The HTTP status of a LIST of pods with ``kubeconfig``."""
    from kubernetes import config  # noqa: PLC0415

    api = config.new_client_from_config(config_file=kubeconfig)
    try:
        client.CoreV1Api(api).list_pod_for_all_namespaces(limit=1)
        return 200
    except client.ApiException as error:
        return error.status
    finally:
        api.close()


@pytest.fixture(scope="module")
def blind_kubeconfigs(lab, tmp_path_factory):
    """Kubeconfigs the cluster side cannot use: none at the path, an expired token, a revoked one (bound to a Secret
    since deleted) and an identity whose RBAC forbids listing pods.  Each is checked against the real API server
    first, so the test knows the server, not the test, refuses it."""
    directory = tmp_path_factory.mktemp("identities")
    api = cs.admin(lab)
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)

    def token(account, **spec):
        return core.create_namespaced_service_account_token(account, TOOL_NAMESPACE, {"spec": dict(expirationSeconds=600, **spec)}).status.token

    anchor = core.create_namespaced_secret(TOOL_NAMESPACE, {"metadata": {"name": "drift-blind-anchor"}, "type": "Opaque"})
    revoked = token(TOOL_ACCOUNT, boundObjectRef={"apiVersion": "v1", "kind": "Secret", "name": anchor.metadata.name,
                                                   "uid": anchor.metadata.uid})
    core.delete_namespaced_secret(anchor.metadata.name, TOOL_NAMESPACE)
    core.create_namespaced_service_account(TOOL_NAMESPACE, {"metadata": {"name": NO_PODS}})
    rbac.create_cluster_role({"metadata": {"name": NO_PODS}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["get", "list", "watch"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": NO_PODS}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                                               "kind": "ClusterRole", "name": NO_PODS},
                                      "subjects": [{"kind": "ServiceAccount", "name": NO_PODS, "namespace": TOOL_NAMESPACE}]})
    try:
        kubeconfigs = {
            "missing": str(directory / "nonexistent" / "kubeconfig"),
            "expired": cs.token_kubeconfig(lab, _expired(token(TOOL_ACCOUNT)), directory, "expired.kubeconfig"),
            "revoked": cs.token_kubeconfig(lab, revoked, directory, "revoked.kubeconfig"),
            "forbidden": cs.token_kubeconfig(lab, token(NO_PODS), directory, "forbidden.kubeconfig"),
        }
        assert {case: _status_with(kubeconfigs[case]) for case in ("expired", "revoked", "forbidden")} == {
            "expired": 401, "revoked": 401, "forbidden": 403}
        yield kubeconfigs
    finally:
        rbac.delete_cluster_role_binding(NO_PODS)
        rbac.delete_cluster_role(NO_PODS)
        core.delete_namespaced_service_account(NO_PODS, TOOL_NAMESPACE)
        api.close()


def _alerts_firing(metrics, tmp_path):
    """The alerts of deploy/monitoring/gpuharden-alerts.yml that promtool finds firing 5 minutes into series that hold
    ``metrics``' samples (as scraped from one controller)."""
    series = []
    for line in metrics.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            labels = 'job="node",instance="ctl-a:9100"'
            name_labels = name_labels[:-1] + "," + labels + "}" if "{" in name_labels else name_labels + "{" + labels + "}"
            series.append({"series": name_labels, "values": "%sx20" % value})
    rules = REPO_ROOT / "deploy" / "monitoring" / "gpuharden-alerts.yml"
    test = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": series,
            "promql_expr_test": [{"expr": 'count by (alertname, check) (ALERTS{alertstate="firing"})', "eval_time": "5m",
                                  "exp_samples": []}]}]}
    path = tmp_path / "alerts-test.yml"
    path.write_text(yaml.safe_dump(test))
    # promtool prints the samples it got when they differ from the (empty) expectation
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, check=False)
    return set(re.findall(r'alertname="(\w+)", check="(\w+)"', result.stdout + result.stderr))


@pytest.mark.parametrize(("case", "cause", "kind"), [
    ("missing", "no such file on the controller", "kubeconfig"),
    ("expired", "401 Unauthorized", "credentials"),
    ("revoked", "401 Unauthorized", "credentials"),
    ("forbidden", "may not list pods", "forbidden"),
])
def test_a_blind_cluster_side_is_not_checked_with_the_cause_and_the_fix_first(lab, blind_kubeconfigs, tmp_path, case, cause, kind):
    report, metrics, page = tmp_path / "report.json", tmp_path / "textfile" / "gpuharden.prom", tmp_path / "drift.html"
    metrics.parent.mkdir()
    metrics.write_text("gpuharden_last_success_timestamp_seconds 1234.500\n")  # the last run that saw everything
    completed = _drift(lab, "-l", BLIND_HOSTS, "-q", "-e", "gpuharden_kubeconfig=%s" % blind_kubeconfigs[case], "--report", str(report),
                       "--prometheus", str(metrics), "--html", str(page), env={"COLUMNS": "100"})
    assert completed.returncode == 4, completed.stdout[-3000:] + completed.stderr[-3000:]
    first = completed.stdout.splitlines()[0]
    assert first.startswith("NOT CHECKED: the cluster side (consistency, runtime_class"), first
    assert cause in first and ("Fix: " + _k8s.ACCESS_FIXES[kind]) in first, first
    data = json.loads(report.read_text())
    assert data["cluster"]["findings"] == []  # not a RuntimeClass finding, not drift
    for check in ("consistency", "runtime_class"):
        entry = data["cluster"]["checks"][check]
        assert entry["state"] == "not_checked" and cause in entry["cause"] and entry["fix"] == _k8s.ACCESS_FIXES[kind], entry
    # the nodes were checked all the same; the parts that need the cluster (the memory check takes the pods' LIST; the
    # containerd and device node checks ask whether the GPU Operator's ClusterPolicy owns them) are named as not
    # checked, each with the cluster's cause
    assert set(data["nodes"]) == set(BLIND_HOSTS.split(","))
    for node in data["nodes"].values():
        assert "cgroup_memory" in {part["check"] for part in node["not_checked"]}, node["not_checked"]
        for part in node["not_checked"]:
            assert part["check"] in ("cgroup_memory", "containerd", "device_nodes", "mig") and cause in part["cause"], part
    text = metrics.read_text()
    for check in ("consistency", "runtime_class"):
        assert 'gpuharden_drift_checked{scope="cluster",check="%s"} 0' % check in text.splitlines()
    assert not re.search(r"^gpuharden_drift_cluster_findings\{", text, re.M)
    assert "gpuharden_last_success_timestamp_seconds 1234.500" in text.splitlines()  # did not advance
    assert re.search(r"^gpuharden_last_run_timestamp_seconds (\d+)", text, re.M)
    assert html.escape("not checked: %s" % data["cluster"]["checks"]["consistency"]["cause"]) in page.read_text()
    assert {("GpuhardenDriftClusterNotChecked", "consistency"), ("GpuhardenDriftClusterNotChecked", "runtime_class")} <= \
        _alerts_firing(text, tmp_path)


def _timeless(value):
    """A report without what differs from run to run by itself: the timings (the run's and each node's)."""
    if isinstance(value, dict):
        return {key: _timeless(item) for key, item in value.items()
                if key not in ("generated_at", "timestamp") and key != "seconds" and not key.endswith("_seconds")}
    if isinstance(value, list):
        return [_timeless(item) for item in value]
    return value


def _differences(left, right, where=""):
    if isinstance(left, dict) and isinstance(right, dict):
        return [line for key in sorted(set(left) | set(right), key=str)
                for line in _differences(left.get(key), right.get(key), "%s/%s" % (where, key))]
    return [] if left == right else ["%s: %r != %r" % (where, left, right)]


def test_three_slices_merged_equal_the_unsliced_run(lab, tmp_path):
    """Issue 15 item 6: `gpuharden drift --slice K/3` for K = 1..3, merged, is the unsliced report but for the
    timings; each slice reports only its own hosts, and the cluster findings appear once."""
    whole = tmp_path / "whole.json"
    completed = _drift(lab, "-q", "--report", str(whole))
    assert completed.returncode in (0, 1), completed.stderr[-3000:]
    hosts = set(yaml.safe_load(Path(lab["inventory"]).read_text())["all"]["children"]["gpu_nodes"]["hosts"])
    slices = []
    for index in (1, 2, 3):
        slices.append(tmp_path / ("slice-%d.json" % index))
        part = _drift(lab, "-q", "--slice", "%d/3" % index, "--report", str(slices[-1]))
        assert part.returncode in (0, 1), part.stderr[-3000:]
        report = json.loads(slices[-1].read_text())
        answered = set(report["nodes"]) | set(report["unreachable"]) | set(report["failed"])
        assert answered == set(report["slice"]["hosts"]) == {host for host in hosts if
                                                             int(hashlib.sha256(host.encode()).hexdigest(), 16) % 3 == index - 1}
    merged_path, metrics = tmp_path / "merged.json", tmp_path / "merged.prom"
    merge = subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift-merge", *map(str, slices), "--report", str(merged_path),
                            "--prometheus", str(metrics)], cwd=REPO_ROOT, env=dict(os.environ, **ENV), capture_output=True, text=True,
                           check=False)
    assert merge.returncode == completed.returncode, merge.stderr
    merged, unsliced = json.loads(merged_path.read_text()), json.loads(whole.read_text())
    assert not _differences(_timeless(merged), _timeless(unsliced)), "\n".join(_differences(_timeless(merged), _timeless(unsliced)))
    assert {"runtime_class_handler_mismatch", "runtime_class_overhead_gpu"} <= {entry["id"] for entry in merged["cluster"]["findings"]}
    identities = [json.dumps(entry, sort_keys=True) for entry in merged["cluster"]["findings"]]
    assert len(identities) == len(set(identities))
    assert re.search(r"^gpuharden_last_success_timestamp_seconds \d+\.\d+$", metrics.read_text(), re.M)


def test_locked_node_is_reported_and_the_others_checked(lab, tmp_path):
    lock = ["ansible", "-i", lab["inventory"], "seed-pcie", "-m", "gpuharden.k8s.node_lock"]
    env = dict(os.environ, **ENV)
    held = subprocess.run(lock + ["-a", "owner=harden@elsewhere"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    assert held.returncode == 0, held.stdout
    try:
        completed = _drift(lab, "-l", "seed-pcie,seed-list-none", "-e", "gpuharden_lock_timeout=1", "--json", "-q")
        data = json.loads(completed.stdout)
        assert completed.returncode == 4  # a node the run could not check
        assert "harden@elsewhere" in data["failed"]["seed-pcie"]
        assert list(data["nodes"]) == ["seed-list-none"]
    finally:
        subprocess.run(lock + ["-a", "owner=harden@elsewhere state=released"], cwd=REPO_ROOT, env=env, capture_output=True, check=True)


def test_item05_sigint_leaves_the_previous_report_and_metrics_byte_identical(lab, tmp_path):
    """Ctrl-C two seconds into `gpuharden drift`: exit 130, the previous report and .prom untouched byte for byte, no
    summary on stdout, every node without a result named; the nodes are not left locked (a complete run follows)."""
    report, metrics = tmp_path / "report.json", tmp_path / "textfile" / "gpuharden.prom"
    files = ("--report", str(report), "--prometheus", str(metrics))
    first = _drift(lab, "-l", "seed-pcie,seed-list-none", "-q", *files)
    assert first.returncode in (0, 1), first.stderr[-3000:]
    before = {path: (path.read_bytes(), os.stat(path).st_mtime_ns) for path in (report, metrics)}
    process = subprocess.Popen([sys.executable, "-m", "gpuharden.cli", "drift", "-i", lab["inventory"], *files], cwd=REPO_ROOT,
                               env=dict(os.environ, **ENV), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # two seconds in, and once ansible-runner has started ansible-playbook (a loaded machine may still be
        # importing Python at two seconds: that is not the case under test)
        time.sleep(2)
        children = Path("/proc/%d/task/%d/children" % (process.pid, process.pid))
        deadline = time.monotonic() + 60
        while process.poll() is None and not children.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, "the run ended before the signal: %s" % process.communicate()[1][-2000:]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err[-3000:]
    for path, (content, mtime) in before.items():
        assert path.read_bytes() == content and os.stat(path).st_mtime_ns == mtime, path
    assert sorted(os.listdir(metrics.parent)) == ["gpuharden.prom"]
    assert not re.search(r"node\(s\):|\bclean\b", out), out
    assert "INCOMPLETE, interrupted by SIGINT" in err, err[-3000:]
    pending = re.search(r"^gpuharden drift: no final result for \d+ host\(s\): (.+)$", err, re.M)
    answered = re.search(r"^gpuharden drift: answered before the stop, not reported: (.+)$", err, re.M)
    named = set(pending.group(1).split(", ") if pending else []) | set(answered.group(1).split(", ") if answered else [])
    assert pending and named == set(yaml.safe_load(Path(lab["inventory"]).read_text())["all"]["children"]["gpu_nodes"]["hosts"])
    # the killed run left no node lock behind, and a complete run writes fresh files again
    again = _drift(lab, "-l", "seed-pcie,seed-list-none", "-q", "-e", "gpuharden_lock_timeout=30", *files)
    assert again.returncode in (0, 1), again.stderr[-3000:]
    assert not json.loads(report.read_text())["failed"], report.read_text()
    assert report.read_bytes() != before[report][0]
    stamps = re.findall(r"^gpuharden_last_success_timestamp_seconds (\S+)$", metrics.read_text(), re.M)
    assert len(stamps) == 1 and float(stamps[0]) > json.loads(before[report][0])["timestamp"]


def test_check_mode_harden_reports_the_post_check_without_failing(lab, tmp_path):
    """harden --check changes nothing, so its post-check sees the seeded failures as they are: reported (with the
    ids), never a failed host; the post-check alone in check mode still fails on them."""
    (tmp_path / "harden").mkdir()
    (tmp_path / "postcheck").mkdir()
    runner, events = _playbook(lab, "harden_gpu_nodes.yml", tmp_path / "harden", check=True, tags=["postcheck"], limit="seed-no-plugin")
    failed = [event["event_data"].get("task") for event in events if event.get("event") == "runner_on_failed"]
    assert failed == [] and runner.rc == 0, failed
    reported = [event["event_data"]["res"].get("msg", "") for event in events if event.get("event") == "runner_on_ok"
                and event["event_data"].get("task", "").startswith("Postcheck | report only")]
    assert len(reported) == 1 and "gpu_not_advertised" in reported[0] and reported[0].startswith("check mode:"), reported
    runner, events = _playbook(lab, "postcheck.yml", tmp_path / "postcheck", check=True, limit="seed-no-plugin")
    assert runner.rc != 0
    assert any("gpu_not_advertised" in (event["event_data"].get("res") or {}).get("msg", "") for event in events
               if event.get("event") == "runner_on_failed")


# Last of the module: the remediation rolls the managed plugin out on every GPU node, seed-no-plugin's included.
def test_remediate_runs_only_the_drifted_stages_then_reports_clean(lab, tmp_path):
    hosts = "seed-no-runtime,seed-topology-none,seed-stale-cpu-state"
    # Two operator decisions first, as the report asks: the seeded RuntimeClass names handler nvidia-legacy, which no
    # containerd has (the plugin stage refuses a rollout whose pods could never start), and its handler is immutable,
    # so recreating it is taken explicitly; and seed-stale-cpu-state's real kubelet is stopped, so its Node is NotReady
    # and takes the one slot of the default disruption budget: two may be unavailable while it is repaired.
    runner, _events = _playbook(lab, "harden_gpu_nodes.yml", tmp_path, tags=["runtime_class"], limit=hosts,
                                extravars={"runtime_class_force": True})
    assert runner.rc == 0, runner.stdout.read()[-4000:]
    # and the scenario's unowned competing plugin: deleting it is taken explicitly too (it blocks the plugin stage)
    completed = _drift(lab, "-l", hosts, "--remediate", "-e", "gpuharden_max_unavailable=2", "-e", "device_plugin_remove_competing=true",
                       "--json", "-q")
    data = json.loads(completed.stdout)
    # one harden run: the stale kubelet is repaired in its budgeted rollout before the plugin rolls out over the fleet
    [run] = data["remediation"]["runs"]
    assert run["rc"] == 0, run
    stages = run["stages_by_host"]
    # seed-no-runtime's kubelet settings are compliant but live in kubeadm's config.yaml: kubelet_topology moves them to
    # its --config-dir drop-in (kubelet_reverts_on_kubeadm_upgrade, remediable), so that stage runs there too
    assert "container_runtime" in stages["seed-no-runtime"] and "kubelet_topology" in stages["seed-no-runtime"]
    for host in ("seed-topology-none", "seed-stale-cpu-state"):
        assert "kubelet_topology" in stages[host] and "container_runtime" not in stages[host], stages
    assert sorted(run["stages"]) == sorted({stage for host_stages in stages.values() for stage in host_stages})
    assert data["remediation"]["before"]["drifted"] == 3
    for host in hosts.split(","):
        node = data["nodes"][host]
        assert node["remediable_stages"] == [], (host, node["findings"])
    problems = ("drifted", "attention", "unreachable", "failed", "cluster_findings")
    assert completed.returncode == (1 if any(data["summary"][key] for key in problems) else 0)
    again = _drift(lab, "-l", hosts, "--json", "-q")
    assert all(not node["remediable_stages"] for node in json.loads(again.stdout)["nodes"].values())
