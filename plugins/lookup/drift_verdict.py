# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: drift_verdict
author:
  - gpuharden maintainers (@gpuharden)
version_added: 0.1.0
short_description: A host's drift check result as run data, and why the drift check fails the host
description:
  - For the run-data play of C(playbooks/drift_check.yml) (ansible-playbook, AWX, AAP). Returns one dictionary with
    C(run_data), the host's entry of the C(gpuharden_drift) run data, and C(failure), why the host fails or an empty
    string.
  - A check that could not run (a part of a node check, or the cluster side's consistency check) fails the host with its
    cause; else findings of the node or of its Node in the consistency check at or above the fail severity (the fourth term) fail it,
    naming their ids and the stages to run.
  - Runs on the controller only; contacts no host.
options:
  _terms:
    description:
      - "Four terms, in this order: the host's C(gpuharden_node_plan) (the result of M(gpuharden.k8s.node_audit)); the
        play's registered M(gpuharden.k8s.gpu_consistency) result (V({}) or a skipped result where it did not run); the
        host's Kubernetes Node name (the consistency findings are matched by it); the lowest severity that fails the
        host (V(info), V(warning), V(error) or V(critical); the drift check passes C(gpuharden_drift_fail_severity),
        default V(warning))."
    required: true
    type: list
    elements: raw
"""

EXAMPLES = r"""
- name: Fail the host where a check could not run, or it drifted
  vars:
    verdict: "{{ lookup('gpuharden.k8s.drift_verdict', gpuharden_node_plan, {}, inventory_hostname, 'warning') }}"
  ansible.builtin.fail:
    msg: "{{ verdict.failure }}"
  when: verdict.failure | length > 0
"""

RETURN = r"""
_raw:
  description:
    - One dictionary. C(run_data) has C(node), C(summary), C(checks) and C(findings) (node_audit's) and
      C(consistency_findings) (the consistency check's about this Node); C(failure) is why the host fails, or V("").
  type: list
  elements: dict
"""

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.audit._drift_verdict import drift_verdict
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) != 4 or kwargs:
            raise AnsibleError("gpuharden.k8s.drift_verdict: give four terms (the host's gpuharden_node_plan, the consistency "
                               "result, the Node name, the fail severity) and no keyword; got %d term(s)%s"
                               % (len(terms), " and %s" % ", ".join(sorted(kwargs)) if kwargs else ""))
        try:
            return [drift_verdict(*terms)]
        except GpuhardenError as error:
            raise AnsibleError("gpuharden.k8s.drift_verdict: %s" % error) from None
