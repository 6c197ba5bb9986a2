# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Cordon, drain and uncordon planning for ``node_maintenance``: pure functions over API objects (plain dicts).

``classify`` sorts the pods of the nodes into those to evict, to skip (DaemonSet and mirror pods), to
wait for (already terminating) and to refuse (no controller without ``force``, emptyDir without
``delete_emptydir_data``), as kubectl drain does.  ``predict_blocks`` says which evictions the
PodDisruptionBudgets' current ``disruptionsAllowed`` would refuse (check mode).  ``run_evictions`` and
``wait_gone`` are the retry loops, with the API calls, the clock and the sleep passed in.  ``plugin_restart_plan``
picks the NVIDIA device plugin's own pods of the nodes, which a drain leaves running, for a restart.
"""

from __future__ import annotations

import json
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._device_plugin import plugin_container
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._waiter import wait_until
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s._resources import api_version

RESTART_PLUGIN = "device_plugin_restarted"
RELEASED = "released"
STATES = ("cordoned", "drained", "uncordoned", RESTART_PLUGIN, RELEASED)
# Every cordon gpuharden makes carries this annotation: which run made it, when, and for what.  A run that is
# interrupted or fails leaves the node cordoned on purpose (a drained node, half-configured GPUs); the record lets the
# drift check name that cordon (node_left_cordoned) and the next harden release or resume it, while a cordon without
# the record (someone else's maintenance) stays as it is.  The NVIDIA GPU Operator's upgrade controller keeps its own
# bookkeeping on the Node the same way (NVIDIA/k8s-operator-libs pkg/upgrade/consts.go,
# UpgradeInitialStateAnnotationKeyFmt: whether the node was unschedulable before it cordoned it).
CORDON_ANNOTATION = "gpuharden.io/cordon"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
FINISHED_PHASES = ("Succeeded", "Failed")
MULTIPLE_PDBS = "more than one PodDisruptionBudget"


def pod_ref(pod):
    meta = pod.get("metadata") or {}
    return {"namespace": meta.get("namespace"), "name": meta.get("name"), "uid": meta.get("uid"),
            "node": (pod.get("spec") or {}).get("nodeName")}


def label(ref):
    return "%s/%s" % (ref["namespace"], ref["name"])


def controller_of(pod):
    """(kind, name) of the pod's controller ownerReference, or None."""
    for owner in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return owner.get("kind"), owner.get("name")
    return None


def check_nodes(nodes):
    """The node names, validated and without duplicates, in order."""
    if not nodes:
        raise GpuhardenError("node_maintenance: option nodes is empty: name at least one node")
    names = []
    for position, node in enumerate(nodes):
        if not isinstance(node, str) or not node.strip() or any(char in node for char in ",=/ "):
            raise GpuhardenError("node_maintenance: option nodes[%d]=%r is not a node name" % (position, node))
        if node not in names:
            names.append(node)
    return names


def check_options(params):
    if params["state"] not in STATES:
        raise GpuhardenError("node_maintenance: option state=%r must be one of %s" % (params["state"], ", ".join(STATES)))
    for option in ("timeout", "retry_interval", "poll_interval"):
        value = params.get(option)
        if value is None or not value > 0:
            raise GpuhardenError("node_maintenance: option %s=%r must be a positive number of seconds" % (option, value))
    if params.get("grace_period") is not None and params["grace_period"] < 0:
        raise GpuhardenError("node_maintenance: option grace_period=%r must be 0 or more seconds" % params["grace_period"])
    if params.get("ready_timeout") is not None and not params["ready_timeout"] >= 0:
        raise GpuhardenError("node_maintenance: option ready_timeout=%r must be 0 or more seconds" % params["ready_timeout"])
    if params.get("page_limit") is not None and params["page_limit"] < 1:
        raise GpuhardenError("node_maintenance: option page_limit=%r must be a positive number of objects" % params["page_limit"])


def cordon_plan(nodes, current, state):
    """{node: desired spec.unschedulable} for the nodes whose flag must change; ``current`` is {node: bool}."""
    if state == RESTART_PLUGIN:
        return {}  # the plugin's restart leaves spec.unschedulable as it is
    desired = state in ("cordoned", "drained")
    return {node: desired for node in nodes if bool(current[node]) != desired}


def cordon_patch(unschedulable, record=False):
    """The merge patch kubectl cordon/uncordon sends (kubectl v0.36.3 pkg/drain/cordon.go: spec.unschedulable), with
    gpuharden's cordon record set (a dict), removed (None) or left as it is (False)."""
    patch = {"spec": {"unschedulable": True if unschedulable else None}}
    if record is not False:
        patch["metadata"] = {"annotations": {CORDON_ANNOTATION: None if record is None else record_value(record)}}
    return patch


def new_record(owner, purpose, now=None):
    """The record of a cordon this run makes: {owner, at (UTC), for}."""
    return {"owner": owner, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now)),
            "for": purpose or None}


def record_value(record):
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def cordon_record(node):
    """The record of the cordon gpuharden made on a Node object ({owner, at, for}), or None.  A value that is not the
    record's JSON is kept as {"owner": None, "unreadable": value}: gpuharden's, but of no run it can name."""
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(CORDON_ANNOTATION)
    if value is None:
        return None
    try:
        record = json.loads(value)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("owner"), str):
        return {"owner": None, "unreadable": value}
    return {"owner": record["owner"], "at": record.get("at"), "for": record.get("for")}


def cordon_state(node):
    """What node_maintenance reads of a Node: {unschedulable, record (cordon_record), value (the annotation's text)}."""
    return {"unschedulable": bool((node.get("spec") or {}).get("unschedulable")), "record": cordon_record(node),
            "value": ((node.get("metadata") or {}).get("annotations") or {}).get(CORDON_ANNOTATION)}


def left_cordon(state, owner):
    """The record of a cordon another gpuharden run left on the node (the node cordoned, with a record that is not
    ``owner``'s), or None."""
    record = state["record"]
    if state["unschedulable"] and record is not None and record["owner"] != owner:
        return record
    return None


def adoptions(nodes, states, state, owner):
    """The nodes whose cordon another gpuharden run left, which this run takes on (its record names this run from now
    on, and this run's uncordon ends it) because it cordons or drains them again: the rollout resumes there."""
    if state not in ("cordoned", "drained"):
        return []
    return [node for node in nodes if left_cordon(states[node], owner) is not None]


def release_plan(nodes, states, owner):
    """For state released: (the nodes to release, {node: why another is left alone})."""
    release, kept = [], {}
    for node in nodes:
        state = states[node]
        if left_cordon(state, owner) is not None:
            release.append(node)
        elif not state["unschedulable"]:
            kept[node] = "not cordoned"
        elif state["record"] is None:
            kept[node] = "cordoned by someone else (no gpuharden record): left as it is"
        else:
            kept[node] = "cordoned by this run (%s): its own uncordon ends it" % owner
    return release, kept


def release_patch(value):
    """The JSON patch (RFC 6902) that releases a cordon gpuharden left: applied only while the record is still the one
    read (the test op), so that a cordon made since, by anyone, stays."""
    path = "/metadata/annotations/" + CORDON_ANNOTATION.replace("~", "~0").replace("/", "~1")
    return [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path},
            {"op": "test", "path": "/spec/unschedulable", "value": True}, {"op": "remove", "path": "/spec/unschedulable"}]


def describe_record(record):
    """A cordon record for a message: "<owner> at <time> (for <what>)"."""
    if record.get("owner") is None:
        return "an unreadable record %r" % record.get("unreadable")
    return "%s at %s%s" % (record["owner"], record.get("at") or "an unknown time", " (for %s)" % record["for"] if record.get("for") else "")


def _pods_on(pods, nodes):
    """(pod, ref, metadata, controller) of the pods bound to ``nodes``, by node, namespace and name; the ref also holds
    the pod's labels (for the budgets), its controller as kind/name and its phase."""
    wanted = set(nodes)
    bound = [(pod_ref(pod), pod) for pod in pods]
    bound = [(ref, pod) for ref, pod in bound if ref["node"] in wanted]
    for ref, pod in sorted(bound, key=lambda item: (item[0]["node"] or "", item[0]["namespace"] or "", item[0]["name"] or "")):
        meta = pod.get("metadata") or {}
        controller = controller_of(pod)
        ref.update(labels=meta.get("labels") or {}, controller="%s/%s" % controller if controller else None,
                   phase=(pod.get("status") or {}).get("phase"))
        yield pod, ref, meta, controller


def classify(pods, nodes, force=False, delete_emptydir_data=False):
    """Sort the pods bound to ``nodes``: {evict, skipped, waiting, refused}, each a list of refs.

    skipped: DaemonSet pods (the DaemonSet controller would put them back at once; the node's own agents,
    the NVIDIA device plugin among them, keep running) and mirror pods (static pods: the API cannot
    remove them).  waiting: pods already terminating.  refused: pods without a controller (gone for good
    once evicted) unless ``force``, and pods with emptyDir volumes (their data is lost) unless
    ``delete_emptydir_data``.  Finished pods (Succeeded/Failed) are evicted without either flag.
    """
    plan = {"evict": [], "skipped": [], "waiting": [], "refused": []}
    for pod, ref, meta, controller in _pods_on(pods, nodes):
        finished = ref["phase"] in FINISHED_PHASES
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            plan["skipped"].append(dict(ref, reason="mirror pod (static pod of the kubelet)"))
        elif controller and controller[0] == "DaemonSet":
            plan["skipped"].append(dict(ref, reason="DaemonSet pod"))
        elif meta.get("deletionTimestamp"):
            plan["waiting"].append(dict(ref, reason="already terminating"))
        elif not controller and not finished and not force:
            plan["refused"].append(dict(ref, reason="no controller: it would be gone for good (force: true evicts it)"))
        elif not finished and not delete_emptydir_data and any("emptyDir" in (volume or {}) for volume in (pod.get("spec") or {}).get("volumes") or []):
            plan["refused"].append(dict(ref, reason="emptyDir volume: its data would be lost (delete_emptydir_data: true evicts it)"))
        else:
            plan["evict"].append(ref)
    return plan


def plugin_restart_plan(pods, nodes):
    """The NVIDIA device plugin's pods on ``nodes`` to restart: {evict, skipped, waiting}, each a list of refs.

    The plugin enumerates the GPUs, and so the MIG devices, only when its plugins start (k8s-device-plugin
    cmd/nvidia-device-plugin/main.go, start: at start-up, on SIGHUP, on a new kubelet socket, 30 s after a failed
    start): after a MIG layout change the running plugin still advertises the GPU instances that are gone.  A pod whose
    container is the plugin (``_device_plugin.plugin_container``: not gpu-feature-discovery, the config manager or the
    MPS control daemon) is evicted when a DaemonSet starts it again; a static plugin pod (mirror pod) is skipped, and
    reported, since only its node's kubelet can restart it.  Any installer's plugin counts (this run's, Helm's, the
    GPU Operator's): each DaemonSet puts its pod back as it was.
    """
    plan = {"evict": [], "skipped": [], "waiting": []}
    for pod, ref, meta, controller in _pods_on(pods, nodes):
        if plugin_container(pod.get("spec") or {}) is None:
            continue
        if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
            plan["skipped"].append(dict(ref, reason="static device plugin pod: restart it on the node"))
        elif not controller or controller[0] != "DaemonSet":
            plan["skipped"].append(dict(ref, reason="device plugin pod without a DaemonSet to start it again: restart it yourself"))
        elif meta.get("deletionTimestamp"):
            plan["waiting"].append(dict(ref, reason="already terminating"))
        else:
            plan["evict"].append(ref)
    return plan


def refusal_message(refused):
    lines = ["%s on %s: %s" % (label(ref), ref["node"], ref["reason"]) for ref in refused]
    return "node_maintenance: cannot drain, %d pod(s) would be lost: %s. Nothing was evicted." % (len(refused), "; ".join(lines))


def _matches(selector, labels):
    """A policy/v1 LabelSelector against labels: {} matches everything, None nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def matching_pdbs(ref, pdbs):
    """Names of the PodDisruptionBudgets in the pod's namespace whose selector matches it."""
    found = []
    for pdb in pdbs:
        meta = pdb.get("metadata") or {}
        if meta.get("namespace") == ref["namespace"] and _matches((pdb.get("spec") or {}).get("selector"), ref.get("labels") or {}):
            found.append(meta.get("name"))
    return sorted(found)


def predict_blocks(evict, pdbs):
    """Evictions the budgets would refuse now, in order: [dict(ref, pdb, message)] (check mode).

    Each budget allows ``status.disruptionsAllowed`` evictions of healthy pods; pods that are not Running
    or already finished do not count.  A pod under two budgets is refused by the API server (500).
    """
    allowed = {}
    for pdb in pdbs:
        meta = pdb.get("metadata") or {}
        allowed[(meta.get("namespace"), meta.get("name"))] = int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)
    blocked = []
    for ref in evict:
        names = matching_pdbs(ref, pdbs)
        if not names or ref.get("phase") != "Running":
            continue
        if len(names) > 1:
            blocked.append(dict(ref, pdb=names, message="This pod has %s: %s" % (MULTIPLE_PDBS, ", ".join(names))))
            continue
        key = (ref["namespace"], names[0])
        if allowed[key] > 0:
            allowed[key] -= 1
        else:
            blocked.append(dict(ref, pdb=names, message="PodDisruptionBudget %s/%s allows no more disruptions now" % key))
    return blocked


def eviction_body(ref, grace_period=None, dry_run=False):
    body = {"apiVersion": api_version("Eviction"), "kind": "Eviction", "metadata": {"name": ref["name"], "namespace": ref["namespace"]}}
    options = {}
    if grace_period is not None:
        options["gracePeriodSeconds"] = grace_period
    if ref.get("uid"):
        options["preconditions"] = {"uid": ref["uid"]}  # never evict a pod that replaced this one under its name
    if dry_run:
        options["dryRun"] = ["All"]
    if options:
        body["deleteOptions"] = options
    return body


def eviction_outcome(status, body):
    """What an Eviction answer means: (outcome, message); outcome is evicted, gone, retry or blocked.

    201/200: accepted.  404: the pod is already gone.  409 with a UID precondition: it was replaced, so ours is
    gone.  429: a PodDisruptionBudget refuses it now (retry until the timeout).  500 naming several budgets:
    refused for good.  Anything else is an error the caller raises.
    """
    message = (body or {}).get("message") or ""
    causes = [cause.get("message") for cause in ((body or {}).get("details") or {}).get("causes") or [] if cause.get("message")]
    if causes:
        message = "%s (%s)" % (message, "; ".join(causes)) if message else "; ".join(causes)
    if status in (200, 201):
        return "evicted", message
    if status == 404 or (status == 409 and "precondition" in message.lower()):
        return "gone", message
    if status == 429:
        return "retry", message or "the eviction would violate a PodDisruptionBudget"
    if status == 500 and MULTIPLE_PDBS in message:
        return "blocked", message
    return None, message


def run_evictions(pending, evict, clock, sleep, deadline, retry_interval):
    """Evict every ref; retry the ones a budget refuses (429) until ``deadline``.

    ``evict(ref)`` returns (outcome, message) as ``eviction_outcome``.  Returns (evicted, gone, blocked);
    blocked entries carry the last ``message``.  Never deletes: a pod a budget protects stays.
    """
    evicted, gone, blocked = [], [], []
    state = {"pending": list(pending)}

    def evict_pending():
        retry = []
        for ref in state["pending"]:
            outcome, message = evict(ref)
            if outcome == "evicted":
                evicted.append(ref)
            elif outcome == "gone":
                gone.append(ref)
            elif outcome == "blocked":
                blocked.append(dict(ref, message=message))
            else:
                retry.append(dict(ref, message=message))
        state["pending"] = retry
        return not retry, retry

    if state["pending"] and not wait_until("evictions a PodDisruptionBudget refused (429)", evict_pending, deadline, retry_interval,
                                           clock=clock, sleep=sleep).done:
        blocked.extend(state["pending"])
    return evicted, gone, blocked


def wait_gone(refs, present_uids, clock, sleep, deadline, poll_interval):
    """Poll until no ref's UID is present any more or ``deadline``: the refs still there (a pod that came
    back under the same name with a new UID counts as gone).  ``present_uids()`` returns a set."""
    if not refs:
        return []

    def still_there():
        present = present_uids()
        remaining = [ref for ref in refs if ref["uid"] in present]
        return not remaining, remaining

    return wait_until("evicted pods gone", still_there, deadline, poll_interval, clock=clock, sleep=sleep).detail


def wait_ready(nodes, not_ready, clock, sleep, deadline, poll_interval):
    """Poll until every node's Ready condition is True or ``deadline``: {node: reasons} of those still not Ready.
    ``not_ready(node)`` returns the reasons, [] once Ready; a node found Ready is not asked again."""
    state = {"remaining": {node: None for node in nodes}}
    if not state["remaining"]:
        return {}

    def still_not_ready():
        state["remaining"] = {node: reasons for node, reasons in ((node, not_ready(node)) for node in state["remaining"]) if reasons}
        return not state["remaining"], state["remaining"]

    return wait_until("Nodes Ready", still_not_ready, deadline, poll_interval, clock=clock, sleep=sleep).detail


def public(ref, *extra):
    """A ref as the module returns it."""
    keys = ("namespace", "name", "uid", "node", "controller") + extra
    return {key: ref.get(key) for key in keys if key in ref}
