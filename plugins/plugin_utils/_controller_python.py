# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The controller's Python for a module an action runs on the controller (a task delegated to localhost).

The playbooks' plays set ansible_python_interpreter to the nodes' Python (playbooks/vars/node_python.yml); a task
delegated to localhost without its own would take that path on the controller (ansible-core 2.19, measured: the
delegated host's variables come from ansible_delegated_vars, which carry the play's).  An action that names the
controller's Python here needs no ``vars: ansible_python_interpreter`` on its task (tests/unit/test_node_prerequisites.py
lists those actions).  Controller side only."""

from __future__ import annotations


def on_controller(task, task_vars, python=None):
    """``task_vars`` with ``python`` (a role's *_controller_python; default the playbook's Python) as the interpreter
    of the task's host, or of its delegate where the task is delegated."""
    task_vars = dict(task_vars)
    python = python or task_vars.get("ansible_playbook_python")
    if not python:
        return task_vars
    delegate = getattr(task, "delegate_to", None)
    if delegate:
        delegated = dict(task_vars.get("ansible_delegated_vars") or {})
        delegated[delegate] = dict(delegated.get(delegate) or {}, ansible_python_interpreter=python)
        task_vars["ansible_delegated_vars"] = delegated
    else:
        task_vars["ansible_python_interpreter"] = python
    return task_vars
