# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The device_plugin module's run (read, audit, decide, write, wait), so that harden's plan can make the same run in
check mode inside the module run it makes anyway (gpu_pods_info's device_plugin option) instead of a module run of
its own.  Controller side only."""

from __future__ import annotations

import copy
import time

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin, _node_labels, _runtime_class
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_shapes as _shapes
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._defaults import DEVICE_PLUGIN_VERSION, RUNTIME_CLASS_NAME
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._waiter import wait_until
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s_objects

POLL_SECONDS = 1.0
# How long a target Node may take to report the handler a runtime added in the same run (runtime_class_findings).
HANDLER_WAIT_SECONDS = 30.0
HANDLER_POLL_SECONDS = 2.0

# The module's options but the cluster identity's (_k8s.auth_argument_spec), in one place: the module's argument_spec
# and the plan's dry_run validate against the same.
OPTIONS = {
    "version": {"type": "str", "default": DEVICE_PLUGIN_VERSION},
    "image_registry": {"type": "str", "default": "nvcr.io/nvidia"},
    "image_repository": {"type": "str", "default": "k8s-device-plugin"},
    "pull_policy": {"type": "str", "default": "IfNotPresent", "choices": ["Always", "IfNotPresent", "Never"]},
    "image_pull_secrets": {"type": "list", "elements": "str", "default": [], "no_log": False},  # Secret names, not secrets
    "namespace": {"type": "str", "default": "kube-system"},
    "name": {"type": "str", "default": "nvidia-device-plugin-daemonset"},
    "config_map_name": {"type": "str", "default": "nvidia-device-plugin-config"},
    "selector_value": {"type": "str", "default": "nvidia-device-plugin-ds"},
    "node_selector": {"type": "dict", "default": {"nvidia.com/gpu.present": "true"}},
    "tolerations": {"type": "list", "elements": "dict", "default": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    "priority_class_name": {"type": "str", "default": "system-node-critical"},
    "mig_strategy": {"type": "str", "default": "none", "choices": ["none", "single", "mixed"]},
    "device_list_strategy": {"type": "list", "elements": "str", "default": ["envvar"]},
    "device_id_strategy": {"type": "str", "default": "uuid", "choices": ["uuid", "index"]},
    "fail_on_init_error": {"type": "bool", "default": True},
    "pass_device_specs": {"type": "bool", "default": False, "no_log": False},  # "pass" matches ansible-core's password pattern
    "nvidia_driver_root": {"type": "str", "default": "/"},
    "nvidia_dev_root": {"type": "str"},
    "device_discovery_strategy": {"type": "str", "choices": ["auto", "nvml", "tegra"]},
    "shared_devices_allocation_policy": {"type": "str", "choices": ["distributed", "packed"]},
    "time_slicing": {"type": "dict"},
    "gpu_feature_discovery": {"type": "bool", "default": False},
    "expected_resource_names": {"type": "list", "elements": "str", "default": ["nvidia.com/gpu"]},
    "remove_competing": {"type": "bool", "default": False},
    "runtime_class_name": {"type": "str", "default": RUNTIME_CLASS_NAME},
    "adopt_installers": {"type": "list", "elements": "str", "default": []},
    "force": {"type": "bool", "default": False},
    "force_conflicts": {"type": "bool", "default": True},
    "wait": {"type": "bool", "default": True},
    "wait_timeout": {"type": "int", "default": 300},
    "page_limit": {"type": "int", "default": 500},
    "node_labels": {"type": "dict", "options": copy.deepcopy(_node_labels.LABEL_OPTIONS)},
}


def check_params(params):
    if params["page_limit"] is None or params["page_limit"] < 1:
        raise GpuhardenError("device_plugin: option page_limit=%r must be a positive number of objects" % params["page_limit"])
    if params["wait_timeout"] is None or params["wait_timeout"] < 1:
        raise GpuhardenError("device_plugin: option wait_timeout=%r must be a positive number of seconds" % params["wait_timeout"])
    expected = [_device_plugin.qualify_resource(name) for name in params["expected_resource_names"] or []]
    if not expected:
        raise GpuhardenError("device_plugin: option expected_resource_names is empty")
    labelling = None if params["node_labels"] is None else _node_labels.check_params(params["node_labels"], "device_plugin", "node_labels")
    return _device_plugin.check_params(params), expected, labelling


def wait_rollout(client, ds, targets, timeout, page_limit, clock=time.monotonic, sleep=time.sleep):
    meta = ds["metadata"]

    def rolled_out():
        live = _shapes.check("DaemonSet", client.read("DaemonSet", meta["name"], meta["namespace"]) or ds, name=meta["name"],
                             namespace=meta["namespace"])
        state = _device_plugin.rollout(live)
        return state["done"], (live, state)

    waited = wait_until("DaemonSet %s/%s rolled out" % (meta["namespace"], meta["name"]), rolled_out, clock() + timeout, POLL_SECONDS,
                        final_look=True, clock=clock, sleep=sleep)
    live, state = waited.detail
    if waited.done:
        return state
    # timed out: the pods tell which nodes lack a ready plugin pod, and why
    selector = ",".join("%s=%s" % kv for kv in sorted(live["spec"]["selector"].get("matchLabels", {}).items()))
    pods = client.list("Pod", page_limit, namespace=meta["namespace"], label_selector=selector)
    state = _device_plugin.rollout(live, pods, targets)
    raise GpuhardenError(_device_plugin.rollout_message(_k8s_objects.describe(live), state, timeout), rollout=state)


def read_cluster_policies(client, page_limit):
    """The GPU Operator's ClusterPolicies: ([policies], None); ([], None) without its CRD (404: no operator);
    ([], finding) when this identity may not list them (403): reported, the ownerReferences still tell."""
    try:  # the GPU Operator's CRD, cluster-scoped (_resources.RESOURCES)
        return _shapes.check_all("ClusterPolicy", client.list("ClusterPolicy", page_limit)), None
    except GpuhardenError as error:
        if error.result.get("status") == 404:
            return [], None
        if error.result.get("status") != 403:
            raise
        return [], finding("plugin_operator_unknown", "warning", "readable", None,
                           "%s; whether the NVIDIA GPU Operator manages a plugin is told only by ownerReferences "
                           "(grant get/list on clusterpolicies.nvidia.com, deploy/rbac/gpuharden-rbac.yaml)" % error.msg,
                           subject="ClusterPolicies (nvidia.com/v1)", repair="manual")


def runtime_class_findings(client, name, nodes, targets, wait_seconds, clock=time.monotonic, sleep=time.sleep):
    """What keeps the plugin's pods from starting through the RuntimeClass they name: the class missing (the API server
    rejects such pods: ``plugin_runtime_class_missing``), or target Nodes that report runtime handlers without the
    class's handler (``runtime_class_handler_missing_on_node``: the sandbox is never created, FailedCreatePodSandBox).

    A node the same run just gave the runtime (role container_runtime restarted containerd) reports the handler once
    the kubelet has read the CRI status again and posted its Node status (pkg/kubelet/kubelet.go updateRuntimeUp every
    5 s, the node status every 10 s), so a Node still lacking it is read again until ``wait_seconds`` have passed.
    Returns (findings, the RuntimeClass's handler or None)."""
    if not name:
        return [], None
    live = client.read("RuntimeClass", name)
    live = None if live is None else _shapes.check("RuntimeClass", live, name=name)
    if live is None:
        return [finding("plugin_runtime_class_missing", "error", "present", None,
                        "RuntimeClass %s does not exist: the API server rejects the plugin's pods until it does; apply it "
                        "first (role gpuharden.k8s.runtime_class), or set runtime_class_name to \"\" where nvidia is "
                        "containerd's default runtime" % name, subject="RuntimeClass %s" % name, repair="manual")], None
    state = {"nodes": nodes, "gaps": None}

    def handlers_reported():
        if state["gaps"] is not None:  # a look after the first: read again the Nodes that lacked the handler
            lacking = set(_node_names(state["gaps"]))
            state["nodes"] = [_shapes.check("Node", client.read("Node", node["metadata"]["name"]) or node, name=node["metadata"]["name"])
                              if node["metadata"]["name"] in lacking else node for node in state["nodes"]]
        state["gaps"] = _runtime_class.node_handler_audit(state["nodes"], live, targets)["findings"]
        return not state["gaps"], state["gaps"]

    waited = wait_until("Nodes reporting RuntimeClass %s's handler" % name, handlers_reported, clock() + wait_seconds, HANDLER_POLL_SECONDS,
                        final_look=True, clock=clock, sleep=sleep)
    return waited.detail, live.get("handler")


def _node_names(gaps):
    """The Node names of runtime_class_handler_missing_on_node findings (subject "Node <name>")."""
    return [gap["subject"].split(" ", 1)[1] for gap in gaps]


def handler_gap_message(gaps, runtime_class, handler):
    """The refusal.  The pods are lost on those nodes first: the DaemonSet's RollingUpdate defaults to maxSurge 0 and
    maxUnavailable 1 (k8s.io/api apps/v1 and pkg/apis/apps/v1/defaults.go SetDefaults_DaemonSet), so the controller
    deletes a node's running plugin pod before it creates the new one (pkg/controller/daemon/update.go)."""
    names = _node_names(gaps)
    return ("device_plugin: not applied: %d node(s) the plugin lands on report no runtime handler %s (RuntimeClass %s): "
            "%s. Its pods would never start there, and a rolling update takes the running plugin off a node before its "
            "new pod starts, so those nodes would lose their GPUs. Add the nvidia runtime on them first (role "
            "container_runtime, with them in the run), or keep them out of the plugin's node selector"
            % (len(names), handler, runtime_class, ", ".join(names)))


def not_applied_summary(obj, refused):
    meta = obj["metadata"]
    return {"kind": obj["kind"], "name": meta["name"], "namespace": meta.get("namespace"), "action": "skip", "changed": False,
            "message": "not applied: %s" % "; ".join(entry["what"] for entry in refused), "resource_version": None}


def labels_diff(labelled):
    return [_node_labels.diff(labelled, _k8s_objects.dump)] if labelled["changed"] else []


def refuse(result, blocked, findings, repairs, objects, labelled, client, diff, warn):
    """The result of a run that applies nothing because another plugin serves the managed plugin's nodes: ``refused``
    ({what, why, fix} each, also a warning), the objects as not applied, only the node labels changed."""
    installers = sorted({f["installer"] for f in blocked if f.get("installer")})
    refused = [_device_plugin.refusal(entry) for entry in blocked]
    result.update(refused=refused, installers=sorted(set(result["installers"]) | set(installers)), changed=labelled["changed"],
                  objects=[not_applied_summary(obj, refused) for obj in objects])
    if installers:
        for repair in repairs:
            if repair["action"] == "delete":  # the managed plugin is not applied: the nodes would lose theirs
                repair.update(action="manual", reason=repair["reason"] + "; not deleted while another installer serves these nodes")
                for entry in findings:
                    if entry["subject"] == repair["object"]:
                        entry["repair"] = "manual"
    if warn is not None:
        for entry in refused:
            warn("device_plugin: not applied: %s: %s. Fix: %s" % (entry["what"], entry["why"], entry["fix"]))
    if diff:
        result["diff"] = labels_diff(labelled)
    result["api_requests"] = client.requests
    return result


def reconcile(client, params, check_mode=False, diff=False, warn=None):
    """The device_plugin module's run over ``client``: read, audit, decide (server-side dry runs), and unless
    ``check_mode`` write and wait.  ``params`` are the module's (validated) options; ``warn`` gets each warning the
    settings give.  Returns the module's result; raises GpuhardenError with the findings so far."""
    settings, expected, labelling = check_params(params)
    objects, config = _device_plugin.desired_objects(settings)
    plugin = objects[1]
    adopt = settings["adopt_installers"]
    result = {"config": config, "image": settings["image"], "rollout": {}, "deleted": [], "refused": []}
    labelled = {"changed": False}
    try:
        # Read: one paginated LIST per kind, one GET per ConfigMap a plugin reads.
        # Every answer is checked for the shape the audit reads before anything is read into it or sent (_shapes).
        daemonsets = _shapes.check_all("DaemonSet", client.list("DaemonSet", params["page_limit"]))
        nodes = _shapes.check_all("Node", client.list("Node", params["page_limit"]))
        if labelling is not None:
            # The node labels first, as gpu_node_labels would before this module: the plugin's nodes are picked from the
            # Nodes as the labels leave them (the server's answers; in check mode the patched copies).
            labelled, nodes = _node_labels.reconcile(client, nodes, labelling, apply=not check_mode)
            result["node_labels"] = labelled
        cluster_policies, operator_unknown = read_cluster_policies(client, params["page_limit"])
        config_maps = {}
        for namespace, name in _device_plugin.referenced_config_maps(daemonsets):
            try:
                live = client.read("ConfigMap", name, namespace)
                live = None if live is None else _shapes.check("ConfigMap", live, name=name, namespace=namespace)
            except GpuhardenError as error:
                if error.result.get("status") != 403:
                    raise
                config_maps[(namespace, name)] = _device_plugin.Unreadable(error.msg)  # another team's namespace: say so
                continue
            config_maps[(namespace, name)] = (live or {}).get("data") or {} if live is not None else None
        findings, repairs, targets = _device_plugin.audit(daemonsets, config_maps, nodes, plugin, expected, cluster_policies, adopt)
        findings += [operator_unknown] if operator_unknown else []
        result.update(findings=findings, repairs=repairs, target_nodes=targets,
                      installers=sorted({f["installer"] for f in findings if f.get("installer")}))
        # Decide: dry runs of every write, unless another plugin serves our nodes (then nothing is written at all).
        decisions = []
        remove_competing = params["remove_competing"]
        if not _device_plugin.blocking(findings, remove_competing):
            decisions = [_k8s_objects.plan(client, obj, params["force_conflicts"],
                                           _device_plugin.selector_immutable if obj["kind"] == "DaemonSet" else None) for obj in objects]
            findings += _device_plugin.foreign_live_objects(decisions, objects, cluster_policies, adopt,
                                                            {f["subject"] for f in findings})
        blocked = _device_plugin.blocking(findings, remove_competing)
        if blocked:
            return refuse(result, blocked, findings, repairs, objects, labelled, client, diff, warn)
        # Check mode shows the nodes as they are now, without waiting for a runtime this run does not add.
        class_findings, handler = runtime_class_findings(client, settings["runtime_class_name"], nodes, targets,
                                                         0 if check_mode else HANDLER_WAIT_SECONDS)
        findings += class_findings
        if class_findings and not check_mode:
            if handler is None:
                raise GpuhardenError("device_plugin: " + class_findings[0]["hint"], findings=findings, repairs=repairs)
            # Only a change of the DaemonSet replaces pods; one left as it is breaks nothing more than it has.
            if any(decisions[index]["changed"] for index, obj in enumerate(objects) if obj["kind"] == "DaemonSet"):
                raise GpuhardenError(handler_gap_message(class_findings, settings["runtime_class_name"], handler),
                                     findings=findings, repairs=repairs)
        for decision in decisions:
            if decision["action"] == "recreate" and not params["force"]:
                raise GpuhardenError(decision["message"], findings=findings, repairs=repairs)
        to_delete = [r for r in repairs if r["action"] == "delete"] if params["remove_competing"] else []
        for repair in to_delete:
            client.delete("DaemonSet", repair["name"], repair["namespace"], dry_run=True)
        changed = any(d["changed"] for d in decisions) or bool(to_delete)
        stored = [None] * len(objects)
        # Act once.
        if not check_mode:
            for index, obj in enumerate(objects):
                stored[index] = _k8s_objects.execute(client, obj, decisions[index], params["force_conflicts"], recreate=params["force"])
            for repair in to_delete:
                client.delete("DaemonSet", repair["name"], repair["namespace"], dry_run=False)
        result["deleted"] = ["%s/%s" % (r["namespace"], r["name"]) for r in to_delete]
        result["objects"] = [_k8s_objects.summary(decisions[i], obj, stored[i]) for i, obj in enumerate(objects)]
        if diff:
            result["diff"] = labels_diff(labelled)
            result["diff"] += [_k8s_objects.diff_entry(decisions[i], obj) for i, obj in enumerate(objects) if decisions[i]["changed"]]
            result["diff"] += [{"before": "%s\n" % r["object"], "after": "", "before_header": "%s (deleted: %s)" % (r["object"], r["reason"]),
                                "after_header": "(none)"} for r in to_delete]
        if params["wait"] and not check_mode:
            states = [wait_rollout(client, stored[i] or obj, targets, params["wait_timeout"], params["page_limit"])
                      for i, obj in enumerate(objects) if obj["kind"] == "DaemonSet"]
            result["rollout"] = dict(states[0], target_count=len(targets))
            if len(states) > 1:
                result["rollout"]["gpu_feature_discovery"] = states[1]
        result["changed"] = changed or labelled["changed"]
    except GpuhardenError as error:
        error.result.setdefault("api_requests", client.requests)
        if "node_labels" in result:
            # the labels were sent before the failure: the task says so
            error.result.setdefault("node_labels", result["node_labels"])
            error.result.setdefault("changed", labelled["changed"] and not check_mode)
        raise
    finally:
        if warn is not None:
            for warning in settings["warnings"]:
                warn(warning)
    result["api_requests"] = client.requests
    return result


def check_option(value, option):
    """An option holding the device_plugin module's options but the identity's (harden's plan: gpu_pods_info's
    device_plugin), validated as the module validates its own (types, choices, defaults, unknown keys, then
    check_params), before any request.  Returns the validated options."""
    if not isinstance(value, dict):
        raise GpuhardenError("%s must be a mapping of the device_plugin module's options, not %r" % (option, value))
    validated = ArgumentSpecValidator(copy.deepcopy(OPTIONS)).validate(value)
    if validated.error_messages:
        raise GpuhardenError("%s: %s" % (option, "; ".join(validated.error_messages)))
    params = validated.validated_parameters
    check_params(params)
    return params


def dry_run(client, params):
    """The device_plugin module's check mode inside another module's run: its result, with the warnings it would give
    as ``warnings`` and ``clean`` when it would change, report and warn nothing; a refusal (another installer's object
    to recreate, a failed request) is returned as ``failed``, ``msg`` and the findings so far, not raised: the caller's
    own result stands."""
    warnings = []
    try:
        result = reconcile(client, params, check_mode=True, warn=warnings.append)
    except GpuhardenError as error:
        return {"failed": True, "msg": str(error), "findings": error.result.get("findings") or [], "warnings": warnings,
                "api_requests": client.requests, "clean": False}
    # clean: the stage would change, report and warn nothing (harden leaves it out); ``changed`` alone decides whether
    # harden may give a compliant node's lock back early (a report touches no node)
    clean = not result.get("changed") and not result.get("findings") and not warnings
    return dict(result, warnings=warnings, clean=clean)
