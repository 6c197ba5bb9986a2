#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/device_permissions_repair.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: device_permissions_repair
short_description: Repair the NVIDIA device nodes of role device_permissions, in one task
version_added: 0.1.0
description:
  - Role C(gpuharden.k8s.device_permissions) calls it in C(tasks/main.yml). It runs M(gpuharden.k8s.nvidia_device_nodes)
    on the host with the role's options (C(__device_permissions_module_options)) and C(device_permissions_backup), and
    returns that module's result.
  - A host whose running driver still uses other C(NVreg_DeviceFile*) values goes to the run's statistics,
    C(device_permissions_reload_required) (a list of inventory hosts, aggregated over the run).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.ACTION
options: {}
attributes:
  check_mode:
    support: full
    description: As M(gpuharden.k8s.nvidia_device_nodes).
  diff_mode:
    support: full
    description: As M(gpuharden.k8s.nvidia_device_nodes).
seealso:
  - module: gpuharden.k8s.nvidia_device_nodes
"""

EXAMPLES = r"""
- name: Repair the NVIDIA device nodes and persist their permissions
  gpuharden.k8s.device_permissions_repair:
  register: device_permissions_result
"""

RETURN = r"""
reboot_or_reload_required:
  description: The running driver still uses other C(NVreg_DeviceFile*) values (as M(gpuharden.k8s.nvidia_device_nodes)).
  returned: success
  type: bool
"""
