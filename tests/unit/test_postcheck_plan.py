# SPDX-License-Identifier: GPL-3.0-or-later
"""The post-check's decisions (plugins/module_utils/core/_postcheck_plan.py), which roles/postcheck made in Jinja
before: which reads run, the reuse of the run's audit, the topology entry and consistency report of a node, the one
cluster-side run for the batch, the node's findings, what it could not check (a failed workloads LIST) and the verdict on
the one severity scale."""

from __future__ import annotations

import copy
from pathlib import Path
from unittest.mock import MagicMock

import pytest
import yaml
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible_collections.gpuharden.k8s.plugins.action import postcheck_step
from ansible_collections.gpuharden.k8s.plugins.action.check_variables import _trusted  # role files are trusted templates
from ansible_collections.gpuharden.k8s.plugins.lookup import postcheck_audit_options
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings, _role_options
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _postcheck_plan as plan
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((REPO / "roles/postcheck/defaults/main.yml").read_text())
# the role's defaults as a host sees them (the few templated ones given their usual value)
SETTINGS = dict(DEFAULTS, postcheck_fail_severity="error", postcheck_node_name="gpu-a", postcheck_kubeconfig="",
                postcheck_device_audit=True, postcheck_consistency=True)
NVML_REPORT = {"gpus": [{"index": 0, "numa_node": 0}], "processes": [{"pid": 42}],
               "findings": [_findings.finding("pcie_link_degraded", "warning", {}, {}, node="gpu-a", gpu={"index": 0}, pod=None)]}
DEVICE_FINDING = _findings.finding("isolation_breach", "critical", [], [], node="gpu-a", pod="p")
AUDIT = {
    "node_report": dict(NVML_REPORT, process_cgroups={"42": "/kubepods/x"}),
    "findings": NVML_REPORT["findings"] + [DEVICE_FINDING],
    "checks": {"nvml": {"status": "findings"}, "device_cgroups": {"status": "findings"},
               "kubelet": {"status": "drift", "details": {"policies": {"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": None,
                                                                       "cpuManagerPolicy": "static"}}}},
}


def settings(**changes):
    return dict(copy.deepcopy(SETTINGS), **changes)


def test_the_settings_each_step_reads_are_the_roles_variables():
    """Each is a role default, or one the role leaves unset and its readers follow in Python (core/_role_options.py followed)."""
    names = set(plan.NODE_SETTINGS) | set(plan.CLUSTER_SETTINGS) | set(plan.VERDICT_SETTINGS) | set(plan.PREFLIGHT_SETTINGS)
    known = set(DEFAULTS) | {name for name in _role_options.FOLLOWED if name.startswith("postcheck_")}
    assert names <= known, sorted(names - known)
    assert not set(DEFAULTS) & set(_role_options.FOLLOWED)


@pytest.mark.parametrize(("changes", "pieces"), [
    ({}, []),
    ({"postcheck_nvml": False, "postcheck_consistency": False}, ["set postcheck_nvml=true"]),
    ({"postcheck_nvml": "no", "postcheck_topology": False, "postcheck_consistency": False}, []),
    ({"postcheck_expected_gpus": 8, "postcheck_expected_mig_devices": "0"}, []),
    ({"postcheck_expected_gpus": -1}, ["postcheck_expected_gpus=-1", "whole numbers"]),
    ({"postcheck_expected_gpus": True}, ["postcheck_expected_gpus=True"]),
    ({"postcheck_expected_mig_devices": "1.5", "postcheck_nvml": False}, ["set postcheck_nvml=true", "postcheck_expected_mig_devices=1.5"]),
])
def test_preflight_names_every_rule_broken(changes, pieces):
    text = " ".join(plan.preflight_problems(settings(**changes)))
    assert all(piece in text for piece in pieces), text
    assert bool(text) == bool(pieces)


def test_one_node_audit_run_reads_what_the_checks_need_and_gives_the_lock_back():
    lock = {"owner": "run-1", "path": "/run/gpuharden/run.lock"}
    args = plan.node_audit_args(settings(postcheck_lock=lock, postcheck_expected_gpus=8))
    assert args["node_name"] == "gpu-a" and args["lock"] == lock
    assert args["nvml"]["expected_gpus"] == 8 and args["nvml"]["unprivileged_user"] == "nobody"
    assert args["device_cgroups"]["devices"] is None and args["device_cgroups"]["accesses"] == ["r", "w", "m"]
    assert args["kubelet"] == {"settings": plan.KUBELET_READ_SETTINGS}
    # the three policies given: no kubelet read
    given = settings(postcheck_topology_manager_policy="restricted", postcheck_topology_manager_scope="pod", postcheck_cpu_manager_policy="static")
    assert "kubelet" not in plan.node_audit_args(given)


def test_no_trip_where_the_runs_audit_is_handed_over_or_nothing_is_read():
    assert plan.node_audit_args(settings(postcheck_node_audit=AUDIT)) is None
    nothing = settings(postcheck_nvml=False, postcheck_topology=False, postcheck_consistency=False, postcheck_device_audit=False)
    assert plan.node_audit_args(nothing) is None
    # a lock to give back is a reason for the trip on its own
    assert plan.node_audit_args(dict(nothing, postcheck_lock={"owner": "x", "path": "/l"})) == {"node_name": "gpu-a", "lock": {"owner": "x", "path": "/l"}}


def test_reuse_takes_only_what_the_audit_could_read():
    assert plan.reused(AUDIT) == {"nvml": True, "device_cgroups": True, "kubelet": True}
    assert plan.reused({}) == {"nvml": False, "device_cgroups": False, "kubelet": False}
    blind = {"node_report": None, "checks": {"device_cgroups": {"status": "not_checked"}, "kubelet": {"status": "ok", "details": {"policies": {}}}}}
    assert plan.reused(blind) == {"nvml": False, "device_cgroups": False, "kubelet": False}


def test_the_reads_the_audit_did_not_make_run_each_by_its_module():
    everything = plan.remaining_reads(settings(), plan.reused({}))
    assert list(everything) == ["gpuharden.k8s.nvml_check", "gpuharden.k8s.kubelet_config", "gpuharden.k8s.device_cgroup_audit",
                                "gpuharden.k8s.process_cgroup_info"]
    assert "expected_gpus" not in everything["gpuharden.k8s.nvml_check"]  # null: left to the module's default
    assert "devices" not in everything["gpuharden.k8s.device_cgroup_audit"]
    assert plan.remaining_reads(settings(), plan.reused(AUDIT)) == {}
    assert plan.process_cgroup_args({"processes": [{"pid": 7}, {"pid": 9}]}) == {"pids": [7, 9]}


def test_node_part_from_the_audit():
    part = plan.node_part(settings(), AUDIT, plan.reused(AUDIT), {})
    assert part["nvml"] is AUDIT["node_report"] and part["node_report"] is AUDIT["node_report"]
    assert part["nvml_findings"] == NVML_REPORT["findings"] and part["device_cgroup_findings"] == [DEVICE_FINDING]
    assert part["topology_input"] == {"gpus": NVML_REPORT["gpus"], "topology_manager_policy": "single-numa-node",
                                      "topology_manager_scope": "container", "cpu_manager_policy": "static"}
    assert part["settle"] is True and part["restarted_at"] is None


def test_node_part_from_the_modules_and_the_given_policies():
    reads = {"gpuharden.k8s.nvml_check": NVML_REPORT, "gpuharden.k8s.process_cgroup_info": {"cgroups": {"42": "/kubepods/y"}},
             "gpuharden.k8s.device_cgroup_audit": {"findings": [DEVICE_FINDING]}, "gpuharden.k8s.kubelet_config": {}}
    given = settings(postcheck_topology_manager_policy="restricted", postcheck_kubelet_restarted_at="1700000000.5",
                     postcheck_advertise_settle_this_node=False)
    part = plan.node_part(given, {}, plan.reused({}), reads)
    assert part["node_report"] == dict(NVML_REPORT, process_cgroups={"42": "/kubepods/y"})
    assert part["topology_input"]["topology_manager_policy"] == "restricted" and part["topology_input"]["cpu_manager_policy"] is None
    assert part["restarted_at"] == 1700000000.5 and part["settle"] is False
    off = plan.node_part(settings(postcheck_topology=False, postcheck_consistency=False), {}, plan.reused({}), reads)
    assert off["topology_input"] is None and off["node_report"] is None


def _parts():
    first = plan.node_part(settings(), AUDIT, plan.reused(AUDIT), {})
    second = plan.node_part(settings(postcheck_node_name="gpu-b", postcheck_advertise_settle_this_node=False,
                                     postcheck_kubelet_restarted_at=12.0), AUDIT, plan.reused(AUDIT), {})
    return [first, second]


def test_one_consistency_run_for_the_batch_weighs_the_workloads():
    module, options = plan.cluster_call(settings(postcheck_kubeconfig="/k", postcheck_advertise_settle_seconds=60), _parts())
    assert module == "gpuharden.k8s.gpu_consistency"
    assert options["nodes"] == ["gpu-a", "gpu-b"] and options["kubeconfig"] == "/k" and "context" not in options
    assert options["settle_nodes"] == ["gpu-a"] and options["restarted_at"] == {"gpu-b": 12.0} and options["settle_seconds"] == 60
    assert set(options["topology"]) == {"gpu-a", "gpu-b"} and set(options["node_reports"]) == {"gpu-a", "gpu-b"}
    _module, unweighed = plan.cluster_call(settings(postcheck_collect_workloads=False), _parts())
    assert unweighed["topology"] == {}


def test_without_the_consistency_check_gpu_workloads_info_weighs_them_or_nothing_runs():
    module, options = plan.cluster_call(settings(postcheck_consistency=False), _parts())
    assert module == "gpuharden.k8s.gpu_workloads_info" and set(options["topology"]) == {"gpu-a", "gpu-b"}
    assert plan.cluster_call(settings(postcheck_consistency=False, postcheck_collect_workloads=False), _parts()) == (None, None)


def test_weighed_says_why_the_workloads_were_not_listed():
    assert plan.weighed("gpuharden.k8s.gpu_workloads_info", {"failed": True, "msg": "forbidden"})["workloads_error"] == "forbidden"
    assert plan.weighed("gpuharden.k8s.gpu_workloads_info", {"workloads": [], "topology": {"gpu-a": {}}}) == {
        "findings": [], "topology": {"gpu-a": {}}, "workloads_error": None}
    assert plan.weighed("gpuharden.k8s.gpu_consistency", {"findings": [1], "topology": {}, "workloads_error": "boom"})["workloads_error"] == "boom"
    assert plan.weighed(None, None) == {"findings": [], "topology": {}, "workloads_error": None}


def test_a_node_the_cluster_step_did_not_weigh_gets_topology_check_alone():
    part = _parts()[0]
    assert plan.topology_alone_args(settings(), part, {"topology": {"gpu-a": {"findings": []}}}) is None
    args = plan.topology_alone_args(settings(), part, {"topology": {}})
    assert args == {"node_name": "gpu-a", "gpus": NVML_REPORT["gpus"], "topology_manager_scope": "container",
                    "topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static"}
    assert plan.topology_alone_args(settings(postcheck_topology=False), part, {}) is None


def test_the_nodes_findings_in_order_and_a_failed_list_is_not_checked_not_a_finding():
    part = _parts()[0]
    other = _findings.finding("gpu_not_advertised", "error", 1, 0, node="gpu-b", gpu=None, pod=None)
    mine = _findings.finding("gpu_not_advertised", "error", 1, 0, node="gpu-a", gpu=None, pod=None)
    topology = {"findings": [_findings.finding("topology_policy_no_alignment", "warning", {}, {}, node="gpu-a", gpu=None, pod=None)]}
    cluster = {"findings": [other, mine], "topology": {}, "workloads_error": "403 Forbidden"}
    found = plan.node_findings(settings(), part, cluster, topology)
    assert [entry["id"] for entry in found] == ["pcie_link_degraded", "topology_policy_no_alignment", "isolation_breach", "gpu_not_advertised"]
    [blind] = plan.not_checked(settings(), cluster)
    assert blind["what"] == "topology: whether the cluster's GPU workloads fit gpu-a's NUMA nodes"
    assert blind["cause"] == "the GPU workloads could not be listed: 403 Forbidden" and "postcheck_kubeconfig" in blind["fix"]
    # a LIST that answered, or a post-check without the topology check, leaves nothing unchecked
    assert plan.not_checked(settings(), dict(cluster, workloads_error=None)) == []
    assert plan.not_checked(settings(postcheck_topology=False), cluster) == []
    assert plan.node_topology(settings(), {"topology": {"gpu-a": topology}}, None) is topology
    assert plan.node_topology(settings(), {"topology": {}}, {"alone": 1}) == {"alone": 1}
    assert plan.node_topology(settings(postcheck_topology=False), {}, {"alone": 1}) is None


def test_a_part_not_checked_fails_the_host_without_counting_as_a_finding():
    blind = plan.not_checked(settings(), {"workloads_error": "403 Forbidden"})
    decided = plan.verdict(settings(), [], check_mode=False, unchecked=blind)
    assert decided["failing"] == []
    assert decided["failure"] == ("could not check topology: whether the cluster's GPU workloads fit gpu-a's NUMA nodes: the GPU workloads "
                                  "could not be listed: 403 Forbidden (fix: %s)" % blind[0]["fix"])
    finding = _findings.finding("gpu_not_advertised", "error", 1, 0, node="gpu-a", gpu=None, pod=None)
    both = plan.verdict(settings(), [finding], check_mode=False, unchecked=blind)["failure"]
    assert both.startswith("1 finding(s) at or above error on gpu-a: gpu_not_advertised") and "; could not check topology" in both
    # never only reports, for a part not checked as for findings
    assert plan.verdict(settings(postcheck_fail_severity="never"), [], check_mode=False, unchecked=blind)["failure"] is None
    # a check run that only reports says what it could not check, as it says its findings
    reported = plan.verdict(settings(postcheck_fail_in_check_mode=False), [], check_mode=True, unchecked=blind)
    assert reported["failure"] is None and reported["report"].endswith(
        "; could not check topology: whether the cluster's GPU workloads fit gpu-a's NUMA nodes: the GPU workloads could not be listed: 403 Forbidden")
    assert plan.verdict(settings(), [], check_mode=False)["failure"] is None


def test_the_verdict_uses_the_one_severity_scale():
    findings = [_findings.finding("pcie_link_degraded", "warning", {"gen": 4}, {"gen": 3}, node="gpu-a", gpu={"index": 3}, pod=None),
                _findings.finding("gpu_not_advertised", "error", 1, "x" * 300, node="gpu-a", gpu=None, pod=None)]
    failing = plan.verdict(settings(), findings, check_mode=False)
    assert failing["failing"] == ["gpu_not_advertised"] and failing["report"] is None
    assert failing["failure"].startswith("1 finding(s) at or above error on gpu-a: gpu_not_advertised found \"xxx")
    assert failing["failure"].endswith("..., expected 1 (all of them in postcheck_findings)")
    warned = plan.verdict(settings(postcheck_fail_severity="warning"), findings, check_mode=False)
    assert warned["failing"] == ["pcie_link_degraded", "gpu_not_advertised"] and "pcie_link_degraded (gpu 3) found {\"gen\": 3}" in warned["failure"]
    assert plan.verdict(settings(postcheck_fail_severity="never"), findings, check_mode=False)["failure"] is None
    # check mode fails as a real run, unless the run (harden --check) only reports
    assert plan.verdict(settings(), findings, check_mode=True)["failure"]
    reported = plan.verdict(settings(postcheck_fail_in_check_mode=False), findings, check_mode=True)
    assert reported["failure"] is None
    assert reported["report"] == ("check mode: 1 finding(s) at or above error on the node as it is now (gpu_not_advertised); "
                                  "a real run verifies the node after its changes")


@pytest.mark.parametrize("changes", [{}, {"postcheck_nvml": False, "postcheck_device_audit": "false"},
                                     {"postcheck_expected_gpus": 8, "postcheck_audit_devices": ["/dev/nvidia0"], "postcheck_audit_allocations": []},
                                     {"gpuharden_postcheck_device_audit": False}, {"gpuharden_postcheck_device_audit": False, "postcheck_device_audit": True}])
def test_the_plans_audit_options_are_the_roles(changes):
    """playbooks/tasks/node_stages.yml hands node_audit the role's postcheck_audit_*_options (vars/main.yml), which the lookup
    postcheck_audit_options makes with audit_options(), from the role's variables as the task sees them."""
    role_vars = yaml.safe_load((REPO / "roles/postcheck/vars/main.yml").read_text())
    assert role_vars == {"postcheck_audit_nvml_options": "{{ query('gpuharden.k8s.postcheck_audit_options', 'nvml') | first }}",
                         "postcheck_audit_device_cgroup_options": "{{ query('gpuharden.k8s.postcheck_audit_options', 'device_cgroups') | first }}"}
    variables = _trusted(dict(DEFAULTS, **changes, inventory_hostname="gpu-a"))
    templar = Templar(loader=DataLoader(), variables=variables)
    lookup = postcheck_audit_options.LookupModule(loader=DataLoader(), templar=templar)
    nvml, device_cgroups = lookup.run(["nvml", "device_cgroups"], variables)
    resolved = {name: _role_options.followed(name, lambda variable: templar.template(variables[variable]) if variable in variables
                                             else _role_options.UNDEFINED) for name in plan.AUDIT_SETTINGS}
    assert (nvml, device_cgroups) == plan.audit_options(resolved)
    assert bool(nvml) == plan.as_bool(resolved["postcheck_nvml"]) and bool(device_cgroups) == plan.as_bool(resolved["postcheck_device_audit"])
    # the role leaves postcheck_device_audit unset: the fleet's gpuharden_postcheck_device_audit, unless the role's is set
    assert bool(device_cgroups) == plan.as_bool(changes.get("postcheck_device_audit", changes.get("gpuharden_postcheck_device_audit", True)))
    if nvml:
        assert nvml["node_name"] == "gpu-a" and nvml["expected_gpus"] == changes.get("postcheck_expected_gpus")
    with pytest.raises(AnsibleError, match="name one or more of nvml, device_cgroups"):
        lookup.run(["kubelet"], variables)


class _Variables:
    """The action's templar, for the variables it resolves by name."""

    def __init__(self, variables):
        self.variables = variables

    def resolve_variable_expression(self, name):
        return self.variables[name]


def _action(args, variables, modules, check_mode=False):
    """The action with a task of ``args`` and the role's ``variables``; ``modules`` {name: result or callable(args)}.
    Returns (action, calls) where calls lists (module, options, check mode) of each module run."""
    task = MagicMock(args=args, check_mode=check_mode, async_val=0)
    action = postcheck_step.ActionModule(task, MagicMock(), MagicMock(), loader=None, templar=_Variables(variables), shared_loader_obj=None)
    calls = []

    def execute(module_name, module_args, task_vars):
        calls.append((module_name, module_args, action._task.check_mode))
        answer = modules[module_name]
        return copy.deepcopy(answer(module_args) if callable(answer) else answer)

    action._execute_module = execute
    return action, calls


def test_the_node_step_reads_in_one_audit_and_gives_the_lock_back():
    lock = {"owner": "run-1", "path": "/run/gpuharden/run.lock"}
    audit = dict(copy.deepcopy(AUDIT), lock={"held": False, "taken_over": False}, changed=False, invocation={})
    action, calls = _action({"step": "node"}, settings(postcheck_lock=lock), {"gpuharden.k8s.node_audit": audit})
    result = action.run(task_vars={})
    assert [call[0] for call in calls] == ["gpuharden.k8s.node_audit"] and calls[0][1]["lock"] == lock
    assert result["lock"] == {"held": False, "taken_over": False} and not result.get("skipped") and not result.get("failed")
    assert result["nvml"]["gpus"] == NVML_REPORT["gpus"] and result["device_cgroup_findings"] == [DEVICE_FINDING]


def test_the_node_step_reads_again_what_the_audit_could_not_with_the_kubelet_in_check_mode():
    blind = {"node_report": None, "findings": [], "checks": {"nvml": {"status": "not_checked"}, "device_cgroups": {"status": "not_checked"},
                                                             "kubelet": {"status": "not_checked"}}}
    modules = {"gpuharden.k8s.node_audit": blind, "gpuharden.k8s.nvml_check": dict(NVML_REPORT, changed=False),
               "gpuharden.k8s.kubelet_config": {"failed": True, "msg": "no kubelet configuration"},
               "gpuharden.k8s.device_cgroup_audit": {"findings": [DEVICE_FINDING]}, "gpuharden.k8s.process_cgroup_info": lambda args: {"cgroups": {"42": args}}}
    action, calls = _action({"step": "node"}, settings(), modules)
    result = action.run(task_vars={})
    assert [(name, check) for name, _args, check in calls] == [
        ("gpuharden.k8s.node_audit", False), ("gpuharden.k8s.nvml_check", False), ("gpuharden.k8s.kubelet_config", True),
        ("gpuharden.k8s.device_cgroup_audit", False), ("gpuharden.k8s.process_cgroup_info", False)]
    assert result["node_report"]["process_cgroups"] == {"42": {"pids": [42]}} and "changed" not in result["nvml"]
    assert result["topology_input"]["topology_manager_policy"] is None  # the kubelet could not be read: its defaults


def test_the_node_step_fails_with_the_read_that_failed_and_says_the_lock():
    audit = {"node_report": None, "checks": {}, "lock": {"held": False, "taken_over": False}}
    modules = {"gpuharden.k8s.node_audit": audit, "gpuharden.k8s.nvml_check": {"failed": True, "msg": "NVML: driver not loaded"}}
    action, _calls = _action({"step": "node"}, settings(postcheck_lock={"owner": "o", "path": "/l"}), modules)
    result = action.run(task_vars={})
    assert result["failed"] and result["msg"] == "gpuharden.k8s.nvml_check: NVML: driver not loaded" and result["lock"]["held"] is False


def test_the_node_step_is_skipped_where_the_runs_audit_read_everything():
    action, calls = _action({"step": "node"}, settings(postcheck_node_audit=AUDIT), {})
    result = action.run(task_vars={})
    assert calls == [] and result["skipped"] and result["nvml"] == AUDIT["node_report"]


def test_the_cluster_and_verdict_steps():
    parts = _parts()
    consistency = {"findings": [_findings.finding("gpu_not_advertised", "error", 1, 0, node="gpu-a", gpu=None, pod=None)],
                   "topology": {"gpu-a": {"findings": []}}, "workloads_error": None}
    action, calls = _action({"step": "cluster", "node_reads": parts}, settings(), {"gpuharden.k8s.gpu_consistency": consistency})
    cluster = action.run(task_vars={})
    assert [call[0] for call in calls] == ["gpuharden.k8s.gpu_consistency"] and cluster["ran"] == "gpuharden.k8s.gpu_consistency"
    # gpu-b was not weighed: its topology check runs alone, on the controller
    modules = {"gpuharden.k8s.topology_check": {"findings": [], "changed": False}}
    action, calls = _action({"step": "verdict", "node_read": parts[1], "cluster": cluster}, settings(postcheck_node_name="gpu-b"), modules)
    verdict = action.run(task_vars={})
    assert [call[0] for call in calls] == ["gpuharden.k8s.topology_check"] and verdict["failing"] == ["isolation_breach"]
    action, calls = _action({"step": "verdict", "node_read": parts[0], "cluster": cluster}, settings(), {})
    verdict = action.run(task_vars={})
    assert calls == [] and verdict["failing"] == ["isolation_breach", "gpu_not_advertised"]
    assert verdict["failure"].startswith("2 finding(s) at or above error on gpu-a: isolation_breach found [], expected []; gpu_not_advertised")
    assert verdict["ansible_stats"] == {"data": {"gpuharden_postcheck_findings": verdict["findings"]}, "per_host": False, "aggregate": True}


def test_the_consistency_checks_failure_fails_the_step():
    action, _calls = _action({"step": "cluster", "node_reads": _parts()}, settings(), {"gpuharden.k8s.gpu_consistency": {"failed": True, "msg": "401"}})
    with pytest.raises(AnsibleActionFail, match="gpu_consistency: 401"):
        action.run(task_vars={})


def test_the_preflight_step_fails_naming_every_rule():
    action, _calls = _action({"step": "preflight"}, settings(postcheck_nvml=False, postcheck_expected_gpus=-1), {})
    with pytest.raises(AnsibleActionFail, match="set postcheck_nvml=true or turn them off. postcheck_expected_gpus=-1"):
        action.run(task_vars={})


def test_the_steps_read_what_the_step_before_registered_and_run_on_the_controllers_python():
    """roles/postcheck/tasks/main.yml hands nothing over in Jinja: the cluster step reads every node read of the batch
    from hostvars, the verdict this host's node read and the batch's cluster result, and both run their modules on
    postcheck_controller_python (the delegated host's interpreter), never on the play's node Python."""
    parts = _parts()
    hostvars = {"a": {postcheck_step.NODE_READ: parts[0]}, "b": {postcheck_step.NODE_READ: parts[1]}, "c": {}}
    seen = []
    consistency = {"findings": [], "topology": {"gpu-a": {"findings": []}}, "workloads_error": None}

    def gpu_consistency(options):
        seen.append(options)
        return consistency

    action, calls = _action({"step": "cluster"}, settings(postcheck_controller_python="/venv/bin/python"),
                            {"gpuharden.k8s.gpu_consistency": gpu_consistency})
    action._task.delegate_to = "localhost"
    interpreters = []
    execute = action._execute_module

    def recording(module_name, module_args, task_vars):
        interpreters.append(task_vars["ansible_delegated_vars"]["localhost"]["ansible_python_interpreter"])
        return execute(module_name, module_args, task_vars)

    action._execute_module = recording
    cluster = action.run(task_vars={"hostvars": hostvars, "ansible_play_batch": ["a", "b", "c"],
                                    "ansible_delegated_vars": {"localhost": {"ansible_python_interpreter": "/node/python"}}})
    # host c registered no read (its node step did not run): it is left out, as the planner leaves out an empty part
    assert seen[0]["nodes"] == ["gpu-a", "gpu-b"] and interpreters == ["/venv/bin/python"] and cluster["ran"] == "gpuharden.k8s.gpu_consistency"
    action, calls = _action({"step": "verdict"}, settings(postcheck_node_name="gpu-b", postcheck_controller_python=""),
                            {"gpuharden.k8s.topology_check": {"findings": [], "changed": False}})
    action._task.delegate_to = "localhost"
    interpreters.clear()
    execute = action._execute_module
    action._execute_module = recording
    # the cluster step's facts are its hand-over to every host of the batch (run_once): the verdict takes it from them
    verdict = action.run(task_vars=dict(cluster["ansible_facts"], **{postcheck_step.NODE_READ: parts[1], "ansible_playbook_python": "/ctl/python"}))
    assert [call[0] for call in calls] == ["gpuharden.k8s.topology_check"] and interpreters == ["/ctl/python"]
    assert verdict["failing"] == ["isolation_breach"] and verdict["nvml"] == parts[1]["nvml"]
    # an earlier run's hand-over (a fact cache kept it) is no cluster result of this batch: the verdict weighs none
    earlier = _handover.handed_over(postcheck_step.CLUSTER, cluster["ansible_facts"][postcheck_step.CLUSTER]["value"],
                                    run=dict(_handover.this_run(), pid=1, start=0))
    assert _handover.taken_over(dict(earlier), postcheck_step.CLUSTER) is None


def test_the_role_registers_the_names_the_action_reads():
    tasks = yaml.safe_load((REPO / "roles/postcheck/tasks/main.yml").read_text())
    registered = {task["gpuharden.k8s.postcheck_step"]["step"]: task.get("register") for task in tasks if "gpuharden.k8s.postcheck_step" in task}
    assert registered == {"node": postcheck_step.NODE_READ, "cluster": None, "verdict": postcheck_step.VERDICT,
                          "fail": None, "report": None}
    # the delegated steps name no interpreter of their own: the action takes postcheck_controller_python
    assert all("vars" not in task for task in tasks if "gpuharden.k8s.postcheck_step" in task)


@pytest.mark.parametrize(("decided", "step", "expected"), [
    ({"failure": "1 finding(s) at or above error on gpu-a: x", "report": None, "failing": ["x"]}, "fail",
     {"failed": True, "changed": False, "msg": "1 finding(s) at or above error on gpu-a: x", "failing": ["x"]}),
    ({"failure": None, "report": None, "failing": []}, "fail", {"skipped": True, "changed": False, "skip_reason": "nothing fails the host"}),
    ({"failure": None, "report": "check mode: 1 finding(s)", "failing": ["x"]}, "fail",
     {"skipped": True, "changed": False, "skip_reason": "check mode: reported, not failed"}),
    ({"failure": None, "report": "check mode: 1 finding(s)", "failing": ["x"]}, "report",
     {"changed": False, "msg": "check mode: 1 finding(s)", "_ansible_verbose_always": True}),
    ({"failure": "f", "report": None, "failing": ["x"]}, "report", {"skipped": True, "changed": False, "skip_reason": "not a check run that only reports"}),
])
def test_the_fail_and_report_steps_follow_the_verdict(decided, step, expected):
    assert plan.judged(decided, step) == expected


@pytest.mark.parametrize("step", ["fail", "report"])
def test_a_missing_verdict_fails_the_host(step):
    """A post-check whose verdict did not run did not verify the node: never a pass."""
    action, _calls = _action({"step": step}, settings(), {})
    result = action.run(task_vars={})
    assert result["failed"] and "verdict step did not run" in result["msg"]
    action, _calls = _action({"step": step}, settings(), {})
    verdict = {"failure": "2 finding(s)", "report": None, "failing": ["a", "b"]}
    assert bool(action.run(task_vars={postcheck_step.VERDICT: verdict}).get("failed")) is (step == "fail")
