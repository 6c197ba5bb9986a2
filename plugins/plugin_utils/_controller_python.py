# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The controller's Python for a module an action runs on the controller (a task delegated to localhost)."""

from __future__ import annotations


def with_controller_python(action, task_vars, python=None):
    """``task_vars`` with ``python`` (else the one running ansible-playbook) as the module's interpreter.  A play on the
    nodes sets the node's Python as a play variable (vars/node_python.yml, bootstrap's venv): a task delegated to the
    controller without its own would take that path there (ansible-core 2.19, measured; tests/unit/test_node_prerequisites.py)."""
    task_vars = dict(task_vars)
    python = python or task_vars.get("ansible_playbook_python")
    if not python:
        return task_vars
    delegate = action._task.delegate_to
    if delegate:
        # a delegated task's connection variables are the delegate's (ansible_delegated_vars)
        delegated = dict(task_vars.get("ansible_delegated_vars") or {})
        delegated[delegate] = dict(delegated.get(delegate) or {}, ansible_python_interpreter=python)
        task_vars["ansible_delegated_vars"] = delegated
    else:
        task_vars["ansible_python_interpreter"] = python
    return task_vars
