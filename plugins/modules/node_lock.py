#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_lock
short_description: Take or release the gpuharden run lock on a node
version_added: 0.1.0
description:
  - Serialises gpuharden runs on one node, also between controllers (a scheduled drift check and a bootstrap
    pipeline, for example). The lock is a file on the node created with C(O_EXCL), holding the owner and the time.
  - O(state=acquired) creates the lock, keeps it when O(owner) already holds it, and otherwise waits up to O(timeout)
    seconds before failing with the holder's name. It takes over, with a warning that names the holder and why, a lock
    whose run is provably gone (the holder's ansible-playbook process, recorded from O(controller), ended on the same
    controller), a lock older than its O(stale_after), and an unreadable one.
  - O(state=released) removes the lock when O(owner) holds it (or it is unreadable); someone else's lock is left alone.
  - Reports C(changed=false). The lock is bookkeeping the same run removes again, and a compliant node must give a
    run with no changes.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
options:
  path:
    description:
      - The lock file on the node. The default is on tmpfs, so a reboot clears it.
    type: path
    default: /run/gpuharden/run.lock
  owner:
    description:
      - Who holds the lock, for example C(drift@controller:1234). Use the same value to release it.
    type: str
    required: true
  state:
    description:
      - V(acquired) to take the lock, V(released) to give it back.
    type: str
    choices: [acquired, released]
    default: acquired
  timeout:
    description:
      - Seconds to wait for another run's lock before failing. V(0) fails at once.
    type: int
    default: 0
  stale_after:
    description:
      - Seconds after which this lock counts as abandoned and another run may take it over.
    type: int
    default: 7200
  controller:
    description:
      - This run's controller process and the ansible-playbook processes alive there now, as the lookup
        C(gpuharden.k8s.controller_run) returns them (C(host), C(boot_id), C(pid_ns), C(pid), C(start), C(live),
        C(checked)). The lock records the first five; a later run from the same controller (same host, boot and PID
        namespace) takes the lock over at once when that process has ended, without waiting for O(stale_after).
      - Omitted, the lock records no process and only O(stale_after) ends a dead run's lock.
    type: dict
attributes:
  check_mode:
    support: none
    details:
      - Skipped in check mode, which changes nothing that needs serialising.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Take the node's run lock, waiting up to a minute
  gpuharden.k8s.node_lock:
    owner: "harden@{{ lookup('ansible.builtin.env', 'HOSTNAME') }}"
    timeout: 60

- name: Take it, recording this run's controller process (a later run from there takes it over once this run is gone)
  gpuharden.k8s.node_lock:
    owner: "harden@{{ lookup('ansible.builtin.env', 'HOSTNAME') }}"
    controller: "{{ query('gpuharden.k8s.controller_run') | first }}"

- name: Give it back
  gpuharden.k8s.node_lock:
    owner: "harden@{{ lookup('ansible.builtin.env', 'HOSTNAME') }}"
    state: released
"""

RETURN = r"""
action:
  description: What was done, C(create), C(keep), C(take_over), C(remove), C(absent) or C(foreign).
  returned: success
  type: str
holder:
  description: The lock's content before this call (C(owner), C(acquired_at), C(stale_after), C(run)), or null.
  returned: always
  type: dict
taken_over:
  description: With RV(action=take_over), why the holder's lock was taken over (its run is gone, it is stale, unreadable); else null.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell, _node_lock


def build_module():
    return AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": _node_lock.DEFAULT_PATH},
            "owner": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["acquired", "released"], "default": "acquired"},
            "timeout": {"type": "int", "default": 0},
            "stale_after": {"type": "int", "default": _node_lock.DEFAULT_STALE_AFTER},
            "controller": {"type": "dict"},
        },
        supports_check_mode=False,
    )


def main():
    _module_shell.run_module(build_module(), lambda module: _node_lock.run(module.params), never_changed=True)


if __name__ == "__main__":
    main()
