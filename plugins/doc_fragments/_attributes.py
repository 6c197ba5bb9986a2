# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
"""

    FACTS = r"""
options: {}
attributes:
  facts:
    support: full
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
"""

    ACTION = r"""
options: {}
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
"""

    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - This action does not modify state.
  diff_mode:
    support: N/A
    details:
      - This action does not modify state.
"""

    NODE_ROOT = r"""
options:
  root:
    description:
      - Path under which the node's filesystem is visible.
      - Keep the default V(/) when the module runs on the node itself. Use for example V(/host) when it
        runs in a privileged pod that mounts the host's root filesystem there.
      - C(/dev), C(/proc/driver/nvidia), C(/proc/devices) and C(/sys/bus/pci/devices) are read below it.
    type: path
    default: /
"""
