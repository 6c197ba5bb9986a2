# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The stage engine's registry and its per-node decision (controller side: the action gpuharden.k8s.node_stages).

The stage registry says, once, for every stage of harden_gpu_nodes.yml and bootstrap_gpu_node.yml: its tags, whether
it works on a node or on the cluster, whether one of its steps drains the node, the node_audit check that plans it, the
module that applies it and the role whose options it takes, in the one order of the stages.  ``plan_node`` turns one
node_audit result, the run's tag selection and the play's switches into the node's ordered plan: each stage runs now
in the engine, runs in the play (its role: the containerd restarts' waves, the kubelet's and MIG's plans and drains,
the cluster-side stages once for the play), or is left out, each with why.

The decisions across the play's hosts (the budget's batch, the rollout's groups, whether the cluster-side stages run)
are the pure functions below ``plan_node``; they take plain values and return plain values, for the unit tests.

Everything here is pure: no Ansible import, no I/O.
"""

from __future__ import annotations

from collections import namedtuple

# One stage.  tags: the tags a play gives the stage's tasks (--tags kubelet_topology or cgroup_limits both select the
# kubelet stage: it writes cgroup_limits' MemoryQoS setting); side: "node" or "cluster"; drains: one of its steps may
# drain the node (planned in the first play, applied in harden's budgeted rollout); check: the node_audit check that
# plans it (None for a cluster-side stage); module: the module that applies it; engine: the engine runs that module
# itself (else the play runs the stage's role).
Stage = namedtuple("Stage", "name tags side drains check module role engine")

STAGES = (
    Stage("device_permissions", ("device_permissions",), "node", False, "device_nodes", "gpuharden.k8s.nvidia_device_nodes",
          "device_permissions", True),
    # the play runs it: its containerd restarts go a canary first, then in waves within the budget, across the hosts
    Stage("container_runtime", ("container_runtime",), "node", False, "containerd", "gpuharden.k8s.containerd_nvidia_runtime",
          "container_runtime", False),
    # before the device plugin, which runs with that class
    Stage("runtime_class", ("cluster", "runtime_class"), "cluster", False, None, "gpuharden.k8s.runtime_class", "runtime_class", False),
    Stage("kubelet_topology", ("kubelet_topology", "cgroup_limits"), "node", True, "kubelet", "gpuharden.k8s.kubelet_config",
          "kubelet_topology", False),
    Stage("mig", ("mig",), "node", True, "mig", "gpuharden.k8s.mig_layout", "mig", False),
    Stage("cgroup_limits", ("cgroup_limits",), "node", False, "cgroup_memory", "gpuharden.k8s.cgroup_memory", "cgroup_limits", False),
    # last: it advertises what the node ended up with
    Stage("device_plugin", ("cluster", "device_plugin"), "cluster", False, None, "gpuharden.k8s.device_plugin", "device_plugin", False),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
NODE_STAGE_NAMES = tuple(stage.name for stage in STAGES if stage.side == "node")
DRAINING_STAGES = tuple(stage.name for stage in STAGES if stage.drains)
# Every tag that selects a stage: the engine task carries them (besides "always"), so --tags <stage> reaches it.
STAGE_TAGS = tuple(sorted({tag for stage in STAGES for tag in stage.tags}))

# what the engine does with a stage on this node
RUN = "run"          # the engine runs the stage's module now
PLAY = "play"        # the play runs the stage (its role), as the plan says
LEFT_OUT = "left_out"


def by_name(name):
    return next(stage for stage in STAGES if stage.name == name)


def tag_selected(tags, only_tags=("all",), skip_tags=()):
    """Whether a task with these tags runs under --tags only_tags --skip-tags skip_tags.

    The rule of ansible-core 2.19 lib/ansible/playbook/taggable.py (Taggable.evaluate_tags), for a task that has tags:
    "always" runs unless skipped by name (or by "all" with it), "never" only when named, "all" and "tagged" select
    every tagged task."""
    tags, only_tags, skip_tags = set(tags), set(only_tags or ()), set(skip_tags or ())
    run = True
    if only_tags:
        run = ("always" in tags or ("all" in only_tags and "never" not in tags) or not tags.isdisjoint(only_tags)
               or ("tagged" in only_tags and "never" not in tags))
    if run and skip_tags:
        if "all" in skip_tags:
            run = "always" in tags and "always" not in skip_tags
        elif not tags.isdisjoint(skip_tags) or "tagged" in skip_tags:
            run = False
    return run


def node_stage_runs(audit, skip_compliant=True):
    """{node stage: whether this node needs it}: node_audit's stage table (summary.node_stages: a check that is not ok,
    could not run or was not asked runs its stage), or every stage when gpuharden_skip_compliant_stages is false (MIG
    only where a layout is asked for: its check is left out exactly when none is)."""
    if skip_compliant:
        table = audit.get("summary", {}).get("node_stages", {})
        return {name: bool(table.get(name, True)) for name in NODE_STAGE_NAMES}
    checks = audit.get("checks", {})
    return {name: name != "mig" or checks.get("mig", {}).get("status", "skipped") != "skipped" for name in NODE_STAGE_NAMES}


def _why_left_out(stage, audit, skip_compliant):
    status = audit.get("checks", {}).get(stage.check, {}).get("status", "skipped")
    if stage.name == "mig" and status == "skipped":
        return "no MIG layout is asked for (mig_config, mig_config_file or gpuharden_mig_layout)"
    return "compliant: its check (%s) is ok" % stage.check if skip_compliant else "not needed"


def is_gpu_node(facts):
    """A node shows an NVIDIA GPU: the driver lists one (/proc/driver/nvidia/gpus) or NVML counts one."""
    facts = facts or {}
    return bool(facts.get("driver_gpus")) or int(facts.get("gpu_count") or 0) > 0


def not_a_gpu_node_message(host, facts):
    reason = ((facts or {}).get("nvml") or {}).get("reason") or {}
    return ("%s shows no NVIDIA GPU (no /proc/driver/nvidia/gpus, NVML: %s). Set gpuharden_allow_non_gpu_nodes=true "
            "to run anyway." % (host, reason.get("code") or "no GPUs"))


def plan_node(audit, *, only_tags=("all",), skip_tags=(), skip_compliant=True):
    """The node's ordered plan: [{stage, action, why, side, drains}] in the stages' order, and runs: the node stages
    this node needs ({stage: bool}, what the play's stage includes test)."""
    runs = node_stage_runs(audit, skip_compliant)
    stages = []
    for stage in STAGES:
        entry = {"stage": stage.name, "side": stage.side, "drains": stage.drains}
        if not tag_selected(stage.tags, only_tags, skip_tags):
            entry.update(action=LEFT_OUT, why="left out by --tags/--skip-tags (its tags: %s)" % ", ".join(stage.tags))
        elif stage.side == "cluster":
            entry.update(action=PLAY, why="cluster side: once for the play")
        elif not runs[stage.name]:
            entry.update(action=LEFT_OUT, why=_why_left_out(stage, audit, skip_compliant))
        elif stage.engine:
            entry.update(action=RUN, why=_why_runs(stage, audit, skip_compliant))
        else:
            entry.update(action=PLAY, why=_why_runs(stage, audit, skip_compliant) + "; " + _why_in_play(stage))
        stages.append(entry)
    # untouched: no node-side stage runs on the node (its post-check reads no node: the plan's audit stands)
    return {"stages": stages, "runs": runs, "untouched": not any(runs.values())}


def _why_runs(stage, audit, skip_compliant):
    if not skip_compliant:
        return "every stage runs (gpuharden_skip_compliant_stages=false)"
    check = audit.get("checks", {}).get(stage.check)
    if check is None:
        return "its check (%s) was not asked: the stage decides" % stage.check
    if check.get("status") == "error":
        return "its check (%s) could not run: the stage decides" % stage.check
    return "its check (%s) is %s" % (stage.check, check.get("status"))


def _why_in_play(stage):
    if stage.drains:
        return "the play plans it (a step that drains the node waits for the budgeted rollout)"
    if stage.name == "container_runtime":
        return "the play restarts containerd a canary first, then in waves within the budget"
    return "the play runs its role"


def stage_summary(plan):
    """One readable line per stage: 'device_permissions: run (its check (device_nodes) is drift)'."""
    return ["%s: %s (%s)" % (entry["stage"], entry["action"].replace("_", " "), entry["why"]) for entry in plan["stages"]]


# --- node_audit's options, from the roles' variables (node_stages' audit_from_play) ----------------------------------

# node_audit's option: the role variable that holds it (each role's vars/main.yml, exposed by its tasks/audit_params.yml)
ROLE_AUDIT_OPTIONS = {
    "device_nodes": "device_permissions_audit_options",
    "containerd": "container_runtime_audit_options",
    "kubelet": "kubelet_topology_audit_options",
    "mig": "mig_audit_options",
    "cgroup_memory": "cgroup_limits_audit_options",
    "nvml": "postcheck_audit_nvml_options",
    "device_cgroups": "postcheck_audit_device_cgroup_options",
}
# the kubelet settings the cgroup_limits stage asks for (MemoryQoS): the kubelet stage writes them, so its check plans them
CGROUP_LIMITS_KUBELET_SETTINGS = "cgroup_limits_audit_kubelet_settings"
# a check its role leaves empty is not asked (no MIG layout, the post-check's NVML or device cgroup check off)
ASKED_ONLY_WHEN_SET = ("mig", "nvml", "device_cgroups")
# the options node_stages builds from the play: the roles' and the GPU Operator's reading of the plan's LIST
PLAY_AUDIT_OPTIONS = ("gpu_operator",) + tuple(ROLE_AUDIT_OPTIONS)


def merged(base, over):
    """``over`` merged into ``base``, mappings key by key at every depth, anything else replaced (Ansible's
    combine(recursive=true) with its default list_merge=replace)."""
    result = dict(base)
    for key, value in over.items():
        result[key] = merged(result[key], value) if isinstance(result.get(key), dict) and isinstance(value, dict) else value
    return result


def gpu_operator_option(node, gpu_pods, takeover):
    """node_audit's gpu_operator option for one node: its entry of the ClusterPolicy reading the plan's LIST took
    (gpu_pods_info's gpu_operator), the run's takeover list (gpuharden_operator_takeover) and why the reading is
    missing (its error, else the LIST's own failure; none where the LIST was not made)."""
    gpu_pods = gpu_pods or {}
    reading = gpu_pods.get("gpu_operator") or {}
    error = reading["error"] if "error" in reading else gpu_pods.get("msg")
    return dict((reading.get("nodes") or {}).get(node) or {}, takeover=list(takeover or []), error=error)


def audit_options(wanted, roles, node, gpu_pods, takeover):
    """The node_audit options named in ``wanted`` (PLAY_AUDIT_OPTIONS), built from the roles' variables.

    roles: {variable: value} for ROLE_AUDIT_OPTIONS' variables and CGROUP_LIMITS_KUBELET_SETTINGS; gpu_pods: the plan's
    one LIST of the batch (gpu_pods_info's result, a skipped or failed one, or None). The kubelet check takes the
    cgroup_limits stage's kubelet settings merged into its own; the memory check runs only with the pods that LIST found
    on the node (without a LIST it is not asked); MIG, NVML and the device cgroups only where their role sets options."""
    gpu_pods = gpu_pods if isinstance(gpu_pods, dict) else {}
    options = {}
    for name in wanted:
        if name == "gpu_operator":
            options[name] = gpu_operator_option(node, gpu_pods, takeover)
            continue
        value = roles[ROLE_AUDIT_OPTIONS[name]]
        if name == "kubelet":
            value = dict(value, settings=merged(value.get("settings") or {}, roles[CGROUP_LIMITS_KUBELET_SETTINGS] or {}))
        elif name == "cgroup_memory":
            if gpu_pods.get("pod_uids_by_node") is None:
                continue
            value = dict(value, pod_uids=gpu_pods["pod_uids_by_node"].get(node, []))
        elif name in ASKED_ONLY_WHEN_SET and not value:
            continue
        options[name] = value
    return options


# --- the plan's one LIST of the batch's GPU pods (the action gpuharden.k8s.node_plan_pods) --------------------------

# the cluster identity and Python of a role's cluster-side calls: a dry run rides in the LIST's module run only where
# its role's are the LIST's own (cgroup_limits')
IDENTITY = ("kubeconfig", "kube_context", "controller_python")
# the roles' variables the LIST's options are built from
LIST_SETTINGS = (
    tuple("cgroup_limits_" + key for key in IDENTITY + ("resource_prefixes",))
    + tuple("runtime_class_" + key for key in IDENTITY + ("audit_options", "nodes"))
    + tuple("device_plugin_" + key for key in IDENTITY + ("audit_options", "label_nodes", "gpu_label_key", "gpu_label_value", "taint"))
)


def _same_identity(settings, role):
    return all(settings["%s_%s" % (role, key)] == settings["cgroup_limits_" + key] for key in IDENTITY)


def gpu_pods_args(settings, nodes, *, pods_snapshot=False, dry_runs=False):
    """gpu_pods_info's options for the plan's one LIST of the GPU pods of ``nodes`` (the batch's Node names), with the
    GPU Operator's reading, and with dry_runs the dry runs of the RuntimeClass and device plugin stages: each only where
    its role calls the cluster with the LIST's identity and Python (cgroup_limits'); the device plugin's labels every
    node of the LIST as a GPU node where the role labels nodes (device_plugin_label_nodes).
    settings: {variable: value} for LIST_SETTINGS, booleans read."""
    args = {"nodes": list(nodes), "resource_prefixes": settings["cgroup_limits_resource_prefixes"], "pods_snapshot": bool(pods_snapshot),
            "gpu_operator": True}
    for option, key in (("kubeconfig", "kubeconfig"), ("context", "kube_context")):
        if settings["cgroup_limits_" + key]:
            args[option] = settings["cgroup_limits_" + key]
    if dry_runs and _same_identity(settings, "runtime_class"):
        args["runtime_class"] = dict(settings["runtime_class_audit_options"], nodes=settings["runtime_class_nodes"])
    if dry_runs and _same_identity(settings, "device_plugin"):
        labels = None
        if settings["device_plugin_label_nodes"]:
            labels = {"labels": {settings["device_plugin_gpu_label_key"]: settings["device_plugin_gpu_label_value"]},
                      "taint": settings["device_plugin_taint"], "nodes": list(nodes), "unlabel_nodes": []}
        args["device_plugin"] = dict(settings["device_plugin_audit_options"], node_labels=labels)
    return args


# --- decisions across the play's hosts ------------------------------------------------------------------------------

def unplanned_draining_steps(runs, planned):
    """The draining stages this node needs (its check is not ok) that this run did not plan (left out by --tags): a
    cordon an ended run left for such a step is not released.  planned: the draining stages whose plan ran here."""
    return [name for name in DRAINING_STAGES if runs.get(name) and name not in planned]


def rollout_group(disruptive, node, unavailable):
    """The group of harden's budgeted rollout a node goes to: the unavailable nodes first (repairing them takes
    nothing more away from the fleet), then the others; a node with no draining step stays out of it."""
    if not disruptive:
        return "gpuharden_no_rollout"
    return "gpuharden_rollout_first" if node in unavailable else "gpuharden_rollout_then"


def rollout_batch(budget, unavailable, rollout_nodes):
    """How many nodes of the rollout drain at a time: the budget less the nodes already unavailable for another
    reason (a node of the rollout that is unavailable takes no more from the fleet), at least one."""
    return max(budget - len(set(unavailable) - set(rollout_nodes)), 1)


def runtime_class_needed(dry_run, container_runtime_runs):
    """The RuntimeClass stage runs unless the plan's dry run of it (the same code, in the plan's LIST) would change and
    report nothing, and no node's containerd is about to change.  dry_run: that result (a mapping), None where it did
    not run; one that failed has no "changed"."""
    quiet = isinstance(dry_run, dict) and dry_run.get("changed", True) is False and dry_run.get("findings") == []
    return not quiet or any(container_runtime_runs)


def device_plugin_needed(*, skip_compliant, dry_runs, node_runs, gpu_node_set, driver_gpus):
    """Whether harden's device plugin stage runs: not where every batch's plan dry-ran it and it would change and
    report nothing (each dry run "clean"), no node-side stage runs on any node, no host sets gpuharden_gpu_node and
    every node's facts show its GPUs (the dry run labelled them all as GPU nodes).  dry_runs: each host's dry run (None
    where it did not run); node_runs: each host's {stage: bool} (None where it has no plan); driver_gpus: each host's
    driver_gpus fact (None where it has none)."""
    return (not skip_compliant
            or any(not (dry_run or {}).get("clean", False) for dry_run in dry_runs)
            or any(runs is None or any(runs.values()) for runs in node_runs)
            or any(gpu_node_set)
            or any(gpus is None for gpus in driver_gpus))


# --- harden's rollout, decided once for the play (the action gpuharden.k8s.harden_rollout) --------------------------

def nothing_cluster_side(*, skip_compliant, gpu_node_set, whole_play, device_plugin_dry_run):
    """Whether the audit may give a compliant node's run lock back at once: nothing cluster-side will touch the node.
    The plan's dry run of the device plugin stage (the one stage that reaches every node: a DaemonSet change rolls
    each node's plugin pod) ran, did not fail and would change nothing, and it covered the whole play (one batch); the
    node does not set its GPU-node label by hand (gpuharden_gpu_node).  The RuntimeClass is no node's."""
    dry_run = device_plugin_dry_run
    return bool(skip_compliant and not gpu_node_set and whole_play and isinstance(dry_run, dict)
                and not dry_run.get("failed", False) and not dry_run.get("changed", True))


def restart_nodes(hosts):
    """The Nodes whose containerd this run changes (their plan runs the container runtime stage), in play order.
    hosts: [{node, runs}] (runs: the plan's {stage: bool}, None where the host has no plan)."""
    return [host["node"] for host in hosts if (host.get("runs") or {}).get("container_runtime")]


def cordon_plan(hosts, left_cordoned):
    """What becomes of the cordon an ended gpuharden run left on a node (the fleet read's left_cordoned: [{node,
    record}]): released where this run has nothing to drain the node for; kept, with why, where a draining step could
    still be pending but this run did not plan its stage (--tags).  hosts: [{host, node, disruptive, unplanned}]."""
    records = {entry["node"]: entry.get("record") or {} for entry in left_cordoned or ()}
    release, kept = [], {}
    for host in hosts:
        if host["node"] not in records or host["disruptive"]:
            continue
        if not host["unplanned"]:
            release.append(host["host"])
            continue
        kept[host["host"]] = (
            "%s stays cordoned, as %s left it: the node's %s check is not ok and this run does not plan that stage "
            "(--tags); run harden with it to resume the step, or release the cordon by hand."
            % (host["node"], records[host["node"]].get("owner", "an ended gpuharden run"), " and ".join(host["unplanned"])))
    return {"release": release, "kept": kept}


def settle_nodes(hosts):
    """The Nodes whose containerd or kubelet the first play just restarted (hosts: [{node, restarted}]): the kubelet
    posts Ready=False for a while after a containerd restart, and this run's restart must not use up its budget."""
    return [host["node"] for host in hosts if host["restarted"]]


def rollout_plan(hosts, budget):
    """The budgeted rollout of the first play's batch: each host's group (rollout_group), the disruptive Nodes and the
    second play's batch size (rollout_batch; None where the budget was not read: no host of the batch drains).
    hosts: [{host, node, disruptive}]; budget: disruption_budget's result ({budget, unavailable: [{node}]}) or None."""
    disruptive = [host["node"] for host in hosts if host["disruptive"]]
    unavailable = [entry["node"] for entry in (budget or {}).get("unavailable") or ()]
    groups = {host["host"]: rollout_group(host["disruptive"], host["node"], unavailable) for host in hosts}
    batch = rollout_batch(int(budget["budget"]), unavailable, disruptive) if budget and "budget" in budget else None
    return {"groups": groups, "disruptive": disruptive, "batch": batch}


# --- harden's post-check, from what the run did to the node (harden_rollout step postcheck) --------------------------

def changed(result):
    """Ansible's ``is changed`` test (ansible-core 2.19 lib/ansible/plugins/test/core.py changed) for a registered
    result: its changed, else whether one of its loop results changed; an unset or skipped result did not change."""
    if not isinstance(result, dict):
        return False
    if "changed" in result:
        return bool(result["changed"])
    results = result.get("results")
    return isinstance(results, list) and any(isinstance(item, dict) and item.get("changed") for item in results)


def postcheck_inputs(*, check_mode, node_plan, owner, lock_path, settle_seconds, changed_results, kubelet_config):
    """The post-check role's inputs in harden's last play (postcheck_node_audit, postcheck_lock,
    postcheck_advertise_settle_seconds, postcheck_advertise_settle_this_node, postcheck_kubelet_restarted_at).

    - A node no stage touched (or any node in check mode) is as the plan's audit read it: the post-check takes that
      audit instead of a second read; else it reads the node again in one node_audit run, which gives the run lock
      back (none in check mode: no lock was taken).
    - The nodes whose plugin, kubelet or MIG layout this run changed wait for their advertised resources to settle
      (a restarted plugin pod registers anew, and the kubelet reports it on its next node status update); none in
      check mode.
    - A restarted kubelet's node is judged only from a status the new kubelet posted: the restart's time.
    changed_results: the registered results of the stages that change what a node advertises (the device plugin, the
    kubelet write, the MIG apply and re-apply), each None where it did not run; kubelet_config: the kubelet write's."""
    node_plan = node_plan if isinstance(node_plan, dict) else None
    untouched = bool(((node_plan or {}).get("plan") or {}).get("untouched", False))
    kubelet_config = kubelet_config if isinstance(kubelet_config, dict) else {}
    restarted_at = (kubelet_config.get("health") or {}).get("restarted_at") if kubelet_config.get("restarted") else None
    return {
        "postcheck_node_audit": node_plan if check_mode or untouched else None,
        "postcheck_lock": None if check_mode else {"owner": owner, "path": lock_path},
        "postcheck_advertise_settle_seconds": 0 if check_mode else int(settle_seconds),
        "postcheck_advertise_settle_this_node": any(changed(result) for result in changed_results),
        "postcheck_kubelet_restarted_at": restarted_at,
    }
