# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.node_plan_pods: the plan's one LIST of the batch's GPU pods (harden_gpu_nodes.yml
and drift_check.yml, through playbooks/tasks/node_plan_inputs.yml), run once for the batch on the controller.

It builds gpu_pods_info's options from the roles' variables (module_utils/core/_stage_plan.py gpu_pods_args: the
cgroup_limits stage's cluster identity and resource prefixes, the dry runs of the RuntimeClass and device plugin
stages where their roles use the same identity and Python) and runs the module outside check mode (it only reads: a
check run plans what a real run would).  A LIST that fails does not fail the task: the audit then leaves the memory
check out, and harden's cgroup_limits stage lists again and fails there.  Where the caller made the reading already
(gpuharden_gpu_pods_given: gpuharden explain) it is returned as it is; where cgroup_limits_immediate is false, no LIST.

The reading is handed over to every host of the batch (plugins/plugin_utils/_handover.py, as LISTED: a run_once task's
facts reach each), where node_stages, stage_steps, harden_rollout, cluster_stage_gate and drift_play take it: no
registered variable.  Where the importing task's __node_plan leaves nodes or pods_snapshot out, drift_play step=start's
hand-over (drift_check.yml) gives them.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _drift_play
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._settings import playbook_default
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import read_outside_check_mode

ARGUMENT_SPEC = {
    # each left out: the importing task's __node_plan (playbooks/tasks/node_stages.yml) has it, else false (nodes: the
    # Nodes of the serial batch's hosts, each gpuharden_k8s_node_name else the inventory name, as node_stages names them)
    "nodes": {"type": "list", "elements": "str"},
    "pods_snapshot": {"type": "bool"},
    # harden's: dry-run the cluster-side stages in the LIST, where the play skips compliant stages
    "dry_runs": {"type": "bool"},
}
PLAN_INPUT = "__node_plan"
# The hand-over of the reading (plugins/plugin_utils/_handover.py): gpu_pods_info's result without Ansible's bookkeeping;
# read by node_stages (the memory check's pods, the GPU Operator's reading, the device plugin dry run), stage_steps
# (the cgroup_limits stage's LIST), harden_rollout step=restarts and cluster_stage_gate (the dry runs), drift_play
# step=cluster (the pods snapshot).  None where no reading was made (cgroup_limits_immediate false, the task left out).
LISTED = "__node_plan_pods"
BOOKKEEPING = ("invocation", "ansible_facts", "_ansible_no_log", "_ansible_verbose_always", "_ansible_parsed")
GIVEN = "gpuharden_gpu_pods_given"
BOOLEANS = ("device_plugin_label_nodes",)


class ActionModule(ActionBase):
    _supports_check_mode = True
    TRANSFERS_FILES = False

    def _variable(self, task_vars, name, default=None):
        return self._templar.template(task_vars[name]) if name in task_vars else default

    def _batch_nodes(self, task_vars):
        """The Node of each host of the serial batch: its gpuharden_k8s_node_name, else its inventory name."""
        hostvars = task_vars.get("hostvars") or {}
        nodes = []
        for host in task_vars.get("ansible_play_batch") or ():
            variables = hostvars.get(host) or {}
            name = self._templar.template(variables["gpuharden_k8s_node_name"]) if "gpuharden_k8s_node_name" in variables else None
            nodes.append(name or host)
        if not nodes:
            raise AnsibleActionFail("node_plan_pods: nodes is not given (the option, or __node_plan.nodes of the importing task) "
                                    "and the play's batch has no host")
        return nodes

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        given = self._variable(task_vars, PLAN_INPUT, {})
        given = given if isinstance(given, dict) else {}
        # what __node_plan leaves out: drift_check.yml's start step decided the nodes and the snapshot (harden's has none)
        started = _handover.taken_over(task_vars, _drift_play.START_HANDOVER) if PLAN_INPUT in task_vars else None
        started = started if hasattr(started, "get") else {}
        for name in ARGUMENT_SPEC:
            if args[name] is None:
                args[name] = given[name] if given.get(name) is not None else started.get(name)
        if args["nodes"] is None:
            args["nodes"] = self._batch_nodes(task_vars)
        args["nodes"] = [str(node) for node in args["nodes"]]
        for name in ("pods_snapshot", "dry_runs"):
            args[name] = boolean(args[name] or False, strict=False)
        if GIVEN in task_vars:
            # gpuharden explain made the same reading in its own Python (the module's gather()): no module run for it
            return self._hand_over(dict(result, **dict(self._variable(task_vars, GIVEN), changed=False)))
        if not boolean(self._variable(task_vars, "cgroup_limits_immediate", True), strict=False):
            return dict(result, changed=False, skipped=True, skip_reason="cgroup_limits_immediate is false: no LIST of the GPU pods")
        settings = {name: self._variable(task_vars, name) for name in _stage_plan.LIST_SETTINGS}
        for name in BOOLEANS:
            settings[name] = boolean(settings[name], strict=False)
        skip_compliant = boolean(self._variable(task_vars, "gpuharden_skip_compliant_stages", playbook_default("gpuharden_skip_compliant_stages")),
                                 strict=False)
        module_args = _stage_plan.gpu_pods_args(settings, args["nodes"], pods_snapshot=args["pods_snapshot"],
                                                dry_runs=args["dry_runs"] and skip_compliant)
        # on the cgroup_limits stage's controller Python, the identity the LIST shares with it (never the node Python)
        python = self._variable(task_vars, "cgroup_limits_controller_python")
        listed = read_outside_check_mode(self, "gpuharden.k8s.gpu_pods_info", module_args, on_controller(self._task, task_vars, python))
        # a failed LIST is the plan's reading too (its msg names why), not the task's failure
        return self._hand_over(dict(result, **dict(listed, failed=False, changed=False)))

    @staticmethod
    def _hand_over(result):
        """The result, with the reading handed over as LISTED to every host of the batch (a run_once task's facts)."""
        reading = {key: value for key, value in result.items() if key not in BOOKKEEPING}
        return dict(result, ansible_facts=_handover.handed_over(LISTED, reading))
