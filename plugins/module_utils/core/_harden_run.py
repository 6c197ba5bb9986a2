# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""harden_gpu_nodes.yml's steps around the stages, for one node: the run's name in the node locks, which of the
rollout's decisions fail the node, which draining steps run, when the run lock is given back, and the end-of-run
check for a run without any GPU node.  The playbook decided these in Jinja; plugins/action/harden_node.py reads the
play's variables and calls these pure functions (tests/unit/test_harden_node.py)."""

from __future__ import annotations

# The variables the playbook's steps set or register (facts of each host, or of localhost where said), by step.
NODE = "__harden_node"  # harden_node step=start: this host's Node name
OWNER = "__harden_owner"  # harden_node step=start: this run's name in the node's run lock and its cordon records
CONTROLLER = "__harden_controller"  # harden_node step=start: this run's ansible-playbook process
ROLLOUT = "__harden_rollout_plan"  # localhost: harden_rollout step=rollout, the second play's hosts (rollout_plan_fact)
# Hand-overs (plugin_utils/_handover.py: stamped with this run, as a fact cache keeps facts from an earlier run), each
# value the why: harden_node step=deferred hands over why the budget did not start the node's draining step (read by
# step=draining and step=verdict of=deferred); step=failed the draining step that failed, which stops the rollout
# (read by step=verdict of=failed, harden_rollout step=stopped and cluster_stage_gate stage=device_plugin).
DEFERRED = "__harden_deferred"
FAILED = "__harden_failed"
# harden_rollout step=restarts (run_once: every host of the batch) hands over {restart_steps, restart_not_allowed,
# runtime_class, left_cordoned}: read by stage_steps (tasks/stages.yml's containerd waves and RuntimeClass gate, where
# __stages gives them not), harden_node step=verdict of=restarts and harden_rollout step=rollout (the cordons to release).
RESTARTS = "__harden_restarts"
# registered by roles/postcheck/tasks/main.yml: its node_audit read, which gives the run lock back itself
POSTCHECK_READ = "__postcheck_node_read"
# Hand-overs of the plans of the draining stages (plugins/action/kubelet_topology_plan.py, the plan and the admission
# gate after it; plugins/action/mig_plan.py), each value whether the stage's change drains the node: handed over in this
# run = that plan ran (read by harden_node step=draining, harden_rollout, stage_steps step=drains).
DRAINING_PLANS = {"kubelet_topology": "__kubelet_topology_disruptive", "mig": "__mig_disruptive"}
# the custom stat a stopped rollout reports (gpuharden's CLI reads it from the run's stats)
ROLLOUT_FAILED_STAT = "gpuharden_rollout_failed"


def fact(variables, name, default=None):
    """A fact this playbook's actions set (top-level where Ansible injects facts as variables, else under ansible_facts)."""
    if name in variables:
        return variables[name]
    facts = variables.get("ansible_facts")
    return facts.get(name, default) if hasattr(facts, "get") else default


def run_owner(given, now, number):
    """The run's name in the node locks: gpuharden_run_owner where given, else ``harden@<UTC time>-<number>`` (``now``
    a datetime in UTC, ``number`` a random one: two runs started in the same second differ)."""
    return given or "harden@%s-%d" % (now.strftime("%Y%m%dT%H%M%S"), number)


def failure_message(failed_task, failed_result, step):
    """What a rescue fails (or records) the node with: the task that failed, else ``step``, and its message."""
    return "%s failed: %s" % ((failed_task or {}).get("name") or step, (failed_result or {}).get("msg") or "failed")


def verdict(kind, host, variables, localhost_variables=None, handed=None):
    """Why the node fails at this point of the run, or None.

    - ``restarts``: the budget does not allow its containerd restart at all (harden_rollout step=restarts);
    - ``cordons``: the cordon an ended run left could not be released (harden_rollout step=rollout, on localhost);
    - ``failed``: its draining step failed in the rollout (it stays as that step left it, cordoned if it was);
    - ``deferred``: its draining step was not started (the budget, or a node that failed before it).

    handed: this run's hand-overs of the host, {DEFERRED: why, FAILED: why, RESTARTS: harden_rollout step=restarts'}
    (each None or absent where not handed over)."""
    handed = handed or {}
    if kind == "restarts":
        return ((handed.get(RESTARTS) or {}).get("restart_not_allowed") or {}).get(host)
    if kind == "cordons":
        return ((fact(localhost_variables or {}, ROLLOUT) or {}).get("release_failed") or {}).get(host)
    if kind == "failed":
        failed = handed.get(FAILED)
        return "%s: %s" % (fact(variables, NODE) or host, failed) if failed else None
    return handed.get(DEFERRED) or None


def same_run(variables, run):
    """Whether harden_node step=start named this host in the run ``run`` (run_identity), not in an earlier run whose
    facts a persistent fact cache kept."""
    return run is not None and run_identity(fact(variables, CONTROLLER)) == run


def run_identity(controller):
    """This run, as harden_node step=start named its ansible-playbook process (None where unknown)."""
    if not hasattr(controller, "get"):
        return None
    return {key: controller.get(key) for key in ("host", "boot_id", "pid_ns", "pid", "start")}


def rollout_plan_fact(previous, run, groups, batch, fleet, release_failed):
    """The second play's rollout after one batch of the first play, from the plan the batches before left (``previous``,
    the fact of localhost; one of another run, left in a persistent fact cache, counts for nothing).

    groups: this batch's hosts' groups (module_utils/core/_stage_plan.py rollout_plan), in the play's order; batch:
    how many nodes drain at a time (None where no host of this batch drains: the one before stands); release_failed:
    {host: why} of this batch, hosts that fail before the second play and so stay out of it (a host failed in an
    earlier play would still take a place of a serial batch there: a canary batch of no node).  ``hosts``: the unavailable
    nodes first (repairing them takes nothing more away from the fleet), then the others, each in the order their
    batches came; ``serial``: the canary alone, then ``batch`` at a time."""
    previous = previous if hasattr(previous, "get") and previous.get("run") == run else {}
    plan = {"run": run, "fleet": fleet, "batch": batch if batch is not None else previous.get("batch"),
            "release_failed": dict(previous.get("release_failed") or {}, **release_failed)}
    for part in ("first", "then"):
        joining = [host for host, group in groups.items() if group == "gpuharden_rollout_" + part and host not in release_failed]
        plan[part] = list(previous.get(part) or []) + joining
    plan["hosts"] = plan["first"] + plan["then"]
    plan["serial"] = [1, plan["batch"] or 1]
    return plan


def draining_steps(deferred, planned):
    """Which draining steps run on the node in the rollout: those whose plan drains it (``planned``: each stage's plan
    hand-over, as Ansible's bool filter reads it; None where that plan did not run in this run), none where the budget
    deferred it."""
    return {stage: not deferred and bool(planned.get(stage)) for stage in DRAINING_PLANS}


def lock_still_held(node_plan, postcheck_read):
    """Whether the end of the run still has the node's run lock to give back: not where the plan's audit (a compliant
    node) or the post-check's node_audit read already gave it back (their lock.held false)."""
    def held(result):
        lock = result.get("lock") if hasattr(result, "get") else None
        return bool(lock.get("held", True)) if hasattr(lock, "get") else True

    return held(node_plan) and held(postcheck_read)


def no_target_message(target_hosts, limit=None):
    """The failure of a run whose first play matched no host (ansible-playbook alone exits 0 after "skipping: no hosts
    matched", which would look like a hardened fleet)."""
    within = " within --limit '%s'" % limit if limit is not None else ""
    return ("No GPU node to harden: the hosts pattern '%s' (gpuharden_target_hosts, default gpu_nodes) matched no host of "
            "the inventory%s. Put the GPU nodes in that group, or set gpuharden_target_hosts to their group or pattern."
            % (target_hosts, within))
