# SPDX-License-Identifier: GPL-3.0-or-later
"""Role cgroup_limits and modules cgroup_memory / gpu_pods_info on the seed-failures lab, over SSH.

seed-memory-high runs infer-0 and infer-1 (1 GPU, memory limit 16Gi, memory.high=max) and notebook
(1 GPU, no limit).  Check mode changes nothing; the apply sets memory.high = floor(16Gi x 0.9 / 4096) x
4096 on both pods' pod and container cgroups and reports notebook; a second run changes nothing, not
even an mtime.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import ansible_runner
import pytest
import yaml
from gpuharden_lab import REPO_ROOT, manager, pods

from tests.labfixtures import discard_shared_lab, shared_lab

pytestmark = pytest.mark.lab

PLAYBOOK = REPO_ROOT / "tests/integration/playbooks/cgroup_limits.yml"
NODE = "seed-memory-high"
VIEW = "/var/lib/gpuharden-memcg"
GI = 1024**3
EXPECTED = (16 * GI * 9 // 10) // 4096 * 4096  # 15461879808
# Every file of the memory view with its hash and mtime (nanoseconds).
SNAPSHOT = "cd %s && find . -type f -printf '%%p %%T@ ' -exec sha256sum {} \\; | sort" % VIEW
# Durable part: through gpuharden.k8s.kubelet_topology when that role is present (written in parallel).
KUBELET_ROLE = (REPO_ROOT / "roles/kubelet_topology/tasks/main.yml").exists()


def _ssh(state, node, command):
    result = manager.ssh(state["nodes"][node]["address"], command)
    assert result.returncode == 0, "%s: %s\n%s" % (node, command, result.stderr)
    return result.stdout


def _lab_workarounds(state):
    """Until the lab writes them itself (see the report): cgroup.controllers at the memory view's root, as on
    a cgroup v2 root with the memory controller, and the view of notebook, a GPU pod without a memory limit
    (memory.max = max, as the kubelet leaves a pod cgroup without limits)."""
    commands = [f"test -e {VIEW}/cgroup.controllers || echo 'cpuset cpu io memory hugetlb pids' > {VIEW}/cgroup.controllers"]
    for pod in state["pods"]:
        if pod["node"] == NODE and pod["name"] == "notebook":
            container = pods.kubelet_cgroup_path(pod["uid"], pod["container_id"], "besteffort", "systemd")
            for cgroup in (container.rsplit("/", 1)[0], container):
                base = VIEW + cgroup
                commands.append(f"test -e {base}/memory.max || {{ mkdir -p {base} && echo max > {base}/memory.max && echo max > {base}/memory.high; }}")
    _ssh(state, NODE, " && ".join(commands))


@pytest.fixture(scope="module")
def lab():
    # The last user of the seed-failures lab it shares (tests/xdist_shared_lab.py): what it changes is not put back.
    with shared_lab("seed-failures") as state:
        _lab_workarounds(state)
        try:
            yield state
        finally:
            discard_shared_lab()


def _pods(state, name=None):
    found = {pod["name"]: pod for pod in state["pods"] if pod["node"] == NODE}
    return found[name] if name else found


def _memory_files(state):
    """{cgroup path: (memory.max, memory.high)} under the view, as the node sees them."""
    script = 'cd %s && for f in $(find . -name memory.high | sort); do d=${f%%/memory.high}; echo "${d#.} $(cat $d/memory.max) $(cat $f)"; done'
    out = _ssh(state, NODE, script % VIEW)
    return {line.split()[0]: tuple(line.split()[1:]) for line in out.splitlines()}


def _run(state, *, check=False, extravars=None, playbook=None, module=None, module_args=None, host_pattern=None):
    """ansible-runner over the lab inventory: (events, stats, seconds)."""
    envvars = {
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    with tempfile.TemporaryDirectory(prefix="gpuharden-cgroup-test-") as private:
        started = time.monotonic()
        kwargs = {"playbook": str(playbook or PLAYBOOK)} if module is None else {"module": module, "module_args": module_args, "host_pattern": host_pattern}
        runner = ansible_runner.run(
            private_data_dir=private, project_dir=str(REPO_ROOT), inventory=state["inventory"], envvars=envvars,
            extravars=extravars or {}, cmdline="--check --diff" if check else None, quiet=True, **kwargs,
        )
        elapsed = time.monotonic() - started
        events = list(runner.events)
        stats = runner.stats or {}
    return events, stats, elapsed


def _results(events, action=None, name=None):
    found = []
    for event in events:
        if event.get("event") not in ("runner_on_ok", "runner_on_failed", "runner_on_skipped"):
            continue
        data = event["event_data"]
        if (action and data.get("task_action") != action) or (name and name not in data.get("task", "")):
            continue
        found.append(dict(data.get("res") or {}, _host=data["host"], _event=event["event"], _task=data.get("task")))
    return found


def _failures(events):
    return [(r["_host"], r["_task"], r.get("msg")) for r in _results(events) if r["_event"] == "runner_on_failed"]


def _extravars():
    return {"cgroup_limits_kubelet": False}


def test_check_apply_reapply(lab):
    infer = [_pods(lab, "infer-0"), _pods(lab, "infer-1")]
    notebook = _pods(lab, "notebook")
    before = _ssh(lab, NODE, SNAPSHOT)
    files_before = _memory_files(lab)
    assert sum(1 for max_, high in files_before.values() if max_ == str(16 * GI) and high == "max") == 4, files_before

    # Check mode: predicts the writes, touches nothing.
    events, stats, checked_s = _run(lab, check=True, extravars=_extravars())
    assert _failures(events) == []
    [checked] = _results(events, action="gpuharden.k8s.cgroup_limits_immediate", name="set memory.high")
    assert checked["changed"] is True
    assert len(checked["updated"]) == 4 and {u["after"] for u in checked["updated"]} == {str(EXPECTED)}
    assert _ssh(lab, NODE, SNAPSHOT) == before

    # Apply.
    events, stats, applied_s = _run(lab, extravars=_extravars())
    assert _failures(events) == []
    [applied] = _results(events, action="gpuharden.k8s.cgroup_limits_immediate", name="set memory.high")
    assert applied["changed"] is True
    assert applied["updated"] == checked["updated"]
    files = _memory_files(lab)
    for pod in infer:
        container = pods.kubelet_cgroup_path(pod["uid"], pod["container_id"], "burstable", "systemd")
        for cgroup in (container.rsplit("/", 1)[0], container):
            assert files[cgroup] == (str(16 * GI), str(EXPECTED)), cgroup
    notebook_pod = pods.kubelet_cgroup_path(notebook["uid"], notebook["container_id"], "besteffort", "systemd").rsplit("/", 1)[0]
    assert files[notebook_pod] == ("max", "max")
    assert applied["unlimited_pods"] == [notebook["uid"]] and applied["not_found"] == []
    # the same task hands the report to the run's statistics (cgroup_limits_immediate's ansible_stats)
    node_report = applied["ansible_stats"]["data"]["gpuharden_cgroup_limits"][NODE]
    assert node_report == applied["report"]
    assert node_report["unlimited_pods"] == ["ml/notebook"]
    assert len(node_report["updated"]) == 4
    [listing] = _results(events, action="gpuharden.k8s.cgroup_limits_immediate", name="list the GPU pods")
    assert listing["api_requests"] == 1
    assert sorted(p["name"] for p in listing["pods"]) == ["infer-0", "infer-1", "notebook"]
    after = _ssh(lab, NODE, SNAPSHOT)

    # Re-apply: nothing changes, not a byte, not an mtime.
    events, stats, reapplied_s = _run(lab, extravars=_extravars())
    assert _failures(events) == []
    assert stats.get("changed", {}).get(NODE, 0) == 0, stats
    [again] = _results(events, action="gpuharden.k8s.cgroup_limits_immediate", name="set memory.high")
    assert again["changed"] is False and again["updated"] == []
    assert _ssh(lab, NODE, SNAPSHOT) == after
    print("\ncgroup_limits on %s: check %.1fs, apply %.1fs, re-apply %.1fs" % (NODE, checked_s, applied_s, reapplied_s))


def test_node_without_memory_controller_is_refused(lab):
    # The node's real cgroup2 root (not the lab's memory view) has no memory controller on this machine.
    events, _stats, _s = _run(lab, extravars=dict(_extravars(), cgroup_limits_test_hosts="seed-dev-perm",
                                                  cgroup_limits_cgroup_root="/sys/fs/cgroup"))
    [(host, task, msg)] = _failures(events)
    assert host == "seed-dev-perm" and "Preflight" in task
    assert "/sys/fs/cgroup is cgroup v2 but /sys/fs/cgroup/cgroup.controllers (" in msg and "has no memory controller" in msg


def test_gpu_pods_info_one_list_for_several_nodes(lab):
    kube = lab["cluster"]
    args = "nodes=%s,seed-isolation kubeconfig=%s" % (NODE, kube["admin_kubeconfig"])
    events, _stats, _s = _run(lab, module="gpuharden.k8s.gpu_pods_info", module_args=args, host_pattern="localhost",
                              extravars={"ansible_python_interpreter": sys.executable})
    [result] = _results(events)
    assert result["_event"] == "runner_on_ok", result
    assert result["api_requests"] == 1
    names = {(p["node"], p["name"]) for p in result["pods"]}
    assert {(NODE, "infer-0"), (NODE, "infer-1"), (NODE, "notebook"), ("seed-isolation", "train-ok")} <= names
    assert ("seed-isolation", "privileged-debug") not in names  # no GPU request
    infer = next(p for p in result["pods"] if p["name"] == "infer-0")
    assert infer["uid"] == _pods(lab, "infer-0")["uid"]
    assert infer["memory_limit_bytes"] == 16 * GI and infer["gpu_requests"] == {"nvidia.com/gpu": 1}
    assert infer["qos_class"] == "Burstable"
    assert [p["name"] for p in result["unlimited_pods"] if p["node"] == NODE] == ["notebook"]


def test_gpu_pods_info_without_rbac_is_a_clear_error(lab):
    args = "nodes=%s kubeconfig=%s" % (NODE, lab["cluster"]["no_rbac_kubeconfig"])
    events, _stats, _s = _run(lab, module="gpuharden.k8s.gpu_pods_info", module_args=args, host_pattern="localhost",
                              extravars={"ansible_python_interpreter": sys.executable})
    [result] = _results(events)
    assert result["_event"] == "runner_on_failed"
    # the one RBAC-aware 403 of k8s/_k8s_access: who, what and where the shipped RBAC is
    assert "gpu_pods_info: forbidden: " in result["msg"] and ' may not list pods (API group "" (core)) at cluster scope' in result["msg"]
    assert "deploy/rbac/gpuharden-rbac.yaml" in result["msg"], result["msg"]


@pytest.mark.skipif(not KUBELET_ROLE, reason="role gpuharden.k8s.kubelet_topology is not in this checkout yet")
def test_durable_fix_through_kubelet_topology(lab):
    extravars = {"cgroup_limits_immediate": False, "cgroup_limits_kubelet": True}
    events, _stats, _s = _run(lab, extravars=extravars)
    assert _failures(events) == []
    # the durable route on a v1.36 kubeadm node: gpuharden's drop-in, read through --config-dir (kubelet_topology)
    config = yaml.safe_load(_ssh(lab, NODE, "cat /etc/kubernetes/kubelet.conf.d/50-gpuharden.conf"))
    assert config["featureGates"]["MemoryQoS"] is True
    assert config["memoryThrottlingFactor"] == 0.9
    events, stats, _s = _run(lab, extravars=extravars)
    assert _failures(events) == []
    assert stats.get("changed", {}).get(NODE, 0) == 0, json.dumps(stats)
