#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/container_runtime_stage.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: container_runtime_stage
short_description: Role container_runtime's work on one node, decided from the role's variables
version_added: 0.1.0
description:
  - Role C(gpuharden.k8s.container_runtime) calls it in C(tasks/main.yml). It reads the role's variables itself, as the
    role's tasks see them.
  - It fails the host before anything is written where neither containerd's configuration directory (the
    directory of C(container_runtime_config)) nor the unit C(container_runtime_service) is on the node. Else it runs
    M(gpuharden.k8s.containerd_nvidia_runtime) with C(container_runtime_audit_options), C(container_runtime_backup), the
    restart (C(container_runtime_restart)), C(container_runtime_service) and C(container_runtime_ready_timeout); the
    module's result is this task's. Where containerd did not come back after the restart (the module then put the files
    back and restarted it once more), the host fails, naming the files, containerd's reason and how the second restart went.
  - It sets the facts C(container_runtime_handler) (the runtime name, which the RuntimeClass check reads from every host
    of the play) and C(container_runtime_restart_required) (a restart is still pending).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options: {}
attributes:
  check_mode:
    support: full
    description: As M(gpuharden.k8s.containerd_nvidia_runtime); nothing restarts.
  diff_mode:
    support: full
    description: As M(gpuharden.k8s.containerd_nvidia_runtime).
seealso:
  - module: gpuharden.k8s.containerd_nvidia_runtime
"""

EXAMPLES = r"""
- name: Ensure containerd has the NVIDIA runtime, and restart containerd if it changed
  gpuharden.k8s.container_runtime_stage:
  register: container_runtime_result
"""

RETURN = r"""
runtime_name:
  description: As M(gpuharden.k8s.containerd_nvidia_runtime) returns it, with its other keys.
  returned: where the module ran
  type: str
  sample: nvidia
ansible_facts:
  description: C(container_runtime_handler) and C(container_runtime_restart_required).
  returned: success
  type: dict
  sample: {"container_runtime_handler": "nvidia", "container_runtime_restart_required": false}
"""
