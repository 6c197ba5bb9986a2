#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/runtime_class_stage.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: runtime_class_stage
short_description: Role runtime_class's write, decided from the role's variables
version_added: 0.1.0
description:
  - Role C(gpuharden.k8s.runtime_class) calls it in C(tasks/main.yml), delegated to localhost, once for the play.
  - Runs M(gpuharden.k8s.runtime_class) with C(runtime_class_audit_options) (what the drift check's dry run takes),
    C(runtime_class_kubeconfig) and C(runtime_class_kube_context) (where not empty), C(runtime_class_force) and
    C(runtime_class_nodes), on C(runtime_class_controller_python); the module's result is this task's.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options: {}
attributes:
  check_mode:
    support: full
    description: As M(gpuharden.k8s.runtime_class).
  diff_mode:
    support: full
    description: As M(gpuharden.k8s.runtime_class).
seealso:
  - module: gpuharden.k8s.runtime_class
"""

EXAMPLES = r"""
- name: RuntimeClass | ensure it matches containerd's runtime (once for the play)
  gpuharden.k8s.runtime_class_stage:
  delegate_to: localhost
  run_once: true
  register: runtime_class_result
"""

RETURN = r"""
action:
  description: As M(gpuharden.k8s.runtime_class) returns it, with its other keys.
  returned: success
  type: str
"""
