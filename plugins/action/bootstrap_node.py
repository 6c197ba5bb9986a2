# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action gpuharden.k8s.bootstrap_node: the steps of playbooks/bootstrap_gpu_node.yml that decide something, each one
task (issue 45: the decisions left the playbook's Jinja for module_utils/cluster/_bootstrap_plan.py).

- ``settings`` (no contact with the node): the play's settings from the host's variables, checked, with the run's lock
  owner and the device plugin's tolerations.
- ``connect``: wait for SSH on a new node (ansible.builtin.wait_for_connection's own action), with the host's own Python.
- ``python`` (on the node): the Python facts of the node's module Python, whether pynvml.py is shipped to it and where,
  the copy (ansible.builtin.copy's own action, which transfers the file) and the check that the Python imports it then.
- ``facts`` (on the node): gpu_facts, then the refusal of a host that shows no GPU.
- ``plan`` (the node, once locked): the stage engine (gpuharden.k8s.node_stages) plans every stage of the new node and
  runs the stages it owns; its result is this task's, and its plan is handed over to tasks/stages.yml's first step
  (stage_steps.PLAN).
- ``lock`` / ``unlock`` (on the node): take and give back the node's run lock (node_lock) as the settings name it.
- ``admit`` (delegated to the controller, for each node that reached it: it follows the post-check): label the node,
  remove its bootstrap taint and uncordon it; the run's stats ``gpuharden_bootstrap_ready``.
- ``keep_out`` (delegated to the controller, in the rescue): keep the failed node tainted and cordoned, and report it
  (stats ``gpuharden_bootstrap_failed``; Ansible records stats only from a successful result, so it does not fail).
- ``fail`` (in the rescue, after keep_out): fail the node with the message its report makes.
- ``targeted`` (the first task, once, delegated to the controller with delegate_facts): hands TARGETED over to
  localhost, this run's record that the first play had nodes to bootstrap.
- ``no_target`` (the last play, once): fail a run whose first play matched no host (no TARGETED of this run on
  localhost: one a fact cache kept from an earlier run does not count).

The delegated steps run their modules with the controller's Python (ansible_playbook_python): the play's interpreter
is the node tasks' (vars/node_python.yml), a path that need not exist on the controller.
"""

from __future__ import annotations

import json
import random
import shlex
import subprocess
from datetime import UTC, datetime

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.action import stage_steps
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _bootstrap_plan as plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._controller_python import on_controller

STEPS = ["targeted", "settings", "connect", "python", "facts", "lock", "plan", "admit", "keep_out", "fail", "unlock", "no_target"]
ARGUMENT_SPEC = {"step": {"type": "str", "required": True, "choices": STEPS}}
# Handed over to localhost by step targeted (plugin_utils/_handover.py), taken over by step no_target; the settings
# step's result is registered under SETTINGS.
TARGETED = "__bootstrap_targeted"
SETTINGS = "__bootstrap"
# The stage engine's arguments for a new node: every stage planned (skip_compliant false: MIG only where a layout is
# asked for, the one its audit's MIG check takes, with the role's options: audit_from_play); the GPU refusal is step
# facts' (allow_non_gpu_nodes: the engine refuses nothing again); the node's name is the engine's default, as the
# settings step's.
ENGINE_ARGS = {"skip_compliant": False, "allow_non_gpu_nodes": True, "audit_from_play": ["mig"]}
# vars/node_python.yml's name for the host's own Python (the node's, before the venv exists)
HOST_PYTHON = "__gpuharden_host_python"
PROBE = ("import json, sys, sysconfig\n"
         "try:\n    import pynvml\n    found = pynvml.__file__\nexcept ImportError:\n    found = None\n"
         "print(json.dumps({'pynvml': found, 'purelib': sysconfig.get_paths()['purelib']}))\n")


class ActionModule(ActionBase):
    """Thin shell: read this host's variables, let the planner decide, run the modules it asks for."""

    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        self._variables = task_vars
        try:
            result.update(getattr(self, "_step_" + args["step"])())
        except GpuhardenError as error:
            raise AnsibleActionFail(error.msg) from None
        return result

    def _value(self, name, default=None):
        if name not in self._variables:
            return default
        return self._templar.copy_with_new_env(available_variables=self._variables).template(self._variables[name])

    def _settings(self):
        registered = self._value(SETTINGS)
        if not isinstance(registered, dict) or "settings" not in registered:
            raise GpuhardenError("bootstrap_node: step settings has not run for this host (register it as %s)" % SETTINGS)
        return registered["settings"]

    def _module(self, name, module_args, task_vars=None):
        return self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars or self._task_vars_for_modules())

    def _task_vars_for_modules(self):
        """The task's variables, with the controller's Python as the interpreter where the task is delegated."""
        return on_controller(self._task, self._variables) if self._task.delegate_to else self._variables

    def _host_python_vars(self):
        """The task's variables with the host's own Python as the interpreter (vars/node_python.yml's, where the play
        loads it): the venv the play's node tasks use may not exist yet."""
        if HOST_PYTHON not in self._variables:
            return self._variables
        return dict(self._variables, ansible_python_interpreter=self._value(HOST_PYTHON))

    def _action(self, name, module_args, task_vars):
        """Another action plugin's result (wait_for_connection, copy), run as a copy of this task with ``module_args``."""
        task = self._task.copy()
        task.args = dict(module_args)
        loader = self._shared_loader_obj.action_loader
        action = loader.get(name, task=task, connection=self._connection, play_context=self._play_context, loader=self._loader,
                            templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        return action.run(task_vars=task_vars)

    def _api_args(self, settings, **module_args):
        return dict(module_args, kubeconfig=settings["kubeconfig"]) if settings["kubeconfig"] else module_args

    # the steps -------------------------------------------------------------------------------------------------------

    def _step_targeted(self):
        return {"changed": False, "ansible_facts": _handover.handed_over(TARGETED, True)}

    def _step_settings(self):
        host = self._variables["inventory_hostname"]
        values = {name: self._value(name) for name in plan.READ if name in self._variables}
        settings = plan.settings(values, host, check_mode=bool(self._task.check_mode))
        owner = plan.run_owner(values.get("gpuharden_run_owner"), datetime.now(UTC).strftime("%Y%m%dT%H%M%S"),
                               random.SystemRandom().randrange(1000000000))
        tolerations = plan.device_plugin_tolerations(values.get("gpuharden_device_plugin_tolerations"), settings["taint_key"],
                                                     settings["taint_effect"])
        return {"changed": False, "settings": dict(settings, owner=owner), "device_plugin_tolerations": tolerations}

    def _step_connect(self):
        settings = self._settings()
        return self._action("ansible.legacy.wait_for_connection", {"timeout": settings["connect_timeout"], "delay": settings["connect_delay"]},
                            self._host_python_vars())

    def _step_python(self):
        settings = self._settings()
        facts = self._module("ansible.legacy.setup", {"gather_subset": ["!all", "!min", "python"]})
        if facts.get("failed"):
            return facts
        gathered = facts.get("ansible_facts") or {}
        python = (gathered.get("ansible_python") or gathered.get("python") or {}).get("executable")
        if not python:
            raise GpuhardenError("the node's Python facts name no executable (ansible.builtin.setup, gather_subset python)")
        probe = None
        if settings["ship_pynvml"]:
            # read only, so it runs in check mode too (as the command task with check_mode: false did)
            answer = self._low_level_execute_command(shlex.join([python, "-c", PROBE]))
            if answer["rc"] != 0:
                raise GpuhardenError("the node's Python %s could not say whether it imports pynvml: %s"
                                     % (python, (answer.get("stderr") or answer.get("stdout") or "").strip()))
            probe = json.loads(answer["stdout"].strip().splitlines()[-1])
        controller_file = None
        if settings["ship_pynvml"] and not probe.get("pynvml") and not settings["pynvml_source"]:
            controller_file = self._controller_pynvml()
        pynvml = plan.pynvml_plan(settings["ship_pynvml"], probe, settings["pynvml_source"], controller_file, settings["pynvml_dest"])
        pynvml["check_import"] = pynvml["ship"] and not self._task.check_mode
        outcome = {"changed": False, "ansible_facts": gathered, "python": python, "pynvml": pynvml}
        if not pynvml["ship"]:
            return outcome
        copied = self._action("ansible.legacy.copy", dict(plan.PYNVML_COPY, src=pynvml["src"], dest=pynvml["dest"]), self._variables)
        outcome.update(changed=bool(copied.get("changed")), copied=copied)
        if copied.get("failed"):
            return dict(outcome, failed=True, msg="copying pynvml.py to %s failed: %s" % (pynvml["dest"], copied.get("msg")))
        if pynvml["check_import"]:
            imported = self._module("ansible.legacy.command", {"argv": [python, "-c", "import pynvml"]})
            if imported.get("failed") or imported.get("rc"):
                raise GpuhardenError("the node's Python %s does not import the pynvml.py copied to %s: %s"
                                     % (python, pynvml["dest"], (imported.get("stderr") or imported.get("msg") or "").strip()))
        return outcome

    def _controller_pynvml(self):
        """The pynvml.py the controller's Python (the one that runs ansible-playbook) imports, or None."""
        answer = subprocess.run([self._variables.get("ansible_playbook_python") or "python3", "-c", "import pynvml; print(pynvml.__file__)"],
                                capture_output=True, text=True, check=False)
        return answer.stdout.strip().splitlines()[-1] if answer.returncode == 0 and answer.stdout.strip() else None

    def _step_facts(self):
        settings = self._settings()
        facts = self._module("gpuharden.k8s.gpu_facts", {})
        if facts.get("failed"):
            return facts
        refusal = plan.gpu_node_refusal(self._variables["inventory_hostname"], facts.get("ansible_facts", {}).get("gpuharden"),
                                        settings["allow_non_gpu_nodes"])
        if refusal:
            raise GpuhardenError(refusal)
        return facts

    def _step_lock(self):
        return self._module("gpuharden.k8s.node_lock", plan.lock_args(self._settings(), release=False))

    def _step_plan(self):
        engine = self._action("gpuharden.k8s.node_stages", ENGINE_ARGS, self._variables)
        if engine.get("failed") or not isinstance(engine.get("plan"), dict):
            return engine
        # what tasks/stages.yml reads of it: the node stages' runs (and the audit's kubelet plan)
        handed = _handover.handed_over(stage_steps.PLAN, {"plan": {"runs": engine["plan"].get("runs")}, "kubelet_plan": engine.get("kubelet_plan")})
        return dict(engine, ansible_facts=dict(engine.get("ansible_facts") or {}, **handed))

    def _step_unlock(self):
        return self._module("gpuharden.k8s.node_lock", plan.lock_args(self._settings(), release=True))

    def _step_admit(self):
        settings = self._settings()
        steps = plan.admit_args(settings)
        labelled = self._module("gpuharden.k8s.gpu_node_labels", self._api_args(settings, **steps["labels"]))
        if labelled.get("failed"):
            return dict(labelled, labelled=labelled)
        uncordoned = None
        if steps["uncordon"]:
            uncordoned = self._module("gpuharden.k8s.node_maintenance", self._api_args(settings, **steps["uncordon"]))
            if uncordoned.get("failed"):
                return dict(uncordoned, labelled=labelled, uncordoned=uncordoned)
        changed = bool(labelled.get("changed") or (uncordoned or {}).get("changed"))
        host = self._variables["inventory_hostname"]
        return {"changed": changed, "nodes": steps["labels"]["nodes"], "labelled": labelled, "uncordoned": uncordoned,
                "ansible_stats": {"data": {plan.READY_STAT: {host: settings["node_name"]}}, "per_host": False, "aggregate": True}}

    def _step_keep_out(self):
        settings = self._settings()
        node = settings["node_name"]
        tainted = self._module("gpuharden.k8s.gpu_node_labels", self._api_args(
            settings, nodes=[node], labels={}, taint="present", taint_key=settings["taint_key"], taint_value="failed",
            taint_effect=settings["taint_effect"]))
        cordoned = self._module("gpuharden.k8s.node_maintenance", self._api_args(settings, nodes=[node], state="cordoned"))
        # read as they are, not templated: the failed task's serialized fields hold its own templates (its vars, its
        # arguments), which may read variables undefined here (measured in the lab: the device plugin stage's task)
        report = plan.failure_report(node, self._variables.get("ansible_failed_task"), self._variables.get("ansible_failed_result"),
                                     self._variables.get("postcheck_findings"), tainted, cordoned)
        host = self._variables["inventory_hostname"]
        return {"changed": bool(tainted.get("changed") or cordoned.get("changed")), "kept_tainted": tainted, "kept_cordoned": cordoned,
                "report": report, "failure": plan.failure_message(report, settings["taint_key"]),
                "ansible_stats": {"data": {plan.FAILED_STAT: {host: report}}, "per_host": False, "aggregate": True}}

    def _step_fail(self):
        settings = self._settings()
        # the report's message again, from the same facts of the rescue (keep_out could not fail and keep its stats)
        report = plan.failure_report(settings["node_name"], self._variables.get("ansible_failed_task"),
                                     self._variables.get("ansible_failed_result"), None, None, None)
        raise GpuhardenError(plan.failure_message(report, settings["taint_key"]))

    def _step_no_target(self):
        localhost = (self._variables.get("hostvars") or {}).get("localhost") or {}
        if _handover.taken_over(localhost, TARGETED):
            return {"changed": False, "why": "the first play had nodes to bootstrap"}
        raise GpuhardenError(plan.no_target_message(self._value("gpuharden_target_hosts", "gpu_nodes"), self._value("ansible_limit")))
