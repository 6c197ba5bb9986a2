#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: unharden_files
short_description: Put back the node files gpuharden changed, as they were before its first change
version_added: 0.2.0
description:
  - Every gpuharden module that writes a node file (M(gpuharden.k8s.nvidia_device_nodes),
    M(gpuharden.k8s.containerd_nvidia_runtime), M(gpuharden.k8s.kubelet_config)) keeps, before its first change of
    the file, the file's content (or its absence), mode and owner in a record under
    C(/var/lib/gpuharden/originals/), and with every write the sha256 of what it wrote.
  - This module reads those records and, per file - puts the original content, mode and owner back when the file
    still holds what gpuharden wrote; removes a file gpuharden created (and the directories it created for it, when
    they are empty); only drops the record when the file is the original already.
  - A file changed since gpuharden wrote it (or changed by someone between two gpuharden runs) is B(not) touched; it
    is reported in RV(conflicts), as a warning, and its record is kept. With O(force=true) it is restored anyway,
    its current content kept next to it as C(<file>.<time>.gpuharden-unharden~).
  - The backups gpuharden's modules made of a restored file (their C(backup) option) are removed with it, unless
    O(keep_backups=true); those of a file left in conflict are kept.
  - The kubelet's CPU and Memory Manager checkpoints that gpuharden removed when it changed a manager policy come
    back (replacing the one the kubelet wrote for gpuharden's policy; removed when there was none) only with
    O(checkpoints=true), while the kubelet is stopped on a drained node; otherwise they are a conflict and
    RV(disruptive) is true.
  - Restarts nothing; RV(restart) names the services whose configuration changed.
  - Files changed outside gpuharden's modules (device node modes under C(/dev), C(memory.high) of pod cgroups, MIG
    layouts) have no record and are left as they are.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.node_root
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  writers:
    description:
      - Undo only the files these modules wrote; the others keep gpuharden's content and their records.
    type: list
    elements: str
    choices: [nvidia_device_nodes, containerd_nvidia_runtime, kubelet_config]
    default: [nvidia_device_nodes, containerd_nvidia_runtime, kubelet_config]
  force:
    description:
      - Also restore files changed since gpuharden wrote them (their current content is kept as a backup).
    type: bool
    default: false
  keep_backups:
    description:
      - Keep the backups gpuharden's modules made of the files that are restored.
    type: bool
    default: false
  checkpoints:
    description:
      - Put back the kubelet's CPU/Memory Manager checkpoints gpuharden removed when it changed a manager policy
        (the kubelet's current one goes). Only while the kubelet is stopped, on a drained node.
    type: bool
    default: false
notes:
  - Files are written atomically (a temporary file in the same directory, then a rename) with the original's mode
    and owner.
seealso:
  - module: gpuharden.k8s.unharden_cluster
"""

EXAMPLES = r"""
- name: Show what the uninstall would put back
  gpuharden.k8s.unharden_files:
  check_mode: true
  diff: true
  register: unharden

- name: Put back the device permission and containerd files, not the kubelet's
  gpuharden.k8s.unharden_files:
    writers: [nvidia_device_nodes, containerd_nvidia_runtime]
"""

RETURN = r"""
files:
  description:
    - One entry per recorded file, with C(path), C(writer) (the module that changed it), C(action) (V(restore),
      V(remove), V(forget) (already the original), V(conflict), V(skip) (not in O(writers))), C(reason), C(forced),
      C(backups_removed) and C(backups_kept).
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/containerd/config.toml", "writer": "containerd_nvidia_runtime", "action": "restore",
            "reason": "gpuharden changed it; the original comes back", "forced": false,
            "backups_removed": ["/etc/containerd/config.toml.1234.2026-01-01@10:00:00~"], "backups_kept": []}]
conflicts:
  description: The files left as they are, with C(path) and C(reason).
  returned: always
  type: list
  elements: dict
restart:
  description: The services whose configuration was (or in check mode would be) restored (V(containerd), V(kubelet)).
  returned: always
  type: list
  elements: str
disruptive:
  description: A kubelet manager policy change is among the files to undo (needs a drain and a stopped kubelet).
  returned: always
  type: bool
backups_made:
  description: Copies of the files a forced restore overwrote.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell, _originals
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

WRITERS = ["nvidia_device_nodes", "containerd_nvidia_runtime", "kubelet_config"]


def argument_spec():
    return {
        "root": {"type": "path", "default": "/"},
        "writers": {"type": "list", "elements": "str", "choices": WRITERS, "default": list(WRITERS)},
        "force": {"type": "bool", "default": False},
        "keep_backups": {"type": "bool", "default": False},
        "checkpoints": {"type": "bool", "default": False},
    }


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def decide(params):
    """Read the records and the files they name; return the plan (reads only)."""
    root = params["root"]
    records = _originals.load_records(root)
    current = {}
    for record in records:
        current[record["path"]] = _originals.read_text(_originals.host_path(root, record["path"]), root=root)
    return _originals.plan_restore(records, current, force=params["force"], writers=params["writers"],
                                   keep_backups=params["keep_backups"], allow_checkpoints=params["checkpoints"])


def run(module):
    try:
        return restore(module)
    except OSError as error:
        # _originals reads and writes with plain os calls; the task still names the module and the file.
        raise GpuhardenError("unharden_files: %s: %s" % (error.filename or "a file", error.strerror or error)) from error


def restore(module):
    plan = decide(module.params)
    changed = any(entry["changed"] for entry in plan["entries"])
    made = []
    if not module.check_mode:
        made = _originals.apply_restore(module, module.params["root"], plan)
    for entry in plan["conflicts"]:
        module.warn("%s: %s" % (entry["path"], entry["reason"]))
    keys = ("path", "writer", "action", "reason", "forced", "backups_removed", "backups_kept")
    result = {
        "changed": changed,
        "files": [{key: entry[key] for key in keys} for entry in plan["entries"]],
        "conflicts": [{"path": entry["path"], "reason": entry["reason"]} for entry in plan["conflicts"]],
        "restart": plan["services"],
        "disruptive": plan["disruptive"],
        "backups_made": made,
    }
    if module._diff:
        result["diff"] = _originals.diff(plan["entries"])
    return result


def main():
    _module_shell.run_module(build_module(), run)


if __name__ == "__main__":
    main()
