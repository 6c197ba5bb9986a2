# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The cgroups of processes (GPU processes from NVML), to tie them to pods: shared by process_cgroup_info and
node_audit."""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._host import read_node_text
from ansible_collections.gpuharden.k8s.plugins.module_utils.node._cgroup_paths import parse_container_path, process_cgroup_path


def read(root, pids):
    cgroups, containers, missing = {}, {}, []
    for position, pid in enumerate(pids):
        if pid < 1:
            raise GpuhardenError("process_cgroup_info: option pids[%d]=%r is not a process ID" % (position, pid))
        try:
            text = read_node_text(root, "/proc/%d/cgroup" % pid)  # regular files only: a FIFO never blocks
        except GpuhardenError as error:
            raise GpuhardenError("process_cgroup_info: %s" % error.msg, **error.result) from None
        if text is None:
            missing.append(pid)
            continue
        path = process_cgroup_path(text)
        if path is None:
            continue
        cgroups[str(pid)] = path
        parsed = parse_container_path(path)
        if parsed:
            containers[str(pid)] = parsed
    return {"cgroups": cgroups, "containers": containers, "missing": sorted(set(missing))}
