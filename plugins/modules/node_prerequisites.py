#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/node_prerequisites.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: node_prerequisites
short_description: Role node_prerequisites' work on one node, decided from the role's variables
version_added: 0.2.0
description:
  - Role C(gpuharden.k8s.node_prerequisites) calls it after its variables were checked. It reads the role's variables
    (C(node_prerequisites_*)) itself; the decisions are in C(module_utils/cluster/_node_prerequisites_plan.py).
  - With C(node_prerequisites_wheels) it copies that directory's wheels to C(node_prerequisites_wheels_dest) on the
    node (the action of M(ansible.builtin.copy)), then installs from there alone.
  - Runs M(gpuharden.k8s.node_venv) with the role's options; its result is this task's, with RV(wheels) added.
  - Where the play names the host's own Python (C(__gpuharden_host_python), from the playbooks' C(vars/node_python.yml))
    the copy and M(gpuharden.k8s.node_venv) run with it, not with the play's node-task Python, which may be the venv
    this creates.
  - The role's next task sets the fact C(node_prerequisites_venv_python) from RV(python) once the venv holds every
    package (RV(ready)); the playbooks run their node tasks with it.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options: {}
attributes:
  check_mode:
    support: full
    description: As M(gpuharden.k8s.node_venv) and M(ansible.builtin.copy).
  diff_mode:
    support: none
seealso:
  - module: gpuharden.k8s.node_venv
"""

EXAMPLES = r"""
- name: Node prerequisites | create the venv with the node packages
  gpuharden.k8s.node_prerequisites:
  register: node_prerequisites_result
"""

RETURN = r"""
python:
  description: The venv's Python (from M(gpuharden.k8s.node_venv), as its other return values).
  returned: success
  type: str
ready:
  description: Whether the venv holds every package (false in check mode before the venv exists).
  returned: success
  type: bool
wheels:
  description: The copy's result where C(node_prerequisites_wheels) is set, else null.
  returned: success
  type: dict
"""
