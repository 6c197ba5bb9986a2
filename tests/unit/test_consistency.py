# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_consistency: declared vs allocated vs used findings (pure), the node reports' two shapes, malformed input,
and process_cgroup_info on a temp /proc."""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _cgroup_paths

from tests.unit.conftest import run_module

UID_A = "0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162"
UID_B = "1a2b3c4d-0000-4000-8000-00000000000b"
UID_C = "2b3c4d5e-0000-4000-8000-00000000000c"
CID_A = "a" * 64
CID_B = "b" * 64
CID_C = "c" * 64


@pytest.fixture(autouse=True)
def projected_pods_give_the_same_check(monkeypatch):
    """Every check() of these tests also runs on project_pod's cut-down pods (what a pods snapshot holds) and must give
    the same findings and summary: the projection keeps everything check() reads."""
    original = _consistency.check

    def both(nodes, pods, *args, **kwargs):
        result = original(nodes, pods, *args, **kwargs)
        assert original(nodes, [_consistency.project_pod(entry) for entry in pods], *args, **kwargs) == result
        return result

    monkeypatch.setattr(_consistency, "check", both)  # monkeypatch puts the original back after each test


def test_the_projection_drops_what_check_does_not_read():
    secret = {"name": "main", "image": "registry.example/app:1", "command": ["run"], "resources": {"limits": {"nvidia.com/gpu": "1"}},
              "env": [{"name": "DB_PASSWORD", "value": "hunter2"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                      {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
              "volumeMounts": [{"name": "v", "mountPath": "/v"}]}
    full = {"metadata": {"name": "p", "namespace": "ml", "uid": UID_A, "labels": {"a": "b"}, "managedFields": [{}],
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"DB_PASSWORD\": \"hunter2\"}"}},
            "spec": {"nodeName": "gpu-1", "containers": [secret], "volumes": [{"name": "v", "secret": {"secretName": "s"}}],
                     "serviceAccountName": "sa"},
            "status": {"phase": "Running", "qosClass": "BestEffort", "podIP": "10.0.0.1",
                       "containerStatuses": [{"name": "main", "containerID": "containerd://" + CID_A, "image": "x", "state": {}}]}}
    projected = _consistency.project_pod(full)
    assert "hunter2" not in repr(projected) and "secretKeyRef" not in repr(projected)
    assert projected == {
        "metadata": {"name": "p", "namespace": "ml", "uid": UID_A},
        "spec": {"nodeName": "gpu-1", "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                                       "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]},
        "status": {"phase": "Running", "qosClass": "BestEffort", "containerStatuses": [{"name": "main", "containerID": "containerd://" + CID_A}]}}


def node(name, gpus=None, labels=None, extra=None):
    allocatable = {"cpu": "8"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = str(gpus)
    allocatable.update(extra or {})
    return {"metadata": {"name": name, "labels": labels if labels is not None else {"nvidia.com/gpu.present": "true"}},
            "status": {"capacity": dict(allocatable), "allocatable": allocatable}}


def pod(name, node_name, uid, gpus=0, container_id=None, env=None, phase="Running", resource="nvidia.com/gpu"):
    container = {"name": "main", "resources": {"limits": {resource: str(gpus)}} if gpus else {}, "env": env or []}
    status = {"phase": phase}
    if container_id:
        status["containerStatuses"] = [{"name": "main", "containerID": "containerd://" + container_id}]
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid}, "spec": {"nodeName": node_name, "containers": [container]}, "status": status}


def cgroup(uid, cid, qos="besteffort"):
    if qos == "guaranteed":
        return "/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%s.scope" % (uid.replace("-", "_"), cid)
    return "/kubepods.slice/kubepods-%s.slice/kubepods-%s-pod%s.slice/cri-containerd-%s.scope" % (qos, qos, uid.replace("-", "_"), cid)


def gpus(count):
    return [{"index": i, "minor": i, "uuid": "GPU-%d" % i} for i in range(count)]


def ids(findings, node_name=None):
    return sorted(f["id"] for f in findings if node_name is None or f["node"] == node_name)


def test_healthy_node_has_no_findings():
    report = {"gpu_count": 2, "gpus": gpus(2), "processes": [{"gpu": 0, "pid": 10, "used_memory_mib": 100, "cgroup": cgroup(UID_A, CID_A)}]}
    findings, summary = _consistency.check([node("n1", 2)], [pod("a", "n1", UID_A, 1, CID_A)], {"n1": report})
    assert findings == []
    assert summary["n1"]["declared"] == {"nvidia.com/gpu": 2} and summary["n1"]["allocated"] == {"nvidia.com/gpu": 1}
    assert summary["n1"]["used"] == {"gpus": 1, "processes": 1, "used_memory_mib": 100, "exited_processes": 0}


def test_no_plugin_allocatable_zero_with_gpus_present():
    findings, _ = _consistency.check([node("n1")], [], {"n1": {"gpu_count": 2, "gpus": gpus(2)}})
    [item] = findings
    assert item["id"] == "gpu_not_advertised" and item["severity"] == "critical"
    assert item["expected"]["gpus_present"] == 2


def test_labelled_node_without_report_and_without_gpus():
    findings, _ = _consistency.check([node("n1"), node("cpu", labels={})], [], {})
    assert ids(findings) == ["gpu_not_advertised"] and findings[0]["node"] == "n1"


def test_resource_name_typo():
    findings, _ = _consistency.check([node("n1", extra={"nvidia.com/nvidia-gpu": "2"})], [], {"n1": {"gpu_count": 2, "gpus": gpus(2)}})
    assert ids(findings) == ["gpu_not_advertised", "unknown_gpu_resource"]
    typo = next(f for f in findings if f["id"] == "unknown_gpu_resource")
    assert typo["found"] == {"nvidia.com/nvidia-gpu": 2}


def test_partially_and_over_advertised():
    assert ids(_consistency.check([node("n1", 1)], [], {"n1": {"gpu_count": 2}})[0]) == ["gpu_partially_advertised"]
    assert ids(_consistency.check([node("n1", 8)], [], {"n1": {"gpu_count": 2}})[0]) == ["gpu_over_advertised"]
    assert _consistency.check([node("n1", 8)], [], {"n1": {"gpu_count": 2}}, replicas=4)[0] == []


def _mig_gpu(index, profiles):
    devices = [{"uuid": "MIG-%d-%d" % (index, n), "gpu_instance_id": n, "compute_instance_id": 0} for n in range(sum(profiles.values()))]
    return {"index": index, "uuid": "GPU-%d" % index, "mig": {"mode_current": "enabled", "layout": profiles, "devices": devices}}


def test_mig_not_advertised_under_strategy_none():
    report = {"gpu_count": 2, "gpus": [_mig_gpu(0, {"1g.10gb": 7}), _mig_gpu(1, {"1g.10gb": 7})]}
    findings, summary = _consistency.check([node("n1", 2)], [], {"n1": report})
    assert ids(findings) == ["mig_not_advertised"]
    assert summary["n1"]["physical"] == {"gpus": 2, "mig_devices": 14, "mig_profiles": {"1g.10gb": 14}}
    assert _consistency.check([node("n1", extra={"nvidia.com/mig-1g.10gb": "14"})], [], {"n1": report})[0] == []  # mixed
    assert _consistency.check([node("n1", 14)], [], {"n1": report})[0] == []  # single
    wrong = node("n1", extra={"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "7"})
    assert ids(_consistency.check([wrong], [], {"n1": report})[0]) == ["mig_not_advertised"]


def test_generic_mig_devices_shape():
    report = {"gpu_count": 1, "mig_devices": [{"uuid": "MIG-1", "gpu": 0, "profile": "3g.40gb"}, {"uuid": "MIG-2", "gpu": 0, "profile": "3g.40gb"}]}
    assert _consistency.check([node("n1", extra={"nvidia.com/mig-3g.40gb": "2"})], [], {"n1": report})[0] == []


def test_allocated_exceeds_declared():
    pods = [pod("a", "n1", UID_A, 2), pod("b", "n1", UID_B, 1), pod("done", "n1", UID_C, 4, phase="Succeeded")]
    findings, summary = _consistency.check([node("n1", 2)], pods, {})
    assert ids(findings) == ["allocated_exceeds_declared"] and findings[0]["found"] == {"nvidia.com/gpu": 3}
    assert summary["n1"]["allocated"] == {"nvidia.com/gpu": 3}


def test_memory_cross_sharing_without_request():
    processes = [{"gpu": i, "pid": 77, "used_memory_mib": 2048, "cgroup": cgroup(UID_B, CID_B)} for i in range(4)]
    processes.append({"gpu": 1, "pid": 10, "used_memory_mib": 4096, "cgroup": cgroup(UID_A, CID_A, "guaranteed")})
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    pods = [pod("train", "n1", UID_A, 1, CID_A), pod("sneaky", "n1", UID_B, 0, CID_B, env=env)]
    findings, _ = _consistency.check([node("n1", 4)], pods, {"n1": {"gpu_count": 4, "gpus": gpus(4), "processes": processes}})
    assert ids(findings) == ["gpu_process_without_allocation", "visible_devices_without_request"]
    sneaky = next(f for f in findings if f["id"] == "gpu_process_without_allocation")
    assert sneaky["pod"]["name"] == "sneaky" and sneaky["found"]["devices"] == 4 and sneaky["found"]["pids"] == [77]
    assert [g["minor"] for g in sneaky["found"]["gpus"]] == [0, 1, 2, 3]


def test_pod_uses_more_gpus_than_requested():
    processes = [{"gpu": i, "pid": 10, "used_memory_mib": 1, "cgroup": cgroup(UID_A, CID_A)} for i in range(2)]
    findings, _ = _consistency.check([node("n1", 2)], [pod("a", "n1", UID_A, 1, CID_A)], {"n1": {"gpu_count": 2, "gpus": gpus(2), "processes": processes}})
    assert ids(findings) == ["gpu_process_exceeds_allocation"]


def test_processes_outside_pods_unknown_pods_and_unattributed():
    processes = [
        {"gpu": 0, "pid": 1, "cgroup": "/system.slice/dcgm.service"},
        {"gpu": 0, "pid": 2, "cgroup": cgroup(UID_C, CID_C)},
        {"gpu": 0, "pid": 3},
    ]
    findings, _ = _consistency.check([node("n1", 1)], [], {"n1": {"gpu_count": 1, "gpus": gpus(1), "processes": processes}})
    assert ids(findings) == ["gpu_process_outside_pods", "gpu_process_unattributed", "gpu_process_unknown_pod"]


def test_nvml_check_shape_with_process_cgroups():
    nvml = {"changed": False, "gpu_count": 2, "findings": [],
            "gpus": [{"index": 0, "minor": 0, "uuid": "GPU-0", "mig": {"capable": False}}, {"index": 1, "minor": 1, "uuid": "GPU-1", "mig": None}],
            "processes": [{"gpu": 1, "gpu_uuid": "GPU-1", "pid": 42, "used_memory_mib": 5, "gpu_instance_id": None, "mig_device_uuid": None}],
            "process_cgroups": {"42": "0::" + cgroup(UID_B, CID_B) + "\n"}}
    findings, _ = _consistency.check([node("n1", 2)], [pod("b", "n1", UID_B, 0, CID_B)], {"n1": nvml})
    assert ids(findings) == ["gpu_process_without_allocation"]
    assert findings[0]["found"]["gpus"][0]["uuid"] == "GPU-1"


def test_exact_devices_from_pod_resources():
    processes = [{"gpu_uuid": "GPU-1", "pid": 10, "used_memory_mib": 1, "cgroup": cgroup(UID_A, CID_A)},
                 {"gpu_uuid": "GPU-0", "pid": 20, "used_memory_mib": 1, "cgroup": cgroup(UID_B, CID_B)}]
    pods = [pod("a", "n1", UID_A, 1, CID_A), pod("b", "n1", UID_B, 1, CID_B)]
    resources = {"n1": [
        {"namespace": "ml", "name": "a", "containers": [{"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-0"]}]}]},
        {"namespace": "ml", "name": "b", "containers": [{"name": "main", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-2::1"]}]}]},
    ]}
    report = {"gpu_count": 3, "gpus": gpus(3), "processes": processes}
    findings, summary = _consistency.check([node("n1", 3)], pods, {"n1": report}, resources)
    assert ids(findings) == ["device_used_by_other_container", "gpu_process_on_unallocated_device"]
    other = next(f for f in findings if f["id"] == "device_used_by_other_container")
    assert other["pod"]["name"] == "b" and other["found"]["allocated_to"] == ["ml/a/main"]
    assert summary["n1"]["pod_resources"] is True


def test_nodes_option_limits_and_reports_missing_nodes():
    findings, summary = _consistency.check([node("n1"), node("n2")], [], {}, wanted=["n2", "ghost"])
    assert set(summary) == {"n2"}
    assert ids(findings) == ["gpu_not_advertised", "node_not_found"]


def test_one_unreadable_pod_does_not_stop_the_check():
    bad = pod("bad", "n1", UID_A, 1)
    bad["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "lots"
    findings, _ = _consistency.check([node("n1", 1)], [bad], {})
    assert ids(findings) == ["pod_unreadable"]


def test_process_cgroup_path_forms():
    assert _cgroup_paths.process_cgroup_path("0::/a/b\n") == "/a/b"
    assert _cgroup_paths.process_cgroup_path("/a/b") == "/a/b"
    assert _cgroup_paths.process_cgroup_path("12:devices:/kubepods/besteffort/podx/y\n1:name=systemd:/init.scope\n") == "/kubepods/besteffort/podx/y"
    assert _cgroup_paths.process_cgroup_path("") is None and _cgroup_paths.process_cgroup_path(None) is None


def test_severity_helpers():
    findings = [{"severity": "warning"}, {"severity": "critical"}]
    assert _findings.max_severity(findings) == "critical" and _findings.max_severity([]) is None
    assert _findings.should_fail(findings, "error") and not _findings.should_fail([{"severity": "info"}], "warning")
    assert not _findings.should_fail(findings, "never")


def test_linear_in_nodes_and_pods():
    nodes = [node("k%d" % n, 8) for n in range(2000)]
    pods = [pod("p%d" % n, "k%d" % (n % 2000), "uid-%d" % n, 2) for n in range(8000)]
    findings, summary = _consistency.check(nodes, pods, {})
    assert findings == [] and len(summary) == 2000 and summary["k0"]["allocated"] == {"nvidia.com/gpu": 8}


# ---------------------------------------------------------------------------------------------
# Malformed input: clear message naming the option, node and field


@pytest.mark.parametrize(("reports", "resources", "message"), [
    ({"n1": []}, None, "node_reports[n1]=[] must be a dictionary"),
    ({"n1": {"gpu_count": -1}}, None, "node_reports[n1].gpu_count=-1 must be an integer >= 0"),
    ({"n1": {"gpu_count": "8"}}, None, "node_reports[n1].gpu_count='8'"),
    ({"n1": {"gpu_count": True}}, None, "node_reports[n1].gpu_count=True"),
    ({"n1": {"gpus": "GPU-0"}}, None, "node_reports[n1].gpus='GPU-0' must be a list"),
    ({"n1": {"gpus": ["GPU-0"]}}, None, "node_reports[n1].gpus[0]='GPU-0' must be a dictionary"),
    ({"n1": {"gpus": [{"index": "zero"}]}}, None, "node_reports[n1].gpus[0].index='zero'"),
    ({"n1": {"gpus": [{"index": 0, "uuid": 5}]}}, None, "node_reports[n1].gpus[0].uuid=5 must be a string"),
    ({"n1": {"gpus": [{"index": 0, "mig": "on"}]}}, None, "node_reports[n1].gpus[0].mig='on' must be a dictionary"),
    ({"n1": {"gpus": [{"index": 0, "mig": {"mode_current": "enabled", "layout": {"1g.10gb": "x"}}}]}}, None, "mig.layout[1g.10gb]='x'"),
    ({"n1": {"processes": [{"gpu": 0}]}}, None, "node_reports[n1].processes[0].pid=None must be an integer >= 1"),
    ({"n1": {"processes": [{"pid": 5}]}}, None, "node_reports[n1].processes[0] names no GPU"),
    ({"n1": {"processes": [{"pid": 5, "gpu": 0, "used_memory_mib": -3}]}}, None, "processes[0].used_memory_mib=-3"),
    ({"n1": {"processes": [{"pid": 5, "gpu": 0, "cgroup": ["/a"]}]}}, None, "processes[0].cgroup=['/a'] must be a string"),
    ({"n1": {"processes": "none"}}, None, "node_reports[n1].processes='none' must be a list"),
    ({"n1": {"process_cgroups": ["/a"]}}, None, "node_reports[n1].process_cgroups=['/a'] must be a dictionary"),
    ({"n1": {"mig_devices": [3]}}, None, "node_reports[n1].mig_devices[0]=3 must be a dictionary"),
    ({}, {"n1": {"pods": []}}, "pod_resources[n1]={'pods': []} must be a list"),
    ({}, {"n1": [{"containers": "main"}]}, "pod_resources[n1][0].containers='main' must be a list"),
    ({}, {"n1": [{"containers": [{"devices": [{"resource_name": "nvidia.com/gpu", "device_ids": "GPU-0"}]}]}]}, "device_ids='GPU-0' must be a list"),
])
def test_malformed_reports(reports, resources, message):
    with pytest.raises(GpuhardenError) as error:
        _consistency.validate(reports, resources)
    assert message in error.value.msg, error.value.msg


def test_malformed_replicas():
    with pytest.raises(GpuhardenError, match="option sharing_replicas=0 must be an integer >= 1"):
        _consistency.validate({}, None, 0)


def test_module_refuses_bad_report_before_connecting(world_tmp):
    # No kubeconfig exists: a clean failure about the report shows validation ran first.
    result = run_module("gpu_consistency", {"node_reports": {"n1": {"gpu_count": -1}}, "kubeconfig": str(world_tmp / "missing")}, {})
    assert result["failed"] is True and "node_reports[n1].gpu_count=-1" in result["msg"]


def test_module_bad_page_limit():
    result = run_module("gpu_consistency", {"page_limit": 0}, {})
    assert result["failed"] is True and "option page_limit=0" in result["msg"]


# ---------------------------------------------------------------------------------------------
# process_cgroup_info


def test_process_cgroup_info_reads_a_temp_proc(world_tmp):
    path = cgroup(UID_A, CID_A)
    (world_tmp / "proc/100").mkdir(parents=True)
    (world_tmp / "proc/100/cgroup").write_text("0::%s\n" % path)
    (world_tmp / "proc/200").mkdir(parents=True)
    (world_tmp / "proc/200/cgroup").write_text("0::/system.slice/sshd.service\n")
    result = run_module("process_cgroup_info", {"root": str(world_tmp), "pids": [100, 200, 300]}, {})
    assert result["changed"] is False
    assert result["cgroups"] == {"100": path, "200": "/system.slice/sshd.service"}
    assert result["containers"] == {"100": {"pod_uid": UID_A, "container_id": CID_A, "driver": "systemd", "qos": "besteffort"}}
    assert result["missing"] == [300]


def test_process_cgroup_info_rejects_bad_pid(world_tmp):
    result = run_module("process_cgroup_info", {"root": str(world_tmp), "pids": [0]}, {})
    assert result["failed"] is True and "pids[0]=0 is not a process ID" in result["msg"]


def test_exited_processes_are_left_out():
    report = {"gpu_count": 1, "gpus": gpus(1), "processes": [{"gpu": 0, "pid": 4242, "used_memory_mib": 5}], "missing_pids": [4242]}
    findings, summary = _consistency.check([node("n1", 1)], [], {"n1": report})
    assert findings == [] and summary["n1"]["used"]["exited_processes"] == 1
    with pytest.raises(GpuhardenError, match=r"node_reports\[n1\].missing_pids\[0\]='x'"):
        _consistency.validate({"n1": {"missing_pids": ["x"]}})


def test_mig_profiles_come_from_the_mig_devices_when_they_are_named():
    """The physical MIG profiles are per MIG device (compute instance), as NVML names them."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency

    devices = [{"uuid": "MIG-%d" % i, "name": "NVIDIA H100 80GB HBM3 MIG 1c.3g.40gb"} for i in range(3)]
    devices.append({"uuid": "MIG-9", "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb"})
    raw = {"gpus": [{"index": 0, "uuid": "GPU-0", "mig": {"mode_current": "enabled", "layout": {"3g.40gb": 1, "1g.10gb": 1},
                                                          "devices": devices}}]}
    report = _consistency.normalize_report("n", raw)
    assert report["mig_profiles"] == {"1c.3g.40gb": 3, "1g.10gb": 1} and report["mig_devices"] == 4
    # without device names the GPU-instance layout is all there is
    raw["gpus"][0]["mig"]["devices"] = [{"uuid": "MIG-0"}]
    assert _consistency.normalize_report("n", raw)["mig_profiles"] == {"3g.40gb": 1, "1g.10gb": 1}
    assert _consistency.mig_device_profile("NVIDIA A100 MIG 2g.20gb") == "2g.20gb"
    assert _consistency.mig_device_profile("NVIDIA A100") is None


# -- issue 13 item 6: MIG resource names as the real device plugin advertises them ---------------------------


def _named_mig_gpu(index, names):
    devices = [{"uuid": "MIG-%d-%d" % (index, n), "name": "NVIDIA H100 80GB HBM3 MIG " + name} for n, name in enumerate(names)]
    return {"index": index, "uuid": "GPU-%d" % index, "mig": {"mode_current": "enabled", "devices": devices}}


def test_item06_split_gpu_instance_is_advertised_under_the_gpu_instance_profile():
    """The real v0.18.2 binary on the NVML double: three 1c.3g.40gb devices -> nvidia.com/mig-3g.40gb x3 (its patterns,
    internal/rm/rm.go, match unanchored)."""
    report = {"gpu_count": 1, "gpus": [_named_mig_gpu(0, ["1c.3g.40gb"] * 3 + ["2g.20gb"] * 2)]}
    real = node("n1", extra={"nvidia.com/mig-3g.40gb": "3", "nvidia.com/mig-2g.20gb": "2"})
    assert _consistency.check([real], [], {"n1": report})[0] == []
    # what the previous prediction expected is not what any plugin release advertises
    invented = node("n1", extra={"nvidia.com/mig-1c.3g.40gb": "3", "nvidia.com/mig-2g.20gb": "2"})
    [item] = _consistency.check([invented], [], {"n1": report})[0]
    assert item["id"] == "mig_not_advertised"
    assert item["expected"]["resources"] == {"mixed": None,
                                             "mixed_legacy": {"nvidia.com/mig-3g.40gb": 3, "nvidia.com/mig-2g.20gb": 2}}
    assert "1c.3g.40gb" in item["hint"] and "v0.20.0" in item["hint"]  # v0.20.0+ does not start on a split instance
    assert _consistency.expected_mig_resources({"1c.3g.40gb": 3})["mixed_legacy"] == {"nvidia.com/mig-3g.40gb": 3}


def test_item06_attribute_profiles_plus_becomes_dot_or_the_plain_name_before_v0_20():
    report = {"gpu_count": 1, "gpus": [_named_mig_gpu(0, ["1g.10gb+me"] + ["1g.10gb"] * 6)]}
    anchored = node("n1", extra={"nvidia.com/mig-1g.10gb.me": "1", "nvidia.com/mig-1g.10gb": "6"})
    legacy = node("n1", extra={"nvidia.com/mig-1g.10gb": "7"})
    assert _consistency.check([anchored], [], {"n1": report})[0] == []
    assert _consistency.check([legacy], [], {"n1": report})[0] == []
    plus = node("n1", extra={"nvidia.com/mig-1g.10gb+me": "1", "nvidia.com/mig-1g.10gb": "6"})
    assert ids(_consistency.check([plus], [], {"n1": report})[0]) == ["mig_not_advertised"]
    assert _consistency.expected_mig_resources({"1g.24gb-me": 4, "2g.48gb+gfx": 1}) == {
        "mixed": {"nvidia.com/mig-1g.24gb-me": 4, "nvidia.com/mig-2g.48gb.gfx": 1},
        "mixed_legacy": {"nvidia.com/mig-1g.24gb": 4, "nvidia.com/mig-2g.48gb": 1}}


# -- issue 13 item 5: pods requesting a resource name no node advertises ----------------------------------


def _pending(name, uid, resource, count=1):
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {resource: str(count)}}}]},
            "status": {"phase": "Pending"}}


def test_item05_pending_pods_requesting_a_misspelled_gpu_resource():
    nodes = [node("n1", 2), node("n2", 2)]
    pods = [_pending("train-0", UID_A, "nvidia.com/gpus"), _pending("train-1", UID_B, "nvidia.com/gpus"),
            _pending("notebook", UID_C, "nvidia-gpu"), pod("ok", "n1", "u-ok", 1)]
    findings, _ = _consistency.check(nodes, pods, {})
    wrong = [f for f in findings if f["id"] == "requested_resource_not_advertised"]
    assert [(f["node"], f["found"]["resource"], f["found"]["pods"], f["found"]["close_match"]) for f in wrong] == [
        (None, "nvidia-gpu", ["ml/notebook"], "nvidia.com/gpu"),
        (None, "nvidia.com/gpus", ["ml/train-0", "ml/train-1"], "nvidia.com/gpu")]
    assert all(f["severity"] == "error" and f["expected"] == {"advertised": ["nvidia.com/gpu"]} for f in wrong)
    assert wrong[0]["pod"] == {"namespace": "ml", "name": "notebook", "uid": UID_C} and wrong[1]["pod"] is None
    assert "did you mean nvidia.com/gpu?" in wrong[1]["hint"]
    assert ids(findings) == ["requested_resource_not_advertised"] * 2


def test_item05_bound_pod_with_unadvertised_name_belongs_to_its_node_and_plugin_outages_are_not_typos():
    nodes = [node("n1", 2, extra={"nvidia.com/mig-1g.10gb": "7"}), node("n2")]
    bound = pod("mig-me", "n1", UID_A, 1, resource="nvidia.com/mig-1g.10gb.me")
    findings, _ = _consistency.check(nodes, [bound], {}, wanted=["n1"])
    [item] = [f for f in findings if f["id"] == "requested_resource_not_advertised"]
    assert item["node"] == "n1" and item["found"]["close_match"] == "nvidia.com/mig-1g.10gb"
    assert ids(_consistency.check(nodes, [bound], {}, wanted=["n2"])[0]) == ["gpu_not_advertised"]  # n1's pod not counted
    # no node advertises anything of the plugin: the plugin is missing (gpu_not_advertised), not a wrong name
    findings, _ = _consistency.check([node("n3")], [_pending("p", UID_B, "nvidia.com/gpu")], {})
    assert "requested_resource_not_advertised" not in ids(findings)
    # other resources are not GPU resources
    assert _consistency.check([node("n1", 1)], [_pending("p", UID_B, "example.com/fpga")], {})[0] == []
    # terminated pods do not count
    done = dict(_pending("p", UID_B, "nvidia.com/gpus"), status={"phase": "Failed"})
    assert _consistency.check([node("n1", 1)], [done], {})[0] == []


def test_a_cordon_an_ended_gpuharden_run_left_is_named_with_its_run():
    """Issue 43, item 8: drift names the cordon an interrupted harden left (node_maintenance's record), remediable by the
    next harden; a cordon without the record (an admin's) and a record on a schedulable node are no finding."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _drain

    record = _drain.record_value({"owner": "harden@20260701T120000-7", "at": "2026-07-01T12:00:03Z", "for": "kubelet_topology"})
    left, admin, stale = node("left", 2), node("admin", 2), node("stale", 2)
    left["metadata"]["annotations"] = {_drain.CORDON_ANNOTATION: record}
    stale["metadata"]["annotations"] = {_drain.CORDON_ANNOTATION: record}
    left["spec"] = admin["spec"] = {"unschedulable": True}
    report = {"gpu_count": 2, "gpus": gpus(2)}
    findings, _ = _consistency.check([left, admin, stale], [], {"left": report, "admin": report, "stale": report})
    [item] = findings
    assert item["id"] == "node_left_cordoned" and item["node"] == "left" and item["severity"] == "error"
    assert item["found"] == {"cordoned_by": "harden@20260701T120000-7", "at": "2026-07-01T12:00:03Z", "for": "kubelet_topology"}
    assert item["remediable"] is True and item["stage"] == "kubelet_topology" and item["check"] == "consistency"
    assert "harden@20260701T120000-7" in item["hint"] and "releases" in item["hint"]
    left["metadata"]["annotations"][_drain.CORDON_ANNOTATION] = "by hand"
    [item] = _consistency.check([left], [], {"left": report})[0]
    assert item["found"] == {"record": "by hand"} and "unreadable record" in item["hint"]
