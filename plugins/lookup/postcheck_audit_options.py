# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: postcheck_audit_options
author:
  - gpuharden maintainers (@gpuharden)
version_added: 0.1.0
short_description: The post-check role's node-side checks as M(gpuharden.k8s.node_audit) takes them
description:
  - Returns, for each term, the options of one node_audit check of the post-check role, from the role's C(postcheck_*)
    variables as the calling task sees them (C(roles/postcheck/defaults/main.yml)), or an empty dictionary where the
    role's variables turn that check off. The role's own read (M(gpuharden.k8s.postcheck_step)) takes the same options.
  - Contacts no host.
options:
  _terms:
    description: The checks, V(nvml) and V(device_cgroups).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Audit the node with the post-check's NVML check
  gpuharden.k8s.node_audit:
    nvml: "{{ query('gpuharden.k8s.postcheck_audit_options', 'nvml') | first }}"
"""

RETURN = r"""
_raw:
  description: One dictionary per term, the check's node_audit options, empty where the check is off.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _postcheck_plan as plan
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._role_options import UNDEFINED, followed

CHECKS = ("nvml", "device_cgroups")


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        unknown = [term for term in terms if term not in CHECKS]
        if unknown or not terms:
            raise AnsibleError("gpuharden.k8s.postcheck_audit_options: terms %r: name one or more of %s" % (unknown or terms, ", ".join(CHECKS)))
        variables = variables or {}

        def read(name):
            return self._templar.template(variables[name]) if name in variables else UNDEFINED

        settings = {name: followed(name, read) for name in plan.AUDIT_SETTINGS}
        missing = [name for name, value in settings.items() if value is UNDEFINED]
        if missing:
            raise AnsibleError("gpuharden.k8s.postcheck_audit_options: %s undefined: import the role gpuharden.k8s.postcheck (tasks_from: "
                               "audit_params.yml) first" % ", ".join(missing))
        options = dict(zip(CHECKS, plan.audit_options(settings), strict=True))
        return [options[term] for term in terms]
