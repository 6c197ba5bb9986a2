# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The cluster's consistency check, once: the one function (``consistency_check``) the gpu_consistency module runs, and
`gpuharden drift` runs in its own Python from the options drift_check.yml hands it (``consistency_check_of_options``).

The result says where it ran (``ran_in``): RAN_IN_MODULE under Ansible, RAN_IN_CONTROLLER in the CLI's process; the
drift report carries it as ``cluster.ran_in``, and tests/integration/test_drift_parity.py holds the two paths' reports
to each other, field by field.

The LISTs (read_cluster), the pure check (_consistency.check), the settle loop, the admission prediction and the
RuntimeClass dry run folded into the same run are here, not in the module, so both callers run the same code.
"""

from __future__ import annotations

import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _consistency, _gpu_workloads, _runtime_class, _topology
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _findings, _waiter
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s, _k8s_objects, _k8s_snapshot, _resources
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._k8s_access import list_kind

MODULE = "gpu_consistency"
SETTLE_INTERVAL = 3
# Where the check ran, as its result and the drift report's cluster.ran_in say: the gpu_consistency module (a module
# run of ansible-playbook), or the process of the gpuharden CLI (gpuharden drift, from the play's hand-over).
RAN_IN_MODULE = "module"
RAN_IN_CONTROLLER = "controller process"
RAN_IN = (RAN_IN_MODULE, RAN_IN_CONTROLLER)


def argument_spec():
    spec = _k8s.auth_argument_spec()
    spec.update(
        nodes={"type": "list", "elements": "str", "default": []},
        node_reports={"type": "dict", "default": {}},
        pod_resources={"type": "dict", "default": {}},
        gpu_node_label={"type": "str", "default": "nvidia.com/gpu.present"},
        sharing_replicas={"type": "int", "default": 1},
        page_limit={"type": "int", "default": 500},
        settle_seconds={"type": "int", "default": 0},
        settle_nodes={"type": "list", "elements": "str"},
        restarted_at={"type": "dict", "default": {}},
        fail_on={"type": "str", "choices": list(_findings.FAIL_CHOICES), "default": "never"},
        topology={"type": "dict", "default": {}},
        admission={"type": "dict", "default": {}},
        workload_resources={"type": "list", "elements": "str", "default": ["nvidia.com/gpu"]},
        pods_snapshot={"type": "path"},
        runtime_class={"type": "dict"},
    )
    return spec


def read_cluster(api, page_limit, workload_kinds=(), pods=None):
    """The LISTs, made at the same time: (nodes, pods, controllers, {resource: pages}); ``pods`` given (a snapshot),
    no LIST of pods.

    ``controllers`` maps each of ``workload_kinds`` to its objects, or to the GpuhardenError its LIST failed with:
    the workloads only feed the topology check, which must not take the consistency check down with it.
    """
    def soft(kind):
        def read():
            try:
                return list_kind(MODULE, api, kind, page_limit)
            except GpuhardenError as error:
                return error, 0
        return read

    lists = {"Node": lambda: list_kind(MODULE, api, "Node", page_limit)}
    if pods is None:
        lists["Pod"] = lambda: list_kind(MODULE, api, "Pod", page_limit, field_selector=_consistency.POD_SELECTOR)
    lists.update((kind, soft(kind)) for kind in workload_kinds)
    read = _k8s.list_concurrently(lists)
    pages = {_resources.rbac(kind)[0]: count for kind, (_items, count) in read.items()}
    pages.setdefault("pods", 0)
    controllers = {kind: read[kind][0] for kind in workload_kinds}
    return read["Node"][0], read["Pod"][0] if pods is None else pods, controllers, pages


def _workloads(pods, controllers, resources):
    """(GPU workloads, None), or (None, why not) when a LIST failed or a workload's request is malformed."""
    failed = [str(objects) for objects in controllers.values() if isinstance(objects, GpuhardenError)]
    if failed:
        return None, "; ".join(failed)
    try:
        return _gpu_workloads.collect(dict(controllers, Pod=pods), resources), None
    except GpuhardenError as error:
        return None, "%s: %s" % (MODULE, error)


def gather(params):
    # taken (read and removed) first, so that a run that fails below leaves no snapshot behind
    snapshot = _k8s_snapshot.take(MODULE, "pods_snapshot", params["pods_snapshot"], "pods") if params["pods_snapshot"] else None
    if not params["page_limit"] or params["page_limit"] < 1:
        raise GpuhardenError("%s: option page_limit=%r must be a positive number of objects" % (MODULE, params["page_limit"]))
    for position, node in enumerate(params["nodes"]):
        if not node or not node.strip():
            raise GpuhardenError("%s: option nodes[%d]=%r is not a node name" % (MODULE, position, node))
    if params["settle_seconds"] is None or params["settle_seconds"] < 0:
        raise GpuhardenError("%s: option settle_seconds=%r must be 0 or more seconds" % (MODULE, params["settle_seconds"]))
    # Validate the reports before any request: bad input fails fast and clearly.
    _consistency.validate(params["node_reports"], params["pod_resources"], params["sharing_replicas"])
    topology = _gpu_workloads.topology_entries(MODULE, params["topology"] or {})
    admission = admission_entries(params["admission"] or {}, params["node_reports"])
    resources = [resource for resource in params["workload_resources"] or [] if resource]
    if (topology or admission) and not resources:
        raise GpuhardenError("%s: option workload_resources is empty: name at least one resource such as nvidia.com/gpu" % MODULE)
    restarted_at = _consistency.check_restarted_at(params["restarted_at"] or {}, "option restarted_at")
    runtime_class = None if params["runtime_class"] is None else _runtime_class.check_option(
        params["runtime_class"], "%s: option runtime_class" % MODULE)
    api = _k8s.api_client(params)
    started = time.monotonic()
    requests = {}
    # what the last read saw; the first read also lists the workload controllers, once: only the Nodes and pods change
    # while the run settles
    seen = {"reads": 0, "controllers": None, "snapshot": snapshot}

    def read_and_check():
        # Plain JSON trees from here on (no reference cycles): the cyclic collector would only walk them again.
        with _k8s.gc_paused():
            kinds = _gpu_workloads.CONTROLLER_KINDS if (topology or admission) and seen["controllers"] is None else ()
            nodes, pods, listed, pages = read_cluster(api, params["page_limit"], kinds, seen["snapshot"])
            seen["snapshot"] = None  # a read while settling lists the pods again
            if seen["controllers"] is None:
                seen["controllers"] = listed
            seen["findings"], seen["summary"] = _consistency.check(nodes, pods, params["node_reports"], params["pod_resources"],
                                                                   wanted=params["nodes"] or None, label=params["gpu_node_label"],
                                                                   replicas=params["sharing_replicas"])
            if topology or admission:
                seen["workloads"], seen["workloads_error"] = _workloads(pods, seen["controllers"], resources)
                seen["node_summaries"] = {node["metadata"]["name"]: _gpu_workloads.node_summary(node, resources) for node in nodes
                                          if node["metadata"].get("name") in topology or node["metadata"].get("name") in admission}
            seen["stale"] = _consistency.stale_statuses(nodes, restarted_at)
            seen["last_nodes"] = nodes if runtime_class else None
            # Freed while the collector is still off: switched back on over them, it would walk them all once more.
            del nodes, pods
        seen["reads"] += 1
        for kind, count in pages.items():
            requests[kind] = requests.get(kind, 0) + count
        seen["awaiting"] = _consistency.awaiting_advertisement(seen["findings"])
        waited_for = [node for node in seen["awaiting"] if params["settle_nodes"] is None or node in params["settle_nodes"]] + sorted(seen["stale"])
        return not waited_for, waited_for

    try:
        # settle_seconds=0 reads once; else again every SETTLE_INTERVAL, the last read at the deadline at the latest
        _waiter.wait_until("the cluster to settle (GPUs advertised, fresh node statuses)", read_and_check,
                           started + params["settle_seconds"], SETTLE_INTERVAL, final_look=True)
        findings, summary, stale, awaiting = seen["findings"], seen["summary"], seen["stale"], seen["awaiting"]
        workloads, workloads_error, node_summaries = seen.get("workloads"), seen.get("workloads_error"), seen.get("node_summaries", {})
        reads, last_nodes = seen["reads"], seen.pop("last_nodes")
        runtime_class_check = None if runtime_class is None else _runtime_class.dry_run(
            _k8s_objects.Client(api, MODULE), runtime_class, last_nodes, params["page_limit"])
        del last_nodes
    finally:
        api.close()
    if stale:
        findings = sorted(findings + _consistency.stale_status_findings(stale),
                          key=lambda item: (item["node"] or "", -_findings.severity_rank(item["severity"]), item["id"]))
    weighed = {} if not topology else {
        name: _gpu_workloads.weigh(MODULE, name, entry, workloads or (), node_summaries.get(name)) for name, entry in topology.items()}
    kept = {}
    for name, (switch, entry) in sorted(admission.items()):
        # without the workloads (a LIST refused), harden's admission check keeps the node: so does the prediction
        reason = _topology.kept_by_admission(
            switch, None if workloads_error else _gpu_workloads.weigh(MODULE, name, entry, workloads or (), node_summaries.get(name)),
            workloads_error)
        if reason:
            kept[name] = reason
    return {"findings": findings, "max_severity": _findings.max_severity(findings), "nodes": summary, "api_requests": requests,
            "settle": {"seconds": round(time.monotonic() - started, 1) if reads > 1 else 0, "reads": reads, "awaiting": awaiting,
                       "stale_status": sorted(stale)},
            "topology": weighed, "workloads_error": workloads_error if topology or admission else None, "kept": kept,
            "runtime_class_check": runtime_class_check}


def admission_entries(admission, reports):
    """{node: (the policy switch, its topology entry)} of the nodes of the admission option whose kubelet plan switches
    them to a policy that can refuse GPU pods, weighed with the GPUs of their node report; a node without one is left
    out (nothing to weigh).  Malformed input fails before any request."""
    entries = {}
    for name, plan in admission.items():
        if plan is not None and not isinstance(plan, dict):
            raise GpuhardenError("%s: option admission.%s=%r must be a kubelet plan (node_audit's checks.kubelet.details.plan)" % (MODULE, name, plan))
        switch = _topology.admission_switch(plan)
        gpus = ((reports or {}).get(name) or {}).get("gpus")
        if switch and gpus:
            entry = _gpu_workloads.topology_entries(MODULE, {name: {"gpus": gpus, "topology_manager_policy": switch["policy"],
                                                                    "topology_manager_scope": switch["scope"]}})[name]
            entries[name] = (switch, entry)
    return entries


def consistency_check(params, ran_in):
    """gpu_consistency's result for ``params`` (its validated options), with ``ran_in`` (one of RAN_IN): the one
    function both the module and `gpuharden drift` call."""
    if ran_in not in RAN_IN:
        raise GpuhardenError("%s: ran_in=%r is none of %s" % (MODULE, ran_in, ", ".join(RAN_IN)))
    return dict(gather(params), ran_in=ran_in)


def consistency_check_of_options(options, node_reports, ran_in=RAN_IN_CONTROLLER):
    """consistency_check for ``options`` (the module's options but node_reports, as drift_check.yml hands them over; a
    None value is an omitted option, as the playbook's ``omit``) and ``node_reports``, validated against the module's
    argument_spec as AnsibleModule validates them, with ``api_retries`` as the module's result has it.  Bad options are a
    GpuhardenError naming them, before any request."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator  # noqa: PLC0415 (the controller's ansible-core)

    if not isinstance(options, dict):
        raise GpuhardenError("drift_play's consistency_options is %r, not a dictionary of %s's options" % (options, MODULE))
    params = {name: value for name, value in options.items() if value is not None}
    params["node_reports"] = node_reports or {}
    validated = ArgumentSpecValidator(argument_spec()).validate(params)
    if validated.error_messages:
        raise GpuhardenError("%s: %s" % (MODULE, "; ".join(validated.error_messages)))
    # the requests it sent again, as _module_shell adds to the module's result (_k8s.RESULT_COUNTERS)
    retried_before = _k8s.retries_total()
    result = consistency_check(validated.validated_parameters, ran_in)
    return dict(result, api_retries=_k8s.retries_total() - retried_before)
