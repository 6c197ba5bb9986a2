# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: role_options
author:
  - gpuharden maintainers (@gpuharden)
version_added: 0.1.0
short_description: A role's module options, built from the role's variables
description:
  - Returns, for each term, one options map of the collection's roles (the C(<role>_audit_options) that
    M(gpuharden.k8s.node_audit) and the drift check take, and the maps the roles' own tasks pass their modules), built
    from the role's variables as the calling task sees them (the role's C(defaults/main.yml), overridden as usual).
  - Which variable feeds which module option is written once, in the collection's settings table; an option the role
    leaves empty is left out of the map, so that the module's own default applies.
  - Contacts no host.
options:
  _terms:
    description: The names of the maps, for example V(device_plugin_audit_options) or V(__mig_module_options).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: The device plugin's options, as role gpuharden.k8s.device_plugin passes them
  ansible.builtin.debug:
    var: lookup('gpuharden.k8s.role_options', 'device_plugin_audit_options')
"""

RETURN = r"""
_raw:
  description: One dictionary per term, the options map.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _errors, _role_options


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}

        def read(variable):
            return self._templar.template(variables[variable]) if variable in variables else _role_options.UNDEFINED

        maps = []
        for name in terms:
            try:
                wanted = _role_options.inputs(name)
            except _errors.GpuhardenError as error:
                raise AnsibleError("gpuharden.k8s.role_options: %s" % error) from None
            missing = [variable for variable in wanted if variable not in variables and variable not in _role_options.OPTIONAL
                       and variable not in _role_options.FOLLOWED]
            if missing:
                raise AnsibleError("gpuharden.k8s.role_options: %s: %s undefined: import the role's tasks (tasks_from: audit_params.yml) or the role "
                                   "first" % (name, ", ".join(missing)))
            values = {variable: _role_options.followed(variable, read) for variable in wanted}
            values = {variable: value for variable, value in values.items() if value is not _role_options.UNDEFINED}
            maps.append(_role_options.options(name, values))
        return maps
