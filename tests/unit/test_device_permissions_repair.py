# SPDX-License-Identifier: GPL-3.0-or-later
"""Role device_permissions' repair in one action (issue 45): gpuharden.k8s.device_permissions_repair runs
nvidia_device_nodes with the role's options and backup (main.yml passed them in Jinja, module_defaults) and records the
hosts whose driver must be reloaded (main.yml's set_stats)."""

from __future__ import annotations

from unittest import mock

import pytest
from ansible.errors import AnsibleUndefinedVariable
from ansible_collections.gpuharden.k8s.plugins.action import device_permissions_repair as action

OPTIONS = {"policy": "restricted", "group": "video", "mode": "0660"}


def _plugin(variables, result):
    def resolve(expression):
        if expression not in variables:
            raise AnsibleUndefinedVariable("%r is undefined" % expression)
        return variables[expression]

    task = mock.MagicMock(args={}, check_mode=False, async_val=0, diff=False)
    templar = mock.MagicMock(resolve_variable_expression=mock.MagicMock(side_effect=resolve))
    plugin = action.ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(), templar, mock.MagicMock())
    plugin._execute_module = mock.MagicMock(return_value=result)
    return plugin


@pytest.mark.parametrize(("reload_required", "recorded"), [(True, ["host-1"]), (False, [])])
def test_the_repair_takes_the_role_s_options_and_records_a_reload(reload_required, recorded):
    plugin = _plugin({"__device_permissions_module_options": OPTIONS, "device_permissions_backup": "yes"},
                     {"changed": True, "reboot_or_reload_required": reload_required})
    result = plugin.run(task_vars={"inventory_hostname": "host-1"})
    call = plugin._execute_module.call_args.kwargs
    assert call["module_name"] == "gpuharden.k8s.nvidia_device_nodes" and call["module_args"] == dict(OPTIONS, backup=True)
    assert result["changed"] is True and result["reboot_or_reload_required"] is reload_required
    assert result["ansible_stats"] == {"data": {"device_permissions_reload_required": recorded}, "per_host": False, "aggregate": True}


def test_a_failed_repair_is_the_task_s_failure_and_records_nothing():
    result = _plugin({"__device_permissions_module_options": OPTIONS, "device_permissions_backup": False},
                     {"failed": True, "msg": "device_permissions: group 'nope' does not exist"}).run(task_vars={"inventory_hostname": "host-1"})
    assert result["failed"] and "ansible_stats" not in result and "nope" in result["msg"]


def test_without_the_role_s_options_the_task_fails_naming_them():
    from ansible.errors import AnsibleActionFail

    with pytest.raises((AnsibleActionFail, AnsibleUndefinedVariable), match="__device_permissions_module_options"):
        _plugin({"device_permissions_backup": False}, {}).run(task_vars={"inventory_hostname": "host-1"})
