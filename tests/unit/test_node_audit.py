# SPDX-License-Identifier: GPL-3.0-or-later
"""node_audit: one module run reports drift exactly where the remediation modules in check mode would change."""

from __future__ import annotations

import resource
import shutil
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from gpuharden_lab.noderoot import build_node_root

from tests.unit.conftest import run_module, tree_snapshot

FIXTURES = Path(__file__).parent / "fixtures"
KUBELET = {"topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static", "reserved_system_cpus": "0-1"}
# check name -> (remediation module, its options for this test)
SECTIONS = {
    "device_nodes": ("nvidia_device_nodes", {"policy": "default"}),
    "containerd": ("containerd_nvidia_runtime", {"runtime_name": "nvidia"}),
    "kubelet": ("kubelet_config", dict(KUBELET, remove_stale_state=True)),
}


def _node(world_tmp, **device_overrides):
    """An L4 node root with a kubeadm kubelet and a containerd v2 config without the nvidia runtime."""
    node = build_node_root(world_tmp / "node", "l4", device_overrides=device_overrides)
    root = node.root
    (root / "dev/char").mkdir(exist_ok=True)
    shutil.copytree(FIXTURES / "kubelet/kubeadm", root, dirs_exist_ok=True)
    (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "containerd/v2-single.toml", root / "etc/containerd/config.toml")
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)  # the toolkit's runtime binary (containerd_nvidia_runtime checks it)
    (root / "usr/bin/nvidia-container-runtime").write_text("#!/bin/sh\n")
    (root / "usr/bin/nvidia-container-runtime").chmod(0o755)
    # the unit's kubelet, as `kubelet --version` answers: v1.32 or later takes the durable --config-dir route
    (root / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/local/bin/kubelet").write_text('#!/bin/sh\necho "Kubernetes v1.36.3"\n')
    (root / "usr/local/bin/kubelet").chmod(0o755)
    for name, text in (("passwd", "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n"),
                       ("group", "root:x:0:\nnogroup:x:65534:\n")):
        (root / "etc" / name).write_text(text)
    return root


def _audit(root, **sections):
    result = run_module("node_audit", dict({"root": str(root), "_ansible_check_mode": True}, **sections), {})
    assert not result.get("failed"), result
    return result


def _remediate(root, name, check):
    module, options = SECTIONS[name]
    result = run_module(module, dict({"root": str(root), "_ansible_check_mode": check}, **options), {})
    assert not result.get("failed"), result
    return result["changed"]


def _remediable(result, check):
    return [entry for entry in result["findings"] if entry["check"] == check and entry["remediable"]]


def test_audit_reports_exactly_what_check_mode_would_change_then_nothing_after_the_fix(world_tmp):
    root = _node(world_tmp, **{"/dev/nvidia0": {"mode": 0o600}})
    before = tree_snapshot(root)
    audit = _audit(root, **{name: options for name, (_module, options) in SECTIONS.items()})
    assert tree_snapshot(root) == before, "the audit changed the node"
    for name in SECTIONS:
        would_change = _remediate(root, name, check=True)
        assert would_change, name
        assert bool(_remediable(audit, name)) == would_change, (name, audit["checks"][name])
        assert audit["checks"][name]["would_change"] is True
    assert tree_snapshot(root) == before, "check mode changed the node"
    ids = {entry["id"] for entry in audit["findings"]}
    assert {"device_node_permissions", "device_permissions_not_persisted", "containerd_nvidia_runtime", "kubelet_setting"} <= ids
    wrong = next(entry for entry in audit["findings"] if entry["id"] == "device_node_permissions")
    assert wrong["path"] == "/dev/nvidia0" and "0600" in wrong["found"] and "0666" in wrong["expected"]
    kubelet = {entry["subject"]: entry for entry in audit["findings"] if entry["id"] == "kubelet_setting"}
    assert kubelet["topologyManagerPolicy"]["expected"] == "single-numa-node"
    assert kubelet["topologyManagerPolicy"]["stage"] == "kubelet_topology"
    assert audit["summary"]["stages"] == ["container_runtime", "device_permissions", "kubelet_topology"]

    for name in SECTIONS:
        assert _remediate(root, name, check=False)
    clean = _audit(root, **{name: options for name, (_module, options) in SECTIONS.items()})
    for name in SECTIONS:
        assert _remediable(clean, name) == [], clean["findings"]
        assert clean["checks"][name]["status"] == "ok"
        assert not _remediate(root, name, check=True), name
    assert clean["summary"]["stages"] == []


def test_omitted_checks_are_skipped_and_a_broken_check_does_not_stop_the_others(world_tmp):
    root = _node(world_tmp)
    before = tree_snapshot(root)
    audit = _audit(root, device_nodes={"policy": "custom-ish"}, containerd={"runtime_name": "nvidia"})
    assert tree_snapshot(root) == before
    assert audit["checks"]["kubelet"] == {"status": "skipped"}
    # could not check: its cause and fix, and no finding (a blind check is neither drift nor clean)
    assert audit["checks"]["device_nodes"]["status"] == "not_checked"
    [blind] = audit["checks"]["device_nodes"]["not_checked"]
    assert blind["what"] == "device_nodes" and "policy" in blind["cause"] and "custom-ish" in blind["cause"] and blind["fix"]
    assert not [entry for entry in audit["findings"] if entry["check"] == "device_nodes"]
    assert audit["summary"]["not_checked"] == ["device_nodes"]
    assert audit["checks"]["containerd"]["status"] == "drift"


def test_root_of_a_section_is_the_audit_root(world_tmp):
    root = _node(world_tmp)
    audit = _audit(root, containerd={"runtime_name": "nvidia", "root": "/somewhere/else"})
    assert audit["checks"]["containerd"]["status"] == "drift"


def test_section_validation_names_the_section_and_field():
    with pytest.raises(GpuhardenError, match=r"option kubelet: .*cpu_manager_policy"):
        _node_audit.section_params("kubelet", _node_audit._kubelet.argument_spec(), {"cpu_manager_policy": "dynamic"}, "/")
    with pytest.raises(GpuhardenError, match=r"option mig must be a dict"):
        _node_audit.section_params("mig", _node_audit._mig_spec(), ["2g.20gb"], "/")
    with pytest.raises(GpuhardenError, match=r"option mig: .*(config|layout)"):
        _node_audit.section_params("mig", _node_audit._mig_spec(), {}, "/", _node_audit._mig_rules())
    # None means "not given": the module default applies, as with omit
    params = _node_audit.section_params("device_nodes", _node_audit._device_nodes.argument_spec(), {"owner": None}, "/r")
    assert params["owner"] is None and params["policy"] == "default" and params["root"] == "/r"


def test_summary_orders_severities_and_collects_stages():
    def check(params):
        return True, [
            _findings.finding("device_char_link", "warning", 1, 2, "h"),
            _findings.finding("isolation_breach", "critical", 1, 2, "h"),
        ], {}

    original = _node_audit.CHECKS
    try:
        _node_audit.CHECKS = (("device_nodes", lambda: {"root": {"type": "path"}}, None, check),)
        result = _node_audit.audit({"root": "/", "device_nodes": {}})
    finally:
        _node_audit.CHECKS = original
    assert result["summary"]["max_severity"] == "critical"
    assert result["summary"]["stages"] == ["device_permissions"]
    assert result["summary"]["by_severity"] == {"warning": 1, "critical": 1}


def test_lock_is_given_back_unless_held_and_always_when_the_audit_fails(world_tmp):
    """harden plans with lock.hold: the lock stays with the run after the audit (its post-check gives it back); a
    drift check's lock is given back in the same module run; an audit that raises never keeps it."""
    root = _node(world_tmp)
    lock = world_tmp / "run.lock"
    given_back = _audit(root, containerd={"runtime_name": "nvidia"}, lock={"owner": "drift@1", "path": str(lock)})
    assert given_back["checks"]["containerd"]["status"] == "drift" and not lock.exists()
    held = _audit(root, containerd={"runtime_name": "nvidia"}, lock={"owner": "harden@1", "path": str(lock), "hold": True})
    assert held["checks"]["containerd"]["status"] == "drift" and '"harden@1"' in lock.read_text()
    refused = run_module("node_audit", {"root": str(root), "containerd": {}, "lock": {"owner": "drift@2", "path": str(lock)}}, {})
    assert refused["failed"] and "harden@1" in refused["msg"]
    assert '"harden@1"' in lock.read_text()  # another run's lock is left alone
    lock.unlink()

    def broken(params):
        raise RuntimeError("a bug in a check")

    original = _node_audit.CHECKS
    try:
        _node_audit.CHECKS = (("containerd", lambda: {"root": {"type": "path"}}, None, broken),)
        with pytest.raises(RuntimeError):
            _node_audit.audit({"root": str(root), "containerd": {}, "lock": {"owner": "harden@2", "path": str(lock), "hold": True}})
    finally:
        _node_audit.CHECKS = original
    assert not lock.exists()


def test_node_stages_is_harden_s_stage_table():
    """A stage runs where its check is not "ok" (drift, findings, an error, a check left out), MIG only where its
    check ran: each status of each check, alone, moves exactly its own stage."""
    every_ok = {name: {"status": "ok"} for name in _node_audit.CHECK_NAMES}
    assert _node_audit.node_stages(every_ok) == dict.fromkeys(("device_permissions", "container_runtime", "kubelet_topology", "mig", "cgroup_limits"), False)
    assert _node_audit.node_stages({})["mig"] is False and _node_audit.node_stages({})["container_runtime"] is True
    for status in ("drift", "findings", "error", "skipped"):
        for stage, check in _node_audit.NODE_STAGES:
            runs = _node_audit.node_stages(dict(every_ok, **{check: {"status": status}}))
            wanted = not (stage == "mig" and status == "skipped")
            assert runs == {name: name == stage and wanted for name, _check in _node_audit.NODE_STAGES}, (stage, status)


def test_lock_is_given_back_by_a_held_audit_only_on_a_compliant_gpu_node(world_tmp):
    """lock.release_if_compliant: the audit gives harden's held lock back itself where harden runs no node-side stage
    and the node shows the driver's GPUs; a stage to run, or no driver GPUs, keeps it held."""
    gpu_root = build_node_root(world_tmp / "gpu", "l4").root
    no_gpu_root = world_tmp / "cpu"
    no_gpu_root.mkdir()
    lock = world_tmp / "run.lock"
    statuses = {}

    def check(name):
        return lambda params: (statuses[name] == "drift", [], {})

    sections = {stage_check: {} for _stage, stage_check in _node_audit.NODE_STAGES if stage_check != "mig"}
    original = _node_audit.CHECKS
    try:
        _node_audit.CHECKS = tuple((name, lambda: {"root": {"type": "path"}}, None, check(name)) for name in sections)
        for root, drifted, held in ((gpu_root, None, False), (gpu_root, "kubelet", True), (no_gpu_root, None, True)):
            statuses.update(dict.fromkeys(sections, "ok"), **({drifted: "drift"} if drifted else {}))
            result = _node_audit.audit(dict(sections, root=str(root), lock={
                "owner": "harden@3", "path": str(lock), "hold": True, "release_if_compliant": True}))
            assert result["lock"] == {"held": held, "taken_over": None} and lock.exists() is held, (root, drifted)
            assert any(result["summary"]["node_stages"].values()) is bool(drifted)
            lock.unlink(missing_ok=True)
        statuses.update(dict.fromkeys(sections, "ok"))
        kept = _node_audit.audit(dict(sections, root=str(gpu_root), lock={"owner": "harden@4", "path": str(lock), "hold": True}))
        assert kept["lock"] == {"held": True, "taken_over": None} and '"harden@4"' in lock.read_text()
    finally:
        _node_audit.CHECKS = original


def test_facts_are_gpu_facts_of_the_same_run(world_tmp):
    root = _node(world_tmp)
    without = _audit(root, containerd={"runtime_name": "nvidia"})
    assert "ansible_facts" not in without
    node = build_node_root(world_tmp / "facts", "l4")
    audited = run_module("node_audit", {"root": str(node.root), "facts": True}, node.env())
    alone = run_module("gpu_facts", {"root": str(node.root)}, node.env())
    assert audited["ansible_facts"]["gpuharden"] == alone["ansible_facts"]["gpuharden"]
    assert audited["ansible_facts"]["gpuharden"]["gpu_count"] == 2 and len(audited["ansible_facts"]["gpuharden"]["driver_gpus"]) == 2


def test_cpu_seconds_are_the_whole_module_process_s(world_tmp):
    """What one audit costs the node: the module's process from the interpreter's start, imports included, which is
    all of this test's child's CPU (getrusage(RUSAGE_CHILDREN) counts it once the child is waited for)."""
    root = _node(world_tmp)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_module("node_audit", {"root": str(root), "containerd": {"runtime_name": "nvidia"}}, {})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert "msg" not in result, result.get("msg")
    # The interpreter's start and the imports are most of it: a figure of the checks only would be a fraction.  What
    # the module does after it measures (the JSON answer, the interpreter's exit) is not in it: up to a third of the
    # child on a loaded machine (0.28 of 0.43 CPU-s in one `make test`, where 0.7 of the child was asked before).
    assert 0.5 * child <= result["cpu_seconds"] <= child + 0.01, (result["cpu_seconds"], child)


# What roles/kubelet_topology/tasks/plan.yml reads of its plan; harden hands it node_audit's instead of a second read.
PLAN_FIELDS_THE_ROLE_READS = ("sources", "service", "cpu_manager_policy_changed", "memory_manager_policy_changed",
                              "stale_state_files", "restart_required", "persistence", "refused", "config_dir_route")


@pytest.mark.parametrize("checkpoint", [None, '{"policyName":"none","defaultCpuSet":"0-3","checksum":1}'])
def test_kubelet_plan_of_the_audit_is_the_kubelet_stage_s_own_plan(world_tmp, checkpoint):
    root = _node(world_tmp)
    if checkpoint is not None:  # a none-policy checkpoint: stale once the stage sets cpuManagerPolicy static
        (root / "var/lib/kubelet/cpu_manager_state").write_text(checkpoint)
    options = dict(KUBELET, settings={"memoryThrottlingFactor": 0.8})
    for _round in ("drifted", "after the write"):
        audited = _audit(root, kubelet=options)["checks"]["kubelet"]["details"]["plan"]
        stage = run_module("kubelet_config", dict({"root": str(root), "_ansible_check_mode": True}, **options), {})
        for field in PLAN_FIELDS_THE_ROLE_READS:
            assert audited[field] == stage[field], field
        assert (audited["changed"] or audited["restart_required"]) == (stage["changed"] or stage["restart_required"])
        assert "changes" not in audited
        if checkpoint is not None and _round == "drifted":
            assert [entry["path"] for entry in audited["stale_state_files"]] == ["/var/lib/kubelet/cpu_manager_state"]
        run_module("kubelet_config", dict({"root": str(root), "_ansible_check_mode": False, "remove_stale_state": True}, **options), {})
    assert audited["restart_required"] is False and audited["changed"] is False


def test_a_node_without_nvidia_ml_py_is_not_checked_there_not_broken(world_tmp, monkeypatch):
    """The tool's own prerequisite missing on the node is "could not check" with the fix, never nvml_init_failed
    critical as if the node were broken; the node's other checks still run."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _nvml

    root = _node(world_tmp)
    monkeypatch.setattr(_nvml, "HAS_PYNVML", False)
    audit = _node_audit.audit({"root": str(root), "nvml": {"check_unprivileged": False}, "mig": {"config": {"all-disabled": {}}, "selected": "all-disabled"},
                               "containerd": {"runtime_name": "nvidia"}})
    for check in ("nvml", "mig"):
        assert audit["checks"][check]["status"] == "not_checked"
        [blind] = audit["checks"][check]["not_checked"]
        assert "nvidia-ml-py" in blind["cause"] and "import pynvml" in blind["cause"]
        assert blind["fix"] == _node_audit.PYNVML_FIX
    assert not [entry for entry in audit["findings"] if entry["check"] in ("nvml", "mig")]
    assert audit["summary"]["not_checked"] == ["mig", "nvml"]
    assert audit["checks"]["containerd"]["status"] == "drift"  # the rest of the node's checks ran


# ---------------------------------------------------------------------------------------------
# issue 43: a cgroup v1 node keeps its kubelet check (MemoryQoS alone could not be checked); kubeadm durability

CGROUP_LIMITS_SETTINGS = {"featureGates": {"MemoryQoS": True}, "memoryThrottlingFactor": 0.9}  # cgroup_limits' defaults


def _mounts(root, hybrid):
    """/proc/self/mounts of a node whose /sys/fs/cgroup is the v1 layout (this lab host's: real-components.md):
    a tmpfs of per-controller cgroup mounts, and in the hybrid layout cgroup2 at unified."""
    base = "%s/sys/fs/cgroup" % root
    lines = ["tmpfs %s tmpfs ro,nosuid,nodev,noexec,mode=755 0 0" % base]
    lines += ["cgroup %s/%s cgroup rw,nosuid,nodev,noexec,relatime,%s 0 0" % (base, name, name) for name in ("cpuset", "memory", "devices")]
    if hybrid:
        lines.append("cgroup2 %s/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0" % base)
    return "\n".join(lines) + "\n"


@pytest.fixture
def cgroup_v1_node(world_tmp, monkeypatch):
    """The audit's node root on the cgroup v1 layout, as its /proc/self/mounts shows it (read in this process)."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _host

    def make(hybrid):
        root = _node(world_tmp)
        (root / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
        real_read = _files.read_text
        monkeypatch.setattr(_files, "read_text",
                            lambda path, *args, **kwargs: _mounts(root, hybrid) if path == "/proc/self/mounts" else real_read(path, *args, **kwargs))
        assert _host.cgroup_version(str(root)) == ("hybrid" if hybrid else 1)
        return root

    return make


def _audit_here(root, **sections):
    return _node_audit.audit(dict({"root": str(root)}, **sections))


@pytest.mark.parametrize("hybrid", [True, False], ids=["hybrid", "v1"])
def test_cgroup_v1_node_keeps_its_kubelet_check_and_only_memory_qos_is_not_checked(cgroup_v1_node, hybrid):
    """Issue 43 item 6: the whole kubelet check used to fail ("MemoryQoS ... needs cgroup v2 ... refusing")."""
    root = cgroup_v1_node(hybrid)
    before = tree_snapshot(root)
    audit = _audit_here(root, kubelet=dict(KUBELET, settings=CGROUP_LIMITS_SETTINGS), cgroup_memory={})
    assert tree_snapshot(root) == before
    kubelet = audit["checks"]["kubelet"]
    assert kubelet["status"] == "drift"  # topology drift is still reported
    drifted = {entry["subject"] for entry in audit["findings"] if entry["id"] == "kubelet_setting"}
    assert {"topologyManagerPolicy", "cpuManagerPolicy"} <= drifted and "featureGates.MemoryQoS" not in drifted
    [blind] = kubelet["not_checked"]
    assert blind["what"] == "kubelet featureGates.MemoryQoS=true" and "cgroup v1" in blind["cause"]
    assert "cgroup_limits_memory_qos_feature_gate=false" in blind["fix"]
    assert "featureGates" not in (kubelet["details"]["plan"]["sources"])
    # the immediate fix (memory.high) cannot run there at all: could not check, with the variables that leave it alone
    memory = audit["checks"]["cgroup_memory"]
    assert memory["status"] == "not_checked" and "cgroup v1 hierarchy" in memory["not_checked"][0]["cause"]
    assert "cgroup_limits_immediate=false" in memory["not_checked"][0]["fix"]
    assert audit["summary"]["not_checked"] == ["cgroup_memory", "kubelet"]


def test_cgroup_v1_node_is_clean_once_the_feature_gate_is_off_and_the_stage_ran(cgroup_v1_node):
    root = cgroup_v1_node(True)
    options = dict(KUBELET, settings={"memoryThrottlingFactor": 0.9})  # cgroup_limits_memory_qos_feature_gate=false
    assert "not_checked" not in _audit_here(root, kubelet=options)["checks"]["kubelet"]
    plan = _node_audit._kubelet.plan(_node_audit._kubelet.NodeReader(str(root)), dict(options, remove_stale_state=True),
                                     cgroup_version="hybrid")
    for change in plan["changes"]:
        path = root / change.node_path.lstrip("/")
        if change.after is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(change.after)
    clean = _audit_here(root, kubelet=options)
    assert clean["checks"]["kubelet"]["status"] == "ok", clean["findings"]
    assert clean["summary"]["not_checked"] == [] and clean["findings"] == []


def test_kubeadm_revert_the_stage_can_move_is_remediable_then_gone(world_tmp):
    root = _node(world_tmp)  # kubelet v1.36.3: the --config-dir route
    (root / "var/lib/kubelet/config.yaml").write_text(
        (root / "var/lib/kubelet/config.yaml").read_text().replace("topologyManagerPolicy: none", "topologyManagerPolicy: single-numa-node"))
    audit = _audit(root, kubelet={"topology_manager_policy": "single-numa-node"})
    [revert] = [entry for entry in audit["findings"] if entry["id"] == "kubelet_reverts_on_kubeadm_upgrade"]
    assert revert["severity"] == "warning" and revert["remediable"] is True and revert["stage"] == "kubelet_topology"
    assert revert["found"] == "topologyManagerPolicy=single-numa-node in /var/lib/kubelet/config.yaml"
    assert revert["subject"] == "topologyManagerPolicy"  # the fields, matched by drift against those the admission check keeps
    # the value only moves: no kubelet_setting finding for it
    assert [entry["id"] for entry in audit["findings"]] == ["kubelet_reverts_on_kubeadm_upgrade"]
    assert audit["checks"]["kubelet"]["details"]["persistence"] == "durable"
    assert _remediate_with(root, {"topology_manager_policy": "single-numa-node"})
    clean = _audit(root, kubelet={"topology_manager_policy": "single-numa-node"})
    assert clean["checks"]["kubelet"]["status"] == "ok" and clean["findings"] == []


def test_kubeadm_revert_that_stops_the_kubelet_is_an_error_drift_names_beforehand(world_tmp):
    """The static policy stays in config.yaml (the route is off): drift says a kubeadm upgrade would stop the kubelet on
    its checkpoint, before and after the stage ran; the stage cannot fix it (not remediable)."""
    root = _node(world_tmp)
    options = dict(KUBELET, kubeadm_config_dir="")
    assert _remediate_with(root, dict(options, remove_stale_state=True))
    audit = _audit(root, kubelet=options)
    [revert] = audit["findings"]
    assert revert["id"] == "kubelet_reverts_on_kubeadm_upgrade" and revert["severity"] == "error"
    assert revert["remediable"] is False and "refuses its checkpoint" in revert["hint"] and "cpuManagerPolicy" in revert["hint"]
    assert "cpuManagerPolicy=static" in revert["found"]
    assert audit["checks"]["kubelet"]["status"] == "findings"
    assert audit["checks"]["kubelet"]["details"]["persistence"] == "reverts_on_kubeadm_upgrade"
    assert "option kubeadm_config_dir is empty" in audit["checks"]["kubelet"]["details"]["persistence_reason"]


def test_require_durable_is_refused_in_the_audit_and_the_stage_plan_writes_nothing(world_tmp):
    root = _node(world_tmp)
    options = dict(KUBELET, kubeadm_config_dir="", require_durable=True)
    audit = _audit(root, kubelet=options)
    kubelet = audit["checks"]["kubelet"]
    assert kubelet["would_change"] is False and kubelet["status"] == "findings"
    [refused] = kubelet["refused"]
    assert refused["why"].startswith("require_durable:") and audit["summary"]["refused"] == ["kubelet"]
    plan = kubelet["details"]["plan"]
    assert plan["changed"] is False and plan["restart_required"] is False and plan["stale_state_files"] == []
    stage = run_module("kubelet_config", dict({"root": str(root), "_ansible_check_mode": True}, **options), {})
    assert stage["changed"] is False
    for field in PLAN_FIELDS_THE_ROLE_READS:
        assert plan[field] == stage[field], field
    # the drift stays visible: what differs, and what a kubeadm upgrade would do
    assert {"kubelet_setting", "kubelet_reverts_on_kubeadm_upgrade"} <= {entry["id"] for entry in audit["findings"]}


def _remediate_with(root, options):
    result = run_module("kubelet_config", dict({"root": str(root), "_ansible_check_mode": False}, **options), {})
    assert not result.get("failed"), result
    return result["changed"]
