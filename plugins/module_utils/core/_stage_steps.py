# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Which steps of playbooks/tasks/stages.yml run on one host (controller side: the action gpuharden.k8s.stage_steps).

The importing playbook hands tasks/stages.yml one mapping, ``__stages`` (MODE below): the stage engine's result for the
node (node_stages, registered by harden as gpuharden_node_plan and by bootstrap as __bootstrap_plan) and how the
playbook runs the stages.  ``stage_steps`` turns it into one plain answer per include of the file, so that each include
tests one value; ``drain_steps`` decides, once the kubelet and MIG plans ran, the steps that depend on whether they drain
the node.

Everything here is pure: no Ansible import, no I/O.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._stage_plan import NODE_STAGE_NAMES

# The keys of __stages: (type, default; None: required)
MODE = {
    # node_stages' result: its plan.runs says which node-side stages this node needs
    "plan": (dict, None),
    # true: the steps that drain the node (kubelet manager policy, MIG layout) run here, in order, once the fleet's
    # disruption budget lets them (bootstrap); false: only their plans run here, the playbook drains later (harden)
    "inline_disruptive": (bool, None),
    # the containerd restarts' canary and waves (harden_rollout's restart_steps: left out, action stage_steps takes its
    # hand-over); none or empty: every node at once
    "container_runtime_steps": (list, None),
    # false: the RuntimeClass stage is left out (harden's gate found its dry run would change and report nothing)
    "runtime_class": (bool, True),
    # true: the device plugin stage is left out here, the playbook runs tasks/stage_device_plugin.yml later (harden)
    "device_plugin_later": (bool, False),
    # true: the kubelet stage plans from the plan's audit (node_stages' kubelet_plan, read before any stage wrote the
    # kubelet's files) instead of reading the node again (harden, whose audit checked the kubelet with the role's options)
    "audited_kubelet_plan": (bool, False),
    # this host's Node name, for the containerd waves; default gpuharden_k8s_node_name, else the inventory name
    "node_name": (str, None),
}
REQUIRED = ("plan", "inline_disruptive")


def _mode(stages):
    if not isinstance(stages, dict):
        raise GpuhardenError("__stages (the task importing playbooks/tasks/stages.yml) is %s, not a mapping" % type(stages).__name__)
    unknown = sorted(set(stages) - set(MODE))
    if unknown:
        raise GpuhardenError("__stages has unknown key(s) %s; known: %s" % (", ".join(unknown), ", ".join(sorted(MODE))))
    mode = {}
    for key, (kind, default) in MODE.items():
        value = stages.get(key)
        if value is None:
            if key in REQUIRED:
                raise GpuhardenError("__stages.%s is missing: the task importing playbooks/tasks/stages.yml must set it%s"
                                     % (key, " (or a task before hand the stage engine's plan over)" if key == "plan" else ""))
            value = default
        elif not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise GpuhardenError("__stages.%s is %r (%s), not a %s" % (key, value, type(value).__name__, kind.__name__))
        mode[key] = value
    return mode


def _runs(plan):
    runs = (plan.get("plan") or {}).get("runs")
    if not isinstance(runs, dict):
        raise GpuhardenError("__stages.plan has no plan.runs: give the stage engine's result (gpuharden.k8s.node_stages)")
    missing = [name for name in NODE_STAGE_NAMES if name not in runs]
    if missing:
        raise GpuhardenError("__stages.plan.plan.runs lacks the stage(s) %s" % ", ".join(missing))
    return {name: bool(runs[name]) for name in NODE_STAGE_NAMES}


def stage_steps(stages, *, node_name, gpu_pods=None):
    """The steps of tasks/stages.yml on this host, from the importing task's ``__stages``.

    ``node_name``: the Node name where __stages gives none; ``gpu_pods``: the plan's one LIST of the batch's GPU pods
    (node_plan_pods' hand-over), or None where the playbook made none.  Returns the node stages'
    runs (one key per node-side stage: what tasks/stage_container_runtime.yml tests) and, per include:
    container_runtime_steps (the loop: [None] is every node at once), runtime_class, kubelet_audited_plan (the kubelet
    plan's audited plan, or None), budget (the disruption budget runs here), cgroup_limits_gpu_pods (the LIST the
    cgroup_limits stage takes, or None: it lists itself), device_plugin.  The include of the containerd restarts loops
    over container_runtime_waves, one label per step (wave_label): its tasks take the step itself from this result
    (wave_step), so no step travels through a loop variable of the YAML; container_runtime_here: the labels of the steps
    whose containerd restarts include this host (restarts_here), what the include of the role tests."""
    mode = _mode(stages)
    runs = _runs(mode["plan"])
    audited = mode["plan"].get("kubelet_plan") if mode["audited_kubelet_plan"] else None
    # a LIST that failed, or none made, carries no pod_uids_by_node: the stage then lists the pods itself
    listed = isinstance(gpu_pods, dict) and "pod_uids_by_node" in gpu_pods
    restart_steps = mode["container_runtime_steps"] or [None]
    return dict(
        runs,
        node_name=mode["node_name"] or node_name,
        container_runtime_steps=restart_steps,
        container_runtime_waves=[wave_label(step) for step in restart_steps],
        container_runtime_here=[wave_label(step) for step in restart_steps
                                if restarts_here(step, runs["container_runtime"], mode["node_name"] or node_name)[0]],
        runtime_class=mode["runtime_class"],
        kubelet_audited_plan=audited if isinstance(audited, dict) else None,
        budget=mode["inline_disruptive"],
        cgroup_limits_gpu_pods=gpu_pods if listed else None,
        device_plugin=not mode["device_plugin_later"],
        inline_disruptive=mode["inline_disruptive"],
    )


def wave_label(step):
    """What the run prints for one step of the containerd restarts (the include's loop item): unique within a run, as
    it names the step's index."""
    if step is None:
        return "every node"
    nodes = ", ".join(step.get("nodes") or ()) or "the last wave back"
    return "wave %s: %s" % (step.get("index", 0), nodes)


def restarts_here(step, runs, node):
    """Whether the container runtime stage runs on the host of Node ``node`` in ``step`` (one of harden_rollout's
    restart_steps, or None: every node at once), and why: its plan runs the stage (``runs``) and its Node is one of
    the step's."""
    if not runs:
        return False, "the plan found containerd as the role wants it (or --tags left the stage out)"
    if step is not None and node not in (step.get("nodes") or ()):
        return False, "node %s restarts containerd in another wave" % node
    return True, "every node at once" if step is None else "wave %s" % step.get("index", 0)


def wave_step(steps, label):
    """The step of the containerd restarts the include's loop item ``label`` names, from step stages' result
    ``steps``."""
    restart_steps = steps.get("container_runtime_steps") if isinstance(steps, dict) else None
    if not isinstance(restart_steps, list):
        raise GpuhardenError("the containerd restarts run after step stages of gpuharden.k8s.stage_steps (its container_runtime_steps)")
    for step in restart_steps:
        if wave_label(step) == label:
            return step
    raise GpuhardenError("the containerd restarts have no step %r: loop over container_runtime_waves of step stages' result" % (label,))


def drain_steps(steps, *, kubelet_disruptive, mig_disruptive):
    """Once the kubelet and MIG plans ran: budget_wanted (this host wants a step that drains it: the budget's
    node_maintenance_budget_wanted), kubelet_apply (the kubelet settings are written here: all of them inline, else
    only those that need just a restart) and mig_apply (the MIG layout is applied here: inline only).  A plan that did
    not run (its stage compliant, or left out by --tags) drains nothing."""
    inline = bool(steps["inline_disruptive"])
    return {
        "budget_wanted": bool(kubelet_disruptive or mig_disruptive),
        "kubelet_apply": bool(steps["kubelet_topology"]) and (inline or not kubelet_disruptive),
        "mig_apply": inline and bool(mig_disruptive),
    }
