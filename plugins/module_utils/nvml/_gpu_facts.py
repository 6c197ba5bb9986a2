# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What gpu_facts returns as ansible_facts.gpuharden: NVML's inventory and the driver's own files, read-only.
node_audit gathers the same facts in its own run (option facts) so that harden needs no second trip for them."""

from __future__ import annotations

import os

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _host
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _nvml


def gather(root):
    if not os.path.isdir(root):
        raise GpuhardenError("gpu_facts: option root=%s is not a directory" % root)
    inventory = _nvml.collect_inventory(lambda bus_id: _host.numa_node(root, bus_id))
    majors = _host.char_majors(root)
    return {
        "nvml": {
            "available": inventory["available"],
            "reason": inventory["reason"],
            "version": inventory["nvml_version"],
        },
        "driver_version": inventory["driver_version"],
        "cuda_driver_version": inventory["cuda_driver_version"],
        "gpu_count": inventory["gpu_count"],
        "gpus": inventory["gpus"],
        "driver_gpus": _host.driver_gpus(root),
        "device_nodes": _host.device_node_inventory(root),
        "driver_params": _host.driver_params(root),
        "char_majors": {name: major for name, major in majors.items() if name.startswith("nvidia")},
        "cgroup_version": _host.cgroup_version(root),
    }
