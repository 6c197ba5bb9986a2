# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""What one task of a gpuharden playbook hands to a later one, kept by the actions themselves.

An action returns ``handed_over(name, value)`` as its facts and a later action reads ``taken_over(task_vars, name)``:
the hand-over's name lives in Python (one constant, unit-tested), not in a ``register:`` the YAML spells and templates.

Host facts outlive the run where a fact cache is configured (jsonfile, redis, AWX's): a hand-over from an earlier
run must never decide anything in this one.  Each is stamped with this run, the ansible-playbook process (boot,
PID namespace, PID and start time: Ansible's workers are forks of it), and ``taken_over`` returns only this run's.
Controller side only."""

from __future__ import annotations

import os

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _node_lock

RUN = "run"
VALUE = "value"


def this_run(proc="/proc", pid=None):
    """This ansible-playbook run, as a stamp: equal in every task of one run, different in any other run."""
    main = _node_lock.playbook_process(pid or os.getpid(), proc)
    with open("%s/sys/kernel/random/boot_id" % proc, encoding="ascii") as boot:
        boot_id = boot.read().strip()
    return {"boot_id": boot_id, "pid_ns": os.readlink("%s/self/ns/pid" % proc), "pid": main,
            "start": _node_lock.process_start(main, proc)}


def handed_over(name, value, run=None):
    """The facts an action returns to hand ``value`` (its plain data) over as ``name`` to a later task of this run."""
    return {name: {RUN: run if run is not None else this_run(), VALUE: plain_data(value)}}


def plain_data(value):
    """``value`` with JSON's kinds of data only (mappings, sequences, strings, numbers, booleans, None): anything else,
    such as a failed module run's captured exception, is left out, from a mapping with its key."""
    if isinstance(value, dict):
        return {str(key): plain_data(item) for key, item in value.items() if _is_data(item)}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain_data(item) for item in value if _is_data(item)]
    return value


def _is_data(value):
    return value is None or isinstance(value, (dict, list, tuple, set, frozenset, str, int, float, bool))


def taken_over(variables, name, default=None, run=None):
    """What a task of this run handed over as ``name`` (``variables``: a task's variables or one host's hostvars),
    else ``default``: never handed over, or handed over by another run (a fact cache kept it)."""
    if name in variables:
        stamped = variables[name]
    else:
        facts = variables.get("ansible_facts")
        stamped = facts.get(name) if hasattr(facts, "get") else None
    if not hasattr(stamped, "get") or VALUE not in stamped:
        return default
    if stamped.get(RUN) != (run if run is not None else this_run()):
        return default
    return stamped[VALUE]
