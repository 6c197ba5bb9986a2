# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: controller_run
author:
  - gpuharden maintainers (@gpuharden)
version_added: 0.1.0
short_description: This run's ansible-playbook process on the controller, and the ones alive there now
description:
  - Returns one dictionary that names the run's controller process, for the node run locks (M(gpuharden.k8s.node_lock)
    and M(gpuharden.k8s.node_audit) option C(controller)). A lock records it; a later run from the same controller takes
    the lock over at once when that process has ended (Ctrl-C, a killed job), where it otherwise waits for the lock's
    C(stale_after) (2 h).
  - Reads C(/proc) on the controller only (Linux); contacts no host.
"""

EXAMPLES = r"""
- name: Name this run's controller process once, for the node locks
  ansible.builtin.set_fact:
    gpuharden_controller: "{{ query('gpuharden.k8s.controller_run') | first }}"
  run_once: true
"""

RETURN = r"""
_raw:
  description:
    - One dictionary. C(host) (the host name), C(boot_id), C(pid_ns) (the PID namespace), C(pid) and C(start) (the
      ansible-playbook process of this run and its start time, in clock ticks after boot) name the run's process;
      C(live) lists the C([pid, start]) of every ansible-playbook process alive now, and C(checked) when that list was
      made (clock ticks after boot).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _node_lock


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        try:
            return [_node_lock.controller_identity()]
        except (OSError, ValueError, IndexError) as error:
            raise AnsibleError("gpuharden.k8s.controller_run: cannot read this controller's processes in /proc: %s" % error) from None
