# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The shell of the collection's stage actions (kubelet_topology_plan, cgroup_limits_immediate, mig_plan): validate the
task's arguments as a module would, refuse to run a read-only action outside check mode, hand the validated arguments
to the action's pure ``decide``, run node modules through ``_execute_module`` (check mode and diff as the task's), and
turn the one domain exception into the task's failure.  Controller side only."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail, AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError


class StageAction(ActionBase):
    """Subclasses set NAME, ARGUMENT_SPEC and READ_ONLY, and implement ``decide_task(args, task_vars)``."""

    NAME = ""
    ARGUMENT_SPEC: dict = {}
    READ_ONLY = False
    _requires_connection = True
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        super().run(tmp, task_vars)
        validation = ArgumentSpecValidator(self.ARGUMENT_SPEC).validate(self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("%s: %s" % (self.NAME, "; ".join(validation.error_messages)))
        if self.READ_ONLY and not self._task.check_mode:
            raise AnsibleActionFail("%s reads only: run it with check_mode: true (the modules it runs run in check mode)" % self.NAME)
        try:
            return self.decide_task(validation.validated_parameters, task_vars)
        except GpuhardenError as error:
            # the partial result the error carries (e.g. changed: a step that changed the node before it failed) stays the task's
            raise AnsibleActionFail("%s (fix: %s)" % (error.msg, error.result["fix"]) if "fix" in error.result else error.msg,
                                    result=dict(error.result)) from None

    def decide_task(self, args, task_vars):
        raise NotImplementedError

    def role_variable(self, expression, default=None):
        """A role's variable as the role's tasks see it (templated), or ``default`` where it is undefined or null."""
        try:
            value = self._templar.resolve_variable_expression(expression)
        except AnsibleUndefinedVariable:
            return default
        return default if value is None else value

    def with_role_variables(self, args, variables):
        """The task's arguments, each one left out (None) read from the role's variable ``variables[name]``, a pair
        (expression, default): a role's tasks then call the action without spelling out what it reads."""
        return dict(args, **{name: self.role_variable(*variables[name]) for name in variables if args[name] is None})

    def variable(self, name, task_vars=None, **extra):
        """One of the role's or play's variables, templated as a task of the role templates it (undefined fails the
        task, naming it); with ``extra``, templated with those variables added to ``task_vars``."""
        if not extra:
            return self._templar.resolve_variable_expression(name)
        return self._templar.copy_with_new_env(available_variables=dict(task_vars, **extra)).template(task_vars[name])

    def run_module(self, name, module_args, task_vars):
        """One node module's result, run on the task's host with the task's check and diff mode."""
        return self._execute_module(module_name=name, module_args=dict(module_args), task_vars=task_vars)


def read_outside_check_mode(action, name, module_args, task_vars):
    """A read-only module's result (disruption_budget: the run's plan needs its reading in check mode too), run by the
    action plugin ``action`` outside check mode; the task's check mode is set back after."""
    return run_module_in_mode(action, name, module_args, task_vars, check_mode=False)


def run_module_in_mode(action, name, module_args, task_vars, check_mode=None):
    """A module's result, run by the action plugin ``action`` with ``check_mode`` instead of the task's where it is not
    None (a dry run inside a real run); the task's check mode is set back after."""
    saved = action._task.check_mode
    if check_mode is not None:
        action._task.check_mode = check_mode
    try:
        return action._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)
    finally:
        action._task.check_mode = saved


def readable(result):
    """A module's result as the action task's own keys (what playbooks and lab tests read there), but its changed and invocation."""
    return {key: value for key, value in result.items() if key not in ("changed", "invocation")}


def with_controller_python(action, task_vars, python):
    """``task_vars`` for a module the action plugin ``action`` runs on the controller (its task delegated to localhost)
    with ``python`` (a role's *_controller_python, else the playbook's): never the play's node Python
    (playbooks/vars/node_python.yml), which a delegated task would take there (ansible-core 2.19, measured for
    tests/unit/test_node_prerequisites.py).  The delegated host's variables are where ansible-core reads it from."""
    task_vars = dict(task_vars or {})
    python = python or task_vars.get("ansible_playbook_python")
    if python:
        delegate = action._task.delegate_to
        if delegate:
            delegated = dict(task_vars.get("ansible_delegated_vars") or {})
            delegated[delegate] = dict(delegated.get(delegate) or {}, ansible_python_interpreter=python)
            task_vars["ansible_delegated_vars"] = delegated
        else:
            task_vars["ansible_python_interpreter"] = python
    return task_vars
