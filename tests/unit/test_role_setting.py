# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/_stage_action.py role_setting: how the actions read a role's variable, the settings the role's
defaults leave unset (their follows, core/_role_options.py followed) and the maps built where they are read."""

from __future__ import annotations

from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail, AnsibleUndefinedVariable
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._role_options import UNDEFINED
from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _stage_action
from ansible_collections.gpuharden.k8s.plugins.plugin_utils._stage_action import role_setting


class _Templar:
    """A templar over plain variables; ``broken`` names variables that are set but whose template fails."""

    def __init__(self, variables, broken=()):
        self.available_variables = dict(variables, **dict.fromkeys(broken, "{{ nowhere }}"))
        self.broken = broken

    def resolve_variable_expression(self, name):
        if name in self.broken or name not in self.available_variables:
            raise AnsibleUndefinedVariable("%r is undefined" % ("nowhere" if name in self.broken else name))
        return self.available_variables[name]


def test_a_set_variable_is_read_as_it_is_and_an_unset_one_follows():
    assert role_setting(_Templar({"postcheck_kubeconfig": "/mine", "gpuharden_kubeconfig": "/fleet"}), "postcheck_kubeconfig") == "/mine"
    assert role_setting(_Templar({"gpuharden_kubeconfig": "/fleet"}), "postcheck_kubeconfig") == "/fleet"
    assert role_setting(_Templar({}), "postcheck_kubeconfig") == ""
    assert role_setting(_Templar({}), "postcheck_nvml") is UNDEFINED


def test_a_set_variable_whose_template_fails_is_not_taken_for_unset():
    with pytest.raises(AnsibleUndefinedVariable, match="nowhere"):
        role_setting(_Templar({"gpuharden_kubeconfig": "/fleet"}, broken=("postcheck_kubeconfig",)), "postcheck_kubeconfig")


def test_with_task_vars_only_what_they_hold_is_read():
    templar = _Templar({"gpuharden_max_unavailable": "25%"})
    assert role_setting(templar, "node_maintenance_max_unavailable", {"gpuharden_max_unavailable": "25%"}) == "25%"
    assert role_setting(templar, "node_maintenance_max_unavailable", {}) == 1


def test_the_mig_maps_are_built_where_the_actions_read_them():
    variables = {"mig_config": {}, "mig_config_file": "", "mig_selected": "", "mig_force": False, "mig_strategy": "mixed", "mig_root": "/",
                 "gpuharden_mig_layout": {"all": {"1g.10gb": 7}}, "gpuharden_node_plan": {"checks": {"mig": {"refused": [{"what": "mig"}]}}}}
    templar = _Templar(variables)
    assert role_setting(templar, "__mig_module_options")["layout"] == {"all": {"1g.10gb": 7}}
    assert role_setting(templar, "__mig_operator_refused") == [{"what": "mig"}]
    # one the play sets itself is taken as it is
    assert role_setting(_Templar(dict(variables, __mig_operator_refused=[])), "__mig_operator_refused") == []


class _Action(_stage_action.StageAction):
    NAME = "probe"
    ARGUMENT_SPEC = {}

    def decide_task(self, args, task_vars):
        return {"severity": self.variable("postcheck_fail_severity"), "missing": self.role_variable("postcheck_nvml", "none"),
                "options": self.variable("__mig_module_options")}


def _action(variables):
    task = mock.MagicMock(args={}, check_mode=False, async_val=0)
    return _Action(task, mock.MagicMock(), mock.MagicMock(), loader=None, templar=_Templar(variables), shared_loader_obj=None)


def test_the_stage_actions_read_through_it_and_a_map_that_cannot_be_built_fails_the_task():
    with mock.patch.object(_stage_action.ActionBase, "run", return_value={}):
        with pytest.raises(AnsibleActionFail, match="role options __mig_module_options: mig_config, .* undefined"):
            _action({"gpuharden_postcheck_fail_severity": "warning"}).run(task_vars={})
        variables = {"gpuharden_postcheck_fail_severity": "warning", "mig_config": {}, "mig_config_file": "/etc/mig.yaml", "mig_selected": "x",
                     "mig_force": False, "mig_strategy": "mixed", "mig_root": "/"}
        result = _action(variables).run(task_vars={})
    assert result["severity"] == "warning" and result["missing"] == "none" and result["options"]["config_file"] == "/etc/mig.yaml"
