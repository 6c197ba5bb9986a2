# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Every node-side check in one process, for drift runs.

Each check takes the options of the module that fixes (or checks) the same thing, validated against that
module's own option spec, and calls the same ``decide`` function the module calls in check mode.  So the audit
reports drift exactly when the remediation module would change something: they share one planner.

Findings follow the one model of ``_findings``: its catalogue says which stage fixes each and whether running
that stage changes something (informational findings and post-check findings are not remediable).
"""

from __future__ import annotations

import sys
import time

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _device_audit_node
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings, _host, _node_lock
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import (
    _cgroup_memory,
    _containerd,
    _device_nodes,
    _gpu_operator,
    _kubelet,
    _process_cgroups,
)
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _nvml, _nvml_node

# Imported where they are used, not here: the MIG planners (_mig, _mig_nvml) only by a run that asks for a layout, the
# GPU facts (_gpu_facts) only by one that asks for facts.  Ansible ships them in the payload either way (its
# module_utils finder reads every import of the file), but the node compiles a module's source, from the zip, only when
# it is imported: at 66 KB the MIG planners cost each drift audit, which asks for no layout, about 30 ms of node CPU.


def section_params(name, spec, given, root, rules=None):
    """The section's options validated like the module validates its own; None values mean 'not given'."""
    if not isinstance(given, dict):
        raise GpuhardenError("node_audit: option %s must be a dict of %s options, got %r" % (name, name, given))
    given = {key: value for key, value in given.items() if value is not None}
    given["root"] = root
    validator = ArgumentSpecValidator(spec, **(rules or {}))
    result = validator.validate(given)
    if result.error_messages:
        raise GpuhardenError("node_audit: option %s: %s" % (name, "; ".join(result.error_messages)))
    return result.validated_parameters


# ---------------------------------------------------------------------------------------------
# One function per check: options -> (would_change, findings, details)


def _operator_parts(details, plan):
    """The parts the check refused (the GPU Operator owns them) or could not check (its ClusterPolicy was not read),
    as the audit lifts them from ``details``."""
    if plan.get("refused"):
        details[REFUSED] = plan["refused"]
    if plan.get("not_checked"):
        details[NOT_CHECKED] = plan["not_checked"]
    return details


def audit_device_nodes(params):
    policy, planned = _device_nodes.decide(params)
    details = _operator_parts({"policy": dict(policy, mode="%04o" % policy["mode"])}, planned)
    if planned["refused"]:
        return False, [], details
    findings = []
    ids = {"create": "device_node_missing", "replace": "device_node_wrong_type", "fix": "device_node_permissions"}
    for path, node in sorted(planned["nodes"].items()):
        if node["action"] in ids:
            findings.append(finding(
                ids[node["action"]], "error", node["after"], node["before"],
                "a wrong /dev/nvidia* node breaks or widens GPU access; device_permissions recreates it", planned=True, path=path))
        elif node["action"] == "missing":
            findings.append(finding(
                "device_node_missing", "error", node["after"], "missing",
                "create_missing is false, so the stage will not create it", planned=False, path=path))
    for path, link in sorted(planned["links"].items()):
        if link["action"] != "ok":
            findings.append(finding(
                "device_char_link", "warning", link["after"], link["before"],
                "without /dev/char links runc's systemd cgroup driver drops GPU access after a daemon-reload", path=path))
    for change in planned["changes"]:
        if change.changed and change is planned["udev_cleanup"]:  # the udev rules earlier versions wrote
            findings.append(finding(
                "device_udev_rules_obsolete", "warning", "absent",
                "udev rules for nvidia-uvm*/nvidia-cap*", "these devices send no uevent, so the rules never fire; "
                "device_permissions removes them", path=change.path))
        elif change.changed:
            findings.append(finding(
                "device_permissions_not_persisted", "warning",
                change.reason, "missing" if change.before is None else "differs", "a chmod alone is undone by the driver "
                "on the next module load or device re-creation", path=change.path))
    for entry in planned["not_persistable"]:
        findings.append(finding(
            "device_permissions_not_persistable", "info", entry["wanted"],
            entry["kept"], "the policy cannot stick here: %s; the node is kept at that, and GPU access stays limited "
            "through /dev/nvidiactl and /dev/nvidia<N>" % entry["kept_by"], path=entry["path"]))
    for conflict in planned["conflicts"]:
        where = conflict["file"] if conflict["line"] is None else "%s line %d" % (conflict["file"], conflict["line"])
        findings.append(finding(
            "device_settings_conflict", "warning" if conflict["overrides"] else "info",
            "%s=%s" % (conflict["parameter"], conflict["expected"]), "%s=%s in %s" % (conflict["parameter"], conflict["value"], where),
            conflict["message"]))
    if planned["reboot_or_reload_required"]:
        running, desired = planned["driver_params"]["running"], planned["driver_params"]["desired"]
        findings.append(finding(
            "driver_params_stale", "info",
            ", ".join("%s=%s" % item for item in sorted(desired.items())),
            ", ".join("%s=%s" % item for item in sorted(running.items())),
            "the running driver uses other NVreg_DeviceFile* values until it is reloaded or the node reboots"))
    return _device_nodes.changed(planned), findings, details


def audit_containerd(params):
    plan = _containerd.decide(params)
    # the runtime containerd gives a pod without a RuntimeClass: gpuharden explain's answer to "how can a pod that
    # requests no GPU open one" where it is the NVIDIA runtime
    details = _operator_parts({"config_version": plan["config_version"], "files": plan["files"], "runtime_name": plan["runtime_name"],
                               "default_runtime_name": plan["current"]["default_runtime_name"]}, plan)
    findings = []
    if plan["changes"]:
        findings.append(finding(
            "containerd_nvidia_runtime", "error",
            {"runtime_name": plan["runtime_name"], "runtime": plan["desired"]["runtime"],
             "default_runtime_name": plan["desired"]["default_runtime_name"], "enable_cdi": plan["desired"]["enable_cdi"]},
            {"runtime": plan["current"]["runtime"], "default_runtime_name": plan["current"]["default_runtime_name"],
             "enable_cdi": plan["current"]["enable_cdi"]},
            "; ".join(plan["actions"]) or "containerd's config differs from the nvidia runtime the stage writes",
            path=plan["runtime_file"]))
    problem = _containerd.binary_problem(plan)
    if problem:
        findings.append(finding(
            "containerd_runtime_binary_missing", "error",
            "an executable %s" % plan["runtime_binary"], plan["runtime_binary_state"],
            "install the NVIDIA container toolkit (nvidia-container-toolkit): %s" % problem, path=plan["runtime_binary"]))
    return bool(plan["changes"]), findings, details


def _where(source):
    if not source or source.get("kind") == "default":
        return "the kubelet's default"
    detail = ", ".join(str(value) for key, value in sorted(source.items()) if key != "kind" and value is not None)
    return "%s %s" % (source.get("kind", ""), detail) if detail else str(source.get("kind"))


def audit_kubelet(params):
    # The role removes stale manager checkpoints whenever it finds them (with the kubelet stopped), so the
    # audit plans with that option on: a stale checkpoint is drift the stage fixes.  The whole plan is read without
    # require_durable, so that a refused write still shows what differs; the stage's own plan applies it.
    plan = _kubelet.decide(dict(params, remove_stale_state=True, require_durable=False))
    stage_plan = _kubelet.refuse_unless_durable(plan, params.get("require_durable"))
    changes = [change for change in stage_plan["changes"] if change.changed]
    reverts = _kubelet.kubeadm_upgrade_reverts(plan)
    moved = set(reverts["fields"]) if reverts and reverts["fixed_by_plan"] else set()
    findings = []
    numa_limit = plan["numa_limit"]
    for field, source in sorted(plan["sources"].items()):
        # a value that only moves out of config.yaml into the drop-in is the kubeadm finding below, not one per field
        if source["before"] != source["after"] or (source["source_before"] != source["source_after"] and field not in moved):
            raised = numa_limit["action"] == "raised" and field == "topologyManagerPolicyOptions.max-allowable-numa-nodes"
            findings.append(finding(
                "kubelet_setting", "error",
                source["after"], source["before"],
                numa_limit["warning"] if raised else "the kubelet reads %s from %s; the stage sets it in %s"
                % (field, _where(source["source_before"]), _where(source["source_after"])),
                subject=field))
    if reverts:
        findings.append(kubeadm_revert_finding(reverts, plan))
    for entry in plan["stale_state_files"]:
        findings.append(finding(
            "kubelet_stale_checkpoint", "error", "no checkpoint from another policy",
            entry["reason"], "the kubelet refuses to start with it after the policy change; the stage removes it "
            "with the kubelet stopped", path=entry["path"]))
    if changes and not findings:
        for change in changes:
            findings.append(finding(
                "kubelet_config_file", "warning", change.reason,
                "missing" if change.before is None else ("present" if change.after is None else "differs"),
                "the effective settings match, but the stage rewrites this file", path=change.node_path))
    # "plan": what kubelet_config in check mode returns for the same options, less its files, so that harden's kubelet
    # stage takes its plan from here instead of reading the node again (roles/kubelet_topology/tasks/plan.yml). Its
    # "changed" counts the stale checkpoints the stage removes; they make "restart_required" true either way.
    plan_without_files = {key: value for key, value in stage_plan.items() if key != "changes"}
    details = {"service": plan["service"], "flavor": plan["flavor"], "config_file": plan["config_file"],
               "policies": plan.get("policies_set", {}), "numa_limit": numa_limit, "persistence": stage_plan["persistence"],
               "persistence_reason": stage_plan["persistence_reason"], "plan": dict(plan_without_files, changed=bool(changes))}
    details.update(kubelet_parts_left_out(stage_plan["refused"], numa_limit))
    return bool(changes), findings, details


def kubeadm_revert_finding(reverts, plan):
    """kubelet_reverts_on_kubeadm_upgrade: remediable where the plan moves the values to a drop-in kubeadm never rewrites;
    an error where the revert would stop the kubelet on its checkpoint (_kubelet.kubeadm_upgrade_reverts)."""
    shown = ", ".join("%s=%s" % (field, reverts["values"][field]) for field in reverts["fields"])
    if reverts["stops_kubelet"]:
        hint = ("`kubeadm upgrade node` rewrites %s from the kubelet-config ConfigMap: unless the ConfigMap sets the same %s, "
                "the kubelet restarts on another policy and refuses its checkpoint (cpu_manager_state / memory_manager_state "
                "of the policy it ran), so it does not start" % (_kubelet.KUBEADM_CONFIG, " and ".join(reverts["stops_kubelet"])))
    else:
        hint = ("`kubeadm upgrade node` rewrites %s from the kubelet-config ConfigMap: these settings revert silently unless "
                "the ConfigMap carries them" % _kubelet.KUBEADM_CONFIG)
    if reverts["fixed_by_plan"]:
        hint += "; the stage moves them to a --config-dir drop-in kubeadm never rewrites"
    else:
        hint += "; the stage cannot move them: %s" % plan["persistence_reason"]
    # subject: the fields, which drift matches against those harden's admission check keeps on the node (drift.apply_kept)
    return finding("kubelet_reverts_on_kubeadm_upgrade", "error" if reverts["stops_kubelet"] else "warning",
                   "in a --config-dir drop-in kubeadm never rewrites", "%s in %s" % (shown, _kubelet.KUBEADM_CONFIG), hint,
                   planned=reverts["fixed_by_plan"], path=_kubelet.KUBEADM_CONFIG, subject=", ".join(reverts["fields"]))


def kubelet_parts_left_out(refused, numa_limit):
    """The kubelet stage's refusals and its NUMA limit as the audit's states: MemoryQoS on a cgroup v1 node could not be
    checked (the node lacks what it needs), nor a Topology Manager policy's NUMA limit where sysfs could not be read; a
    write refused for require_durable, or a policy kept because raising the NUMA limit is not safe, is refused."""
    parts = {}
    for entry in refused:
        if entry["what"].startswith(_kubelet.MEMORY_QOS_GATE):
            parts.setdefault(NOT_CHECKED, []).append({"what": "kubelet " + entry["what"], "cause": entry["why"], "fix": entry["fix"]})
        else:
            parts.setdefault(REFUSED, []).append(dict(entry))
    if numa_limit["action"] == "unknown":
        parts.setdefault(NOT_CHECKED, []).append({
            "what": "kubelet NUMA limit (topologyManagerPolicy %s)" % numa_limit["policy"], "cause": numa_limit["warning"],
            "fix": "give node_audit the node's /sys under its root (a pod: mount the host's /sys at <root>/sys)"})
    return parts


# A tool prerequisite, not the node's state: a node without the package is not broken, it cannot be checked.
PYNVML_FIX = ("install nvidia-ml-py into the Python that runs gpuharden's node modules (requirements-node.txt; "
              "playbook gpuharden.k8s.bootstrap_gpu_node ships it)")


def _need_pynvml(check):
    if not _nvml.HAS_PYNVML:
        raise GpuhardenError("node_audit: the %s check needs nvidia-ml-py (import pynvml), which the node's Python (%s) cannot import"
                             % (check, sys.executable), fix=PYNVML_FIX)


def _mig_spec():
    from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _mig_nvml

    return _mig_nvml.argument_spec()


def _mig_rules():
    from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _mig_nvml

    return _mig_nvml.OPTION_RULES


def audit_mig(params):
    from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig
    from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _mig_nvml

    _need_pynvml("mig")
    entries = _mig_nvml.entries_from_params(params)
    with _mig_nvml.Session():
        gpus = _mig_nvml.read_node()
        decision = _mig.plan_node(gpus, entries, params["force"], params["strategy"])
    steps = [step for index in sorted(decision["plans"]) for step in decision["plans"][index]["steps"]]
    findings = list(decision["findings"])
    for busy in decision["busy"]:
        findings.append(finding(
            "mig_gpu_busy", "warning", "no GPU processes on a GPU whose layout changes",
            "pids %s on GPU %s" % (", ".join(map(str, busy["pids"])), busy["index"]),
            "the mig stage drains the node first (mig_drain) or refuses without force", gpu=busy["index"]))
    return bool(steps), findings, {"steps": len(steps)}


def audit_cgroup_memory(params):
    planned = _cgroup_memory.decide(params)
    findings = planned["findings"]
    changed = any(change.changed for change in planned["changes"])
    return changed, findings, {"pods": len(planned["pods"]), "not_found": planned["not_found"]}


def audit_nvml(params):
    _need_pynvml("nvml")
    result = _nvml_node.check(params)
    # What the controller-side gpu_consistency check takes per node (nvml_check's result and the GPU processes'
    # cgroups), so a drift run needs no second trip to the node for it.
    pids = [process["pid"] for process in result.get("processes") or []]
    report = dict(result, process_cgroups=_process_cgroups.read(params["root"], pids)["cgroups"])
    return False, result["findings"], {"gpu_count": result.get("gpu_count"), "node_report": report}


def audit_device_cgroups(params):
    result = _device_audit_node.run(params, keep_answer=True)
    details = {"summary": result["summary"], "allocation_source": result["allocation_source"], "pod_resources": result["pod_resources"]}
    if result["pod_resources_answer"] is not None:
        details["node_report_pod_resources"] = result["pod_resources_answer"]
    return False, result["findings"], details


# The three states of a check (the envelope): checked (status ok, drift or findings), could not check (NOT_CHECKED:
# the cause and the fix, never counted as clean or as drift) and refused (REFUSED: outside what gpuharden changes
# safely, named).  A check reports a part it could not run, or refuses to judge, as a list under these keys of its
# details: [{what, cause, fix}] and [{what, why, fix}]; a check that cannot run at all raises GpuhardenError (its
# result's ``fix`` says what fixes it) or OSError, and its status is NOT_CHECKED.
NOT_CHECKED = "not_checked"
REFUSED = "refused"
GENERIC_FIX = "fix what the cause names (the node, or the option named); the node's other checks still ran"


def not_checked_entry(what, error):
    """The could-not-check entry of a check that raised ``error``."""
    message = getattr(error, "msg", None) or str(error)
    fix = (getattr(error, "result", None) or {}).get("fix")
    return {"what": what, "cause": " ".join(str(message).split()), "fix": fix or GENERIC_FIX}


# name -> (spec, option rules or None, audit function), the spec and rules as functions (read only for a check that
# runs); the order is the order of harden_gpu_nodes.yml
CHECKS = (
    ("device_nodes", _device_nodes.argument_spec, None, audit_device_nodes),
    ("containerd", _containerd.argument_spec, None, audit_containerd),
    ("kubelet", _kubelet.argument_spec, None, audit_kubelet),
    ("mig", _mig_spec, _mig_rules, audit_mig),
    ("cgroup_memory", _cgroup_memory.argument_spec, None, audit_cgroup_memory),
    ("nvml", _nvml_node.argument_spec, None, audit_nvml),
    ("device_cgroups", _device_audit_node.argument_spec, None, audit_device_cgroups),
)
CHECK_NAMES = tuple(name for name, _spec, _rules, _function in CHECKS)


# The node-side stages of harden_gpu_nodes.yml, in its order, and the check that plans each (the one stage table: the
# playbook runs a stage where node_stages says so).  A stage runs where its check is not "ok": drift, findings, an
# error or a check that was not asked all run it, so that when in doubt the stage decides as it always did.  MIG is the
# exception: its check is left out exactly when no layout is asked for, and then the stage has nothing to do.
NODE_STAGES = (
    ("device_permissions", "device_nodes"),
    ("container_runtime", "containerd"),
    ("kubelet_topology", "kubelet"),
    ("mig", "mig"),
    ("cgroup_limits", "cgroup_memory"),
)


def node_stages(checks):
    """{stage: whether harden runs it on this node} from the checks' statuses."""
    runs = {}
    for stage, check in NODE_STAGES:
        status = checks.get(check, {}).get("status", "skipped")
        runs[stage] = status != "ok" and not (check == "mig" and status == "skipped")
    return runs


LOCK_SPEC = {
    "owner": {"type": "str", "required": True},
    "path": {"type": "path", "default": _node_lock.DEFAULT_PATH},
    "timeout": {"type": "int", "default": 0},
    "stale_after": {"type": "int", "default": _node_lock.DEFAULT_STALE_AFTER},
    # harden holds the lock from its plan to its post-check, and gives it back with node_lock state=released
    "hold": {"type": "bool", "default": False},
    # ... unless the plan leaves nothing to do on the node: then this run gives it back, and harden saves a trip
    "release_if_compliant": {"type": "bool", "default": False},
    # this run's controller process (the lookup gpuharden.k8s.controller_run): a dead run's lock is taken over at once
    "controller": {"type": "dict"},
}


def audit(params, clock=time.monotonic):
    """Run every check whose options are given, holding the node's run lock when ``lock`` is given (in this
    process: no extra round trips).  A check that cannot run is reported as an error finding and the others still
    run: a drift report with one broken check is more useful than none."""
    if not params.get("lock"):
        return _audit(params, clock)
    result = ArgumentSpecValidator(LOCK_SPEC).validate({k: v for k, v in params["lock"].items() if v is not None})
    if result.error_messages:
        raise GpuhardenError("node_audit: option lock: %s" % "; ".join(result.error_messages))
    lock = dict(result.validated_parameters, state="acquired")
    hold = lock.pop("hold")
    release_if_compliant = lock.pop("release_if_compliant")
    taken = _node_lock.run(lock)
    try:
        report = _audit(params, clock)
    except BaseException:
        _node_lock.run(dict(lock, state="released"))
        raise
    held = hold and not (release_if_compliant and _compliant(report, params["root"]))
    if not held:
        _node_lock.run(dict(lock, state="released"))
    report["lock"] = {"held": held, "taken_over": taken["taken_over"]}
    return report


def _compliant(report, root):
    """Harden runs no node-side stage here, and the node shows the driver's GPUs (a node without them fails harden's
    GPU-node check, or gets the device plugin stage's unlabelling; neither is this run's call).  The driver's list is
    the facts' where this run gathered them."""
    if any(report["summary"]["node_stages"].values()):
        return False
    facts = report.get("ansible_facts", {}).get("gpuharden")
    return bool(facts["driver_gpus"] if facts is not None else _host.driver_gpus(root))


# The checks whose stage the GPU Operator may own and that see nothing of it on the node (its MIG manager leaves no
# trace there): the audit defers them from the controller's reading alone (the gpu_operator option), node stage and what.
# containerd and device_nodes read the node's layout themselves, through their own gpu_operator option.
OPERATOR_ONLY_CHECKS = {"mig": ("mig", "the MIG layout of the node's GPUs")}


def _operator_gate(name, operator):
    """(refused, not_checked) of a check in OPERATOR_ONLY_CHECKS, from the controller's reading; ([], []) elsewhere."""
    if operator is None or name not in OPERATOR_ONLY_CHECKS:
        return [], []
    stage, what = OPERATOR_ONLY_CHECKS[name]
    refused, not_checked, _warnings = _gpu_operator.decide(stage, what, [], {"gpu_operator": operator})
    return refused, not_checked


def _audit(params, clock):
    root = params["root"]
    node = params.get("node_name")
    # What the controller read of the GPU Operator's ClusterPolicy for this node (with the stages taken over): it
    # replaces the checks' own gpu_operator option, the plan's reading being the one of this run
    operator = params.get("gpu_operator")
    findings, checks, node_report, pod_resources = [], {}, None, None
    started = clock()
    for name, spec, rules, function in CHECKS:
        given = params.get(name)
        if given is None:
            checks[name] = {"status": "skipped"}
            continue
        begun = clock()
        refused, operator_not_checked = _operator_gate(name, operator)
        if refused:
            checks[name] = {"status": "ok", "would_change": False, "findings": 0, "seconds": round(clock() - begun, 4),
                            "details": {}, REFUSED: refused}
            continue
        try:
            section = spec()
            if operator is not None and "gpu_operator" in section:
                given = dict(given, gpu_operator=operator)
            options = section_params(name, section, given, root, rules and rules())
            if node and "node_name" in options and not options.get("node_name"):
                options["node_name"] = node
            would_change, found, details = function(options)
        except (GpuhardenError, OSError) as error:
            # could not check: never a finding (a finding is drift or attention), never clean
            checks[name] = {"status": NOT_CHECKED, "not_checked": [not_checked_entry(name, error)],
                            "seconds": round(clock() - begun, 4)}
            continue
        findings.extend(found)
        if "node_report" in details:
            node_report = details.pop("node_report")
        # The kubelet's pod-resources answer the device_cgroups check read: gpu_consistency's exact allocation.
        pod_resources = details.pop("node_report_pod_resources", pod_resources)
        # drift: the stage would change something; findings: only what running the stage does not change
        status = "drift" if would_change else ("findings" if found else "ok")
        checks[name] = {"status": status, "would_change": would_change, "findings": len(found),
                        "seconds": round(clock() - begun, 4), "details": details}
        # A part of the check that could not run (a tool prerequisite the node lacks), or that the check refuses to
        # judge (another installer owns it): named beside what it did check.
        if operator_not_checked:
            details[NOT_CHECKED] = details.get(NOT_CHECKED, []) + operator_not_checked
        for state in (NOT_CHECKED, REFUSED):
            entries = details.pop(state, None)
            if entries:
                checks[name][state] = [dict(entry) for entry in entries]
    if node_report is not None and pod_resources is not None:
        node_report["pod_resources"] = pod_resources
    by_severity = _findings.by_severity(findings)
    extra = {}
    if params.get("facts"):
        from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _gpu_facts

        extra = {"ansible_facts": {"gpuharden": _gpu_facts.gather(root)}}
    return dict(extra, **{
        "findings": findings,
        "checks": checks,
        "summary": {
            "findings": len(findings),
            "by_severity": by_severity,
            "max_severity": _findings.max_severity(findings),
            "stages": _findings.remediable_stages(findings),
            "would_change": sorted(name for name, check in checks.items() if check.get("would_change")),
            "node_stages": node_stages(checks),
            # the checks (whole or in part) that could not run, and those that refused to judge what they found
            NOT_CHECKED: sorted(name for name, check in checks.items() if check.get(NOT_CHECKED)),
            REFUSED: sorted(name for name, check in checks.items() if check.get(REFUSED)),
        },
        "node_report": node_report,
        # the controller's reading the checks took (harden's stages take it from here, gpuharden_node_plan.gpu_operator)
        "gpu_operator": operator,
        "seconds": round(clock() - started, 4),
    })
