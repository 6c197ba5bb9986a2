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

from collections.abc import Mapping

from ansible.errors import AnsibleActionFail, AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._role_options import BUILT_WHERE_READ, UNDEFINED, built, followed


def role_setting(templar, name, task_vars=None):
    """A role's variable as the role's tasks see it, templated, where set; one the settings table leaves unset in the
    role's defaults (follow_in_python) read from its follows (core/_role_options.py followed); one of the options maps
    no vars file exposes (BUILT_WHERE_READ) built from the role's variables; else UNDEFINED.  Set means
    in ``task_vars`` where given, else known to the templar: a variable that is set but whose template names an
    undefined one still fails, naming it."""
    def read(variable):
        if task_vars is not None:
            return templar.resolve_variable_expression(variable) if variable in task_vars else UNDEFINED
        try:
            return templar.resolve_variable_expression(variable)
        except AnsibleUndefinedVariable:
            available = getattr(templar, "available_variables", None)
            if isinstance(available, Mapping) and variable in available:
                raise
            return UNDEFINED
    value = followed(name, read)
    return built(name, read) if value is UNDEFINED and name in BUILT_WHERE_READ else value


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
        """A role's variable as the role's tasks see it (templated, with role_setting's follows), or ``default`` where it
        is undefined or null."""
        value = role_setting(self._templar, expression)
        return default if value is UNDEFINED or value is None else value

    def with_role_variables(self, args, variables):
        """The task's arguments, each one left out (None) read from the role's variable ``variables[name]``, a pair
        (expression, default): a role's tasks then call the action without spelling out what it reads."""
        return dict(args, **{name: self.role_variable(*variables[name]) for name in variables if args[name] is None})

    def variable(self, name, task_vars=None, **extra):
        """One of the role's or play's variables, templated as a task of the role templates it, with role_setting's
        follows (undefined fails the task, naming it); with ``extra``, templated with those variables added to ``task_vars``."""
        if extra:
            return self._templar.copy_with_new_env(available_variables=dict(task_vars, **extra)).template(task_vars[name])
        value = role_setting(self._templar, name)
        if value is UNDEFINED:
            raise AnsibleUndefinedVariable("%r is undefined" % name)
        return value

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
