# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: gpu_facts_report
author:
  - gpuharden maintainers (@gpuharden)
version_added: 0.1.0
short_description: The lines the read-only audit prints of a node's GPU facts
description:
  - For C(playbooks/audit_node.yml). Returns one dictionary of the lines it prints of the C(gpuharden) facts of
    M(gpuharden.k8s.gpu_facts) - C(nvml), NVML's version and the driver's, or why NVML is unusable; C(gpus), one line
    per GPU (name, PCI bus, NUMA node, PCIe link, MIG mode, or its error); C(device_nodes), the C(/dev/nvidia*) nodes
    whose owner or mode differ from the driver's C(DeviceFileUID), C(DeviceFileGID) and C(DeviceFileMode); C(pcie), the
    PCIe links trained below their maximum.
  - With O(lines=true), those lines as one list instead, in that order (each GPU's its own), for one C(debug) task;
    use C(query()), which keeps the list.
  - Runs on the controller only; contacts no host.
options:
  _terms:
    description: One term, the host's C(ansible_facts.gpuharden).
    required: true
    type: list
    elements: dict
  lines:
    description: Return the lines as one list rather than one dictionary.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Report NVML status
  ansible.builtin.debug:
    msg: "{{ (lookup('gpuharden.k8s.gpu_facts_report', ansible_facts.gpuharden)).nvml }}"

- name: Report every line
  ansible.builtin.debug:
    msg: "{{ query('gpuharden.k8s.gpu_facts_report', ansible_facts.gpuharden, lines=true) }}"
"""

RETURN = r"""
_raw:
  description: One dictionary with C(nvml), C(gpus) (a list), C(device_nodes) and C(pcie); with O(lines), the lines.
  type: list
  elements: raw
"""

from ansible.errors import AnsibleError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit._gpu_facts_report import gpu_facts_report, report_lines


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) != 1 or not isinstance(terms[0], dict) or "nvml" not in terms[0]:
            raise AnsibleError("gpuharden.k8s.gpu_facts_report: give one term, the gpuharden facts of gpuharden.k8s.gpu_facts")
        try:
            report = gpu_facts_report(terms[0])
            return report_lines(report) if boolean(kwargs.get("lines", False), strict=True) else [report]
        except (KeyError, TypeError, ValueError) as error:
            raise AnsibleError("gpuharden.k8s.gpu_facts_report: the gpuharden facts are not gpu_facts' (%s: %s)" % (type(error).__name__, error)) from None
