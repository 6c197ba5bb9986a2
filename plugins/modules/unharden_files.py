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
  - With O(defer_disruptive=true), where the kubelet's files need the drained way back (RV(disruptive)), they are left
    for that pass (RV(deferred)) and the other files are undone now.
  - RV(restart) names the services whose configuration changed. With O(restart=if_required) the module restarts them
    (containerd first, waited on until C(systemctl is-active) says active; then the kubelet, waited on until its
    O(kubelet_health_url) answers 200). With O(stop_kubelet=true) it stops the kubelet before the files change and
    starts it again after, also when the restore fails, and waits until it is healthy (the drained pass).
    Nothing restarts in check mode. A service that does not come back fails the task, after the files came back.
  - Files changed outside gpuharden's modules (device node modes under C(/dev), C(memory.high) of pod cgroups, MIG
    layouts) have no record and are left as they are.
  - Its action plugin, on the controller, gives each option the task leaves out the value of the uninstall's variable
    that sets it, where the host has one (else the option's default) - O(kubelet) C(gpuharden_unharden_kubelet),
    O(force) C(gpuharden_unharden_force), O(keep_backups) C(gpuharden_unharden_keep_backups), O(containerd_service)
    C(container_runtime_service), O(kubelet_service) C(kubelet_topology_service), O(kubelet_health_url)
    C(kubelet_topology_healthz_url), O(kubelet_health_timeout) C(kubelet_topology_health_timeout).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.node_root
  - gpuharden.k8s._attributes.ACTION
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
  kubelet:
    description:
      - V(false) leaves every kubelet file as gpuharden wrote it (the C(kubelet_config) writer is not undone, whatever
        O(writers) says) - no kubelet restart, no drain.
    type: bool
    default: true
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
  defer_disruptive:
    description:
      - When the kubelet's files need a drained node and a stopped kubelet (RV(disruptive)), leave them (the
        C(kubelet_config) writer) for the drained pass and undo the others now (RV(deferred)).
    type: bool
    default: false
  restart:
    description:
      - V(never) - restart nothing (RV(restart) names what needs it). V(if_required) - restart the services whose
        configuration this run put back and wait until they are ready.
    type: str
    choices: [never, if_required]
    default: never
  stop_kubelet:
    description:
      - Stop the kubelet before the files change, start it again after (also when the restore fails) and wait until
        it is healthy. For the drained pass with O(checkpoints=true).
    type: bool
    default: false
  kubelet_service:
    description:
      - The kubelet's systemd service. V(auto) takes the first that C(systemctl list-unit-files) lists of C(kubelet),
        C(k3s-agent), C(k3s), C(rke2-agent), C(rke2-server), else C(kubelet).
    type: str
    default: auto
  kubelet_health_url:
    description: The kubelet's healthz, polled after its restart until it answers 200.
    type: str
    default: http://127.0.0.1:10248/healthz
  kubelet_health_timeout:
    description: Seconds the kubelet has to answer 200 on O(kubelet_health_url) after its restart.
    type: int
    default: 120
  containerd_service:
    description: containerd's systemd service.
    type: str
    default: containerd
  containerd_ready_timeout:
    description: Seconds containerd has to be active again after its restart.
    type: int
    default: 30
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

- name: Undo what needs no drain, restart what came back, leave a kubelet policy change for the drained pass
  gpuharden.k8s.unharden_files:
    defer_disruptive: true
    restart: if_required
  register: unharden

- name: On the drained node, stop the kubelet, put back its files and checkpoints, start it and wait until healthy
  gpuharden.k8s.unharden_files:
    writers: [kubelet_config]
    checkpoints: true
    stop_kubelet: true
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
deferred:
  description: The writers whose files this run left for the drained pass (O(defer_disruptive)).
  returned: always
  type: list
  elements: str
  sample: [kubelet_config]
kubelet_service:
  description: The kubelet's systemd service, where this run restarts (or in check mode would restart) it; else V(null).
  returned: always
  type: str
restarts:
  description:
    - The services this run restarted, in order, each with C(service), C(unit), C(ready), C(status), C(seconds),
      C(attempts), C(error) and C(restarted_at) (the node's clock just before the restart).
  returned: always
  type: list
  elements: dict
backups_made:
  description: Copies of the files a forced restore overwrote.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _command, _module_shell, _originals
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _kubelet_restart, _service_restart, _unharden_node

WRITERS = ["nvidia_device_nodes", "containerd_nvidia_runtime", "kubelet_config"]
GONE_STATES = ("failed", "inactive")


def argument_spec():
    return {
        "root": {"type": "path", "default": "/"},
        "writers": {"type": "list", "elements": "str", "choices": WRITERS, "default": list(WRITERS)},
        "kubelet": {"type": "bool", "default": True},
        "force": {"type": "bool", "default": False},
        "keep_backups": {"type": "bool", "default": False},
        "checkpoints": {"type": "bool", "default": False},
        "defer_disruptive": {"type": "bool", "default": False},
        "restart": {"type": "str", "default": "never", "choices": ["never", "if_required"]},
        "stop_kubelet": {"type": "bool", "default": False},
        "kubelet_service": {"type": "str", "default": "auto"},
        "kubelet_health_url": _kubelet_restart.RESTART_SPEC["health_url"],
        "kubelet_health_timeout": _kubelet_restart.RESTART_SPEC["health_timeout"],
        "containerd_service": {"type": "str", "default": "containerd"},
        "containerd_ready_timeout": {"type": "int", "default": 30},
    }


def build_module():
    return AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)


def decide(params, writers=None):
    """Read the records and the files they name; return the plan (reads only)."""
    root = params["root"]
    records = _originals.load_records(root)
    current = {}
    for record in records:
        current[record["path"]] = _originals.read_text(_originals.host_path(root, record["path"]), root=root)
    return _originals.plan_restore(records, current, force=params["force"], writers=params["writers"] if writers is None else writers,
                                   keep_backups=params["keep_backups"], allow_checkpoints=params["checkpoints"])


def run(module):
    try:
        return restore(module)
    except OSError as error:
        # _originals reads and writes with plain os calls; the task still names the module and the file.
        raise GpuhardenError("unharden_files: %s: %s" % (error.filename or "a file", error.strerror or error)) from error


def plan_pass(params):
    """The plan of this pass, whether the kubelet's way back needs a drain, and the writers left for that pass."""
    writers = _unharden_node.requested_writers(params["writers"], params["kubelet"])
    plan = decide(params, writers)
    writers, deferred = _unharden_node.writers_now(writers, plan["disruptive"], params["defer_disruptive"])
    if deferred:
        plan = decide(params, writers)
        plan["disruptive"] = True  # still true of the kubelet's files, which the drained pass puts back
    return plan, deferred


def restore(module):
    params = module.params
    plan, deferred = plan_pass(params)
    changed = any(entry["changed"] for entry in plan["entries"])
    to_restart = _unharden_node.restarts(plan["services"], params["restart"], params["stop_kubelet"], module.check_mode)
    kubelet_service = None
    if "kubelet" in to_restart or (module.check_mode and "kubelet" in plan["services"] and params["restart"] == "if_required"):
        kubelet_service = _kubelet_service(params)
    for entry in plan["conflicts"]:
        module.warn("%s: %s" % (entry["path"], entry["reason"]))
    keys = ("path", "writer", "action", "reason", "forced", "backups_removed", "backups_kept")
    result = {
        "changed": changed,
        "files": [{key: entry[key] for key in keys} for entry in plan["entries"]],
        "conflicts": [{"path": entry["path"], "reason": entry["reason"]} for entry in plan["conflicts"]],
        "restart": plan["services"],
        "disruptive": plan["disruptive"],
        "deferred": deferred,
        "kubelet_service": kubelet_service,
        "backups_made": [],
        "restarts": [],
    }
    if module._diff:
        result["diff"] = _originals.diff(plan["entries"])
    if not module.check_mode:
        result["backups_made"] = _apply(module, plan, kubelet_service, result)
        for service in to_restart:
            result["changed"] = True
            waited = _restart(params, service, kubelet_service)
            result["restarts"].append(waited)
            if not waited["ready"]:
                raise GpuhardenError("unharden_files: %s (%s) did not come back after its restart: %s"
                                     % (service, waited["unit"], waited["error"]), **result)
    return result


def _kubelet_service(params):
    listing = ""
    if params["kubelet_service"] == "auto":
        _rc, listing, _err = _command.run(_unharden_node.kubelet_unit_listing_argv())
    return _unharden_node.kubelet_unit(params["kubelet_service"], listing)


def _apply(module, plan, kubelet_service, result):
    """Put the files back; with stop_kubelet, with the kubelet stopped, and started again when that fails."""
    if not module.params["stop_kubelet"]:
        return _originals.apply_restore(module, module.params["root"], plan)
    rc, out, err = _command.run(["systemctl", "stop", kubelet_service])
    if rc != 0:
        raise GpuhardenError("unharden_files: systemctl stop %s failed (rc %d): %s" % (kubelet_service, rc, (err or out).strip()),
                             **result)
    try:
        return _originals.apply_restore(module, module.params["root"], plan)
    except (GpuhardenError, OSError) as error:
        _command.run(["systemctl", "start", kubelet_service])
        raise GpuhardenError("unharden_files: kubelet files not put back (the kubelet %s started again): %s"
                             % (kubelet_service, getattr(error, "msg", None) or error), **result) from error


def _restart(params, service, kubelet_service):
    if service == "kubelet":
        waited = _kubelet_restart.restart_and_wait(_command.runner(params["kubelet_health_timeout"]), kubelet_service,
                                                   params["kubelet_health_url"], params["kubelet_health_timeout"])
        waited["ready"] = waited["error"] is None
        return dict(waited, service=service, unit=kubelet_service)
    unit = params["containerd_service"]
    run_command = _command.runner(params["containerd_ready_timeout"])

    def active(_deadline):
        _rc, out, _err = run_command(["systemctl", "is-active", unit])
        state = out.strip()
        if state in GONE_STATES:
            return False, state, "%s is %s after the restart (see its log: a configuration it cannot load?)" % (unit, state), True
        return state == "active", state, None if state == "active" else "%s is %s" % (unit, state or "unknown"), False

    waited = _service_restart.restart_and_wait(run_command, unit, active, params["containerd_ready_timeout"])
    return dict(waited, service=service, unit=unit)


def main():
    _module_shell.run_module(build_module(), run)


if __name__ == "__main__":
    main()
