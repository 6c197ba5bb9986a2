# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.harden_rollout: harden's rollout across the first play's hosts, decided once
for the batch (run_once, delegated to the controller) from every host's plan and the run's variables
(module_utils/core/_stage_plan.py decides; plugins/modules/harden_rollout.py documents it).

The steps, in the plays' order:

- ``restarts``, before the stages: one read of the fleet (gpuharden.k8s.disruption_budget): the containerd restarts'
  canary and waves, the restarts the budget does not allow at all, and the cordons an ended run left.  Skipped (no
  API call) where the run's --tags select no node stage; in check mode the read still runs, but nothing restarts in
  waves and no node is failed for its restart.  With it, whether the RuntimeClass stage runs for the batch
  (``runtime_class``, ``runtime_class_why``: cluster_stage_gate.runtime_class_gate over the batch's hosts but those
  failed for their restart): one task before the stages, not two.  Handed over to every host of the batch
  (plugins/plugin_utils/_handover.py, _harden_run.RESTARTS): tasks/stages.yml's stage_steps, harden_node step=verdict
  of=restarts and step rollout take it there.
- ``cordons``, after the stages: which of those cordons this run releases, and which stay, with why.
- ``rollout``: where a host of the batch has a step that drains its node, the budget read again (the nodes the
  stages just restarted settle first); each host's group of the second play; that play's hosts and serial, the fleet
  and the failed releases (the host's own harden_node step=verdict of=cordons fails it) as a fact of the host it is
  delegated to (``delegate_facts``: the second play's ``hosts`` and ``serial`` read it there, a play keyword sees no
  play host's variables), added up over the first play's batches (_harden_run.rollout_plan_fact).
- ``stopped`` (second play, each batch): the nodes whose draining step failed, and the fleet, as the role
  node_maintenance's node_maintenance_stopped_by and node_maintenance_fleet (facts of the batch's hosts).

The modules it runs on the controller take the controller's ansible-playbook Python (on_controller), never the play's
node Python: its tasks need no ansible_python_interpreter of their own.

The hosts' variables read: the plan (gpuharden_node_plan, and the plan's LIST, node_plan_pods' hand-over, for the
RuntimeClass gate), the Node name (harden_node step=start's fact), whether the kubelet and MIG plans ran and drain
(their hand-overs of this run, _harden_run.DRAINING_PLANS: handed over where the plan ran), what the stages
restarted (container_runtime_result, __kubelet_topology_config), and the draining steps that failed (harden_node
step=failed's hand-over).
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.action.cluster_stage_gate import gate_variables, runtime_class_gate
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _harden_run, _stage_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import playbook_default
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import read_outside_check_mode, readable

ARGUMENT_SPEC = {
    "step": {"type": "str", "required": True, "choices": ["restarts", "wave", "rollout", "stopped", "postcheck"]},
    # one of the restarts step's restart_steps ({index, nodes, settle, before}), or None (every node at once), for the
    # wave step
    "wave": {"type": "dict"},
    # the fleet read's left_cordoned, for the rollout step: released or kept first (None: the restarts step's hand-over)
    "left_cordoned": {"type": "list", "elements": "dict"},
    # each None: the play's variable below
    "kubeconfig": {"type": "str"},
    "max_unavailable": {"type": "str"},
    "settle_seconds": {"type": "int"},
}
# option: (the play's variable it defaults to, that variable's default)
PLAY_DEFAULTS = {
    "kubeconfig": ("gpuharden_kubeconfig", ""),
    "max_unavailable": ("gpuharden_max_unavailable", "1"),
    "settle_seconds": ("gpuharden_restart_settle_seconds", 60),
}
NODE = _harden_run.NODE
# the run's lock owner on this host (harden_gpu_nodes.yml's first play)
OWNER = _harden_run.OWNER
# the second play's hand-over of a host whose disruptive step failed
FAILED = _harden_run.FAILED
# what the RuntimeClass gate reads of each host of the batch (cluster_stage_gate.runtime_class_gate): its plan, and the
# plan's LIST that node_plan_pods handed over (taken over as cluster_stage_gate.gate_variables does)
GATE_READS = ("gpuharden_node_plan",)
# tasks/stages.yml's step stages (gpuharden.k8s.stage_steps), registered on each host: its node_name is the host's Node
# in the containerd waves (a registered result is in hostvars, a variable of an include is not)
WAVE_STEPS = "__stages_run"
# the draining stages and the name their plan hands over under (handed over where it ran: true where the step drains the node)
DRAINING_PLANS = _harden_run.DRAINING_PLANS
# the registered results whose "restarted" says the stage restarted containerd or the kubelet
RESTARTS = ("container_runtime_result", "__kubelet_topology_config")
# the registered results of the stages that change what a node advertises (the device plugin, the kubelet write, the MIG
# apply and re-apply): the post-check lets such a node's advertised resources settle
ADVERTISED_CHANGES = ("device_plugin_result", "__kubelet_topology_config", "__mig_apply", "__mig_reapply")
# the tags that select a node-side stage: a run without any needs no fleet read before the stages
NODE_STAGE_TAGS = frozenset(tag for stage in _stage_plan.STAGES if stage.side == "node" for tag in stage.tags) | {"all"}


def wave_node(variables):
    """One host's Node in the containerd waves (None before tasks/stages.yml's first step ran on it)."""
    return (variables.get(WAVE_STEPS) or {}).get("node_name")


def host_view(host, variables):
    """What the rollout reads of one host: its Node, its plan's runs, whether it drains, the draining stages it needs
    but did not plan (--tags), whether the stages restarted containerd or the kubelet."""
    runs = ((variables.get("gpuharden_node_plan") or {}).get("plan") or {}).get("runs")
    # each draining plan's hand-over of this run: None where that plan did not run in this run
    handed = {stage: _handover.taken_over(variables, name) for stage, name in DRAINING_PLANS.items()}
    planned = [stage for stage, value in handed.items() if value is not None]
    return {
        "host": host,
        "node": _harden_run.fact(variables, NODE) or host,
        "runs": runs,
        "disruptive": any(boolean(value, strict=False) for value in handed.values() if value is not None),
        "unplanned": _stage_plan.unplanned_draining_steps(runs or {}, planned),
        "restarted": any(boolean((variables.get(name) or {}).get("restarted"), strict=False) for name in RESTARTS),
    }


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False

    def _budget(self, module_args, task_vars):
        """disruption_budget on the controller, outside check mode too (it only reads: the run's plan needs it)."""
        budget = read_outside_check_mode(self, "gpuharden.k8s.disruption_budget", module_args, on_controller(self._task, task_vars))
        if budget.get("failed"):
            raise AnsibleActionFail("harden_rollout: the disruption budget could not be read: %s" % budget.get("msg", "failed"), result=budget)
        return budget

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        for option, (variable, default) in PLAY_DEFAULTS.items():
            if args[option] is None:
                args[option] = self._templar.template(task_vars[variable]) if variable in task_vars else default
        args["settle_seconds"] = int(args["settle_seconds"])
        if args["step"] == "postcheck":
            # this host's alone: no other host's variables read
            return dict(result, changed=False, **self._postcheck(task_vars))
        if args["step"] == "wave" and not (args["wave"] or {}).get("index"):
            # the first wave, or every node at once (bootstrap, check mode): nothing to wait for, no host's variables read
            return dict(result, changed=False, not_started={}, skipped_reason="the first wave, or every node at once: nothing to wait for")
        hostvars = task_vars.get("hostvars") or {}
        hosts = [host_view(host, hostvars[host]) for host in task_vars.get("ansible_play_hosts", [])]
        fleet = [host_view(host, hostvars[host])["node"] for host in task_vars.get("ansible_play_hosts_all", [])]
        common = {"max_unavailable": str(args["max_unavailable"]), "fleet": fleet}
        if args["kubeconfig"]:
            common["kubeconfig"] = args["kubeconfig"]
        check_mode = bool(self._task.check_mode)
        result["changed"] = False
        if args["step"] == "restarts":
            result.update(self._restarts(hosts, common, task_vars, check_mode))
            result.update(self._runtime_class(task_vars, result["restart_not_allowed"]))
            # to every host of the batch (run_once's facts): what the stages, the verdict and step rollout read of it
            result["ansible_facts"] = _handover.handed_over(_harden_run.RESTARTS, {key: result[key] for key in (
                "restart_steps", "restart_not_allowed", "runtime_class", "left_cordoned")})
        elif args["step"] == "stopped":
            # the second play: the Nodes of the hosts whose disruptive step failed (its rescue's record) stop the rollout
            all_hosts = task_vars.get("ansible_play_hosts_all", [])
            this_run = _handover.this_run()
            result["stopped_by"] = [_harden_run.fact(hostvars[host], NODE) or host for host in all_hosts
                                    if _handover.taken_over(hostvars[host], FAILED, run=this_run)]
            # for the role node_maintenance's budget, as facts of the batch's hosts over its defaults: the nodes above,
            # and the fleet the first play's rollout step read
            fleet = (_harden_run.fact(hostvars.get("localhost") or {}, _harden_run.ROLLOUT) or {}).get("fleet") or []
            result["ansible_facts"] = {"node_maintenance_stopped_by": result["stopped_by"], "node_maintenance_fleet": fleet}
        elif args["step"] == "wave":
            result.update(self._wave(args["wave"], args["settle_seconds"], common, task_vars))
        else:
            released = self._release(hosts, args, task_vars)
            result.update(released, changed=any(done["changed"] for done in released["release_results"].values()))
            result.update(self._rollout(hosts, fleet, common, args, task_vars, released["release_failed"]))
        return result

    def _restarts(self, hosts, common, task_vars, check_mode):
        # check mode restarts nothing: every node's stage at once, as its check says ([None]: one step, every node)
        empty = {"restart_steps": [None], "restart_not_allowed": {}, "left_cordoned": [], "budget": None}
        if not NODE_STAGE_TAGS & set(task_vars.get("ansible_run_tags") or ("all",)):
            return dict(empty, skipped_reason="the run's --tags select no node stage: nothing to restart, drain or release")
        budget = self._budget(dict(common, restarts=_stage_plan.restart_nodes(hosts), settle_seconds=0), task_vars)
        deferred = budget.get("restart_deferred") or {}
        # disruption_budget's reading as it returned it (restart_waves, unavailable, ...), with the decisions
        return dict(readable(budget), budget=budget, left_cordoned=budget.get("left_cordoned") or [],
                    restart_steps=empty["restart_steps"] if check_mode else budget.get("restart_steps", [None]),
                    restart_not_allowed={} if check_mode else {host["host"]: "containerd not changed: %s" % deferred[host["node"]]
                                                               for host in hosts if host["node"] in deferred})

    @staticmethod
    def _runtime_class(task_vars, restart_not_allowed):
        """Whether the RuntimeClass stage runs, once for the batch (cluster_stage_gate.runtime_class_gate): its hosts
        but those harden_node step=verdict of=restarts fails right after this task, as when the gate was a task of
        its own after that verdict (a failed host is out of the batch)."""
        hostvars = task_vars.get("hostvars") or {}
        batch = [hostvars[host] for host in task_vars.get("ansible_play_batch", []) if host not in restart_not_allowed]
        run, why = runtime_class_gate(gate_variables(batch, GATE_READS))
        return {"runtime_class": run, "runtime_class_why": why}

    def _postcheck(self, task_vars):
        """This host's post-check inputs (_stage_plan.postcheck_inputs), as facts of the host: the post-check role
        imported after this task reads them over its defaults."""
        def variable(name, default=None):
            return self._templar.template(task_vars[name]) if name in task_vars else default

        inputs = _stage_plan.postcheck_inputs(
            check_mode=bool(self._task.check_mode), node_plan=variable("gpuharden_node_plan"), owner=variable(OWNER),
            lock_path=variable("gpuharden_lock_path", playbook_default("gpuharden_lock_path")),
            settle_seconds=variable("gpuharden_postcheck_settle_seconds", playbook_default("gpuharden_postcheck_settle_seconds")),
            changed_results=[variable(name) for name in ADVERTISED_CHANGES], kubelet_config=variable("__kubelet_topology_config"))
        return {"ansible_facts": inputs}

    def _wave(self, wave, settle_seconds, common, task_vars):
        """Before a wave of containerd restarts but the first: has the previous one come back, and did no node fail (a
        host gone from the play whose Node restarted before)? Where not, the hosts not Ready and this wave's fail."""
        hostvars = task_vars.get("hostvars") or {}
        gone = [host for host in task_vars.get("ansible_play_hosts_all", []) if host not in task_vars.get("ansible_play_hosts", [])]
        stopped_by = [node for node in (wave_node(hostvars[host]) for host in gone) if node in (wave.get("before") or ())]
        # the budget's arithmetic is not asked here: no fleet
        wave_args = {key: value for key, value in common.items() if key != "fleet"}
        budget = self._budget(dict(wave_args, settle_nodes=wave.get("settle") or [], settle_seconds=settle_seconds, settle_required=True,
                                   stopped_by=stopped_by), task_vars)
        not_started = {}
        if budget.get("stopped") is not None:
            not_ready = (budget.get("settle") or {}).get("not_ready") or {}
            for host in task_vars.get("ansible_play_hosts", []):
                node = wave_node(hostvars[host])
                if node in not_ready:
                    not_started[host] = ("containerd was restarted, and the node is not Ready %s s later: %s"
                                         % (settle_seconds, ", ".join(not_ready[node])))
                elif node in (wave.get("nodes") or ()):
                    not_started[host] = "containerd not restarted, the restarts stopped: %s" % budget["stopped"]
        return dict(readable(budget), not_started=not_started, budget=budget)

    def _release(self, hosts, args, task_vars):
        """The cordons an ended gpuharden run left (the restarts step's left_cordoned): released where this run has
        nothing to drain the node for (node_maintenance state=released, once the node is Ready, one run per lock owner
        of this run's hosts), kept with why where a draining step this run did not plan could still be pending (a
        warning). Before the budget is read: a released node is available again. A release that fails fails its hosts
        (release_failed), as the host's own task did."""
        left_cordoned = args["left_cordoned"]
        if left_cordoned is None:
            left_cordoned = (_handover.taken_over(task_vars, _harden_run.RESTARTS) or {}).get("left_cordoned") or []
        decided = _stage_plan.cordon_plan(hosts, left_cordoned)
        for host, why in sorted(decided["kept"].items()):
            self._display.warning("%s: %s" % (host, why))
        hostvars = task_vars.get("hostvars") or {}
        nodes = {host["host"]: host["node"] for host in hosts}
        by_owner = {}
        for host in decided["release"]:
            by_owner.setdefault(_harden_run.fact(hostvars[host], OWNER) or "", []).append(host)
        results, failed = {}, {}
        for owner, owner_hosts in sorted(by_owner.items()):
            module_args = {"nodes": [nodes[host] for host in owner_hosts], "state": "released", "owner": owner,
                           "ready_timeout": args["settle_seconds"]}
            if args["kubeconfig"]:
                module_args["kubeconfig"] = args["kubeconfig"]
            done = self._execute_module(module_name="gpuharden.k8s.node_maintenance", module_args=module_args,
                                        task_vars=on_controller(self._task, task_vars))
            for host in owner_hosts:
                if done.get("failed"):
                    failed[host] = "releasing the cordon an ended run left failed: %s" % done.get("msg", "failed")
                results[host] = dict(readable(done), changed=bool(done.get("changed")))
        # released: the Nodes uncordoned, as node_maintenance names them
        released = sorted({node for done in results.values() for node in done.get("released") or ()})
        return {"release": decided["release"], "kept": decided["kept"], "released": released, "release_results": results,
                "release_failed": failed}

    def _rollout(self, hosts, fleet, common, args, task_vars, released):
        budget = None
        if any(host["disruptive"] for host in hosts):
            budget = self._budget(dict(common, settle_nodes=_stage_plan.settle_nodes(hosts), settle_seconds=args["settle_seconds"]), task_vars)
        plan = _stage_plan.rollout_plan(hosts, budget)
        result = dict(plan, budget=budget)
        # on the host this task is delegated to (delegate_facts): the second play's hosts and serial (a play keyword
        # sees no play host's variables), its budget's fleet, and the failed releases, which each host's own task
        # (harden_node step=verdict of=cordons) reads right after
        previous = _harden_run.fact((task_vars.get("hostvars") or {}).get("localhost") or {}, _harden_run.ROLLOUT)
        run = _harden_run.run_identity(_harden_run.fact(task_vars, _harden_run.CONTROLLER))
        result["ansible_facts"] = {_harden_run.ROLLOUT: _harden_run.rollout_plan_fact(previous, run, plan["groups"], plan["batch"], fleet, released)}
        return result
