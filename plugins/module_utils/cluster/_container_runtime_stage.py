# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The container runtime stage's decisions (roles/container_runtime, playbooks/tasks/stage_container_runtime.yml), pure.

The action plugins gpuharden.k8s.container_runtime_stage and gpuharden.k8s.container_runtime_wave read the role's and
the play's variables, run the modules, and ask this module:

* ``decide(settings, host, run_module)``: the role's one write on a node: is containerd there at all (its
  configuration directory, else its unit; one stat in the common case), containerd_nvidia_runtime with the role's
  options, the facts the RuntimeClass reads (``facts``), and the host's failure where containerd did not come back
  after the restart (``rollback_failure``);
* ``wave_host(...)``: whether this host's containerd stage runs in this step of the run's canary and waves, or the
  host fails because the restarts stopped before its turn.
"""

from __future__ import annotations

import posixpath

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _stage_steps

CONTAINERD = "gpuharden.k8s.containerd_nvidia_runtime"
STAT = "ansible.legacy.stat"
# Where systemd reads a unit from, the administrator's first (systemd.unit(5), "Unit File Load Path", system mode).
UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")
# The role's variables the write reads (roles/container_runtime/defaults and vars).
SETTINGS = ("container_runtime_config", "container_runtime_service", "container_runtime_backup", "container_runtime_restart",
            "container_runtime_ready_timeout", "container_runtime_audit_options")


def unit_paths(service):
    """The unit files of ``service`` that would show containerd is installed where its configuration directory is not."""
    return ["%s/%s.service" % (directory, service) for directory in UNIT_DIRS]


def not_installed(config, service, host):
    """Why the role stops before any write on a node without containerd."""
    return ("container_runtime: no %s and no %s.service on %s; install containerd before adding the NVIDIA runtime."
            % (posixpath.dirname(config), service, host))


def module_args(settings, restart):
    """containerd_nvidia_runtime's options: the role's options map (what the audit checks, the same builder), and the
    write's own: the backup, the restart and its wait."""
    return dict(settings["container_runtime_audit_options"], backup=settings["container_runtime_backup"],
                restart="if_required" if restart else "never", service=settings["container_runtime_service"],
                ready_timeout=int(settings["container_runtime_ready_timeout"]))


def facts(runtime_name, restart_required=False):
    """The facts the RuntimeClass check reads from every host of the play (hostvars): the handler, and whether a restart
    is still pending (container_runtime_restart false)."""
    return {"container_runtime_handler": runtime_name, "container_runtime_restart_required": bool(restart_required)}


def rollback_failure(service, result):
    """The host's failure where the write's restart left containerd not serving (the module then put the files back and
    restarted it once more), naming the files, containerd's reason and how the second restart went; None otherwise."""
    readiness = result.get("readiness") or {}
    if not result.get("restarted") or readiness.get("ready"):
        return None
    rollback = result.get("rollback") or {}
    again = rollback.get("readiness") or {}
    after = ("it serves again" if again.get("ready")
             else "it does not come back either (%s): see its log" % (again.get("error") or ""))
    return ("%s did not come back with the new configuration (%s): %s. The files were put back as they were (%s) and %s "
            "restarted with them: %s." % (service, ", ".join(change.get("path", "") for change in result.get("changes") or ()),
                                          readiness.get("error"), ", ".join(rollback.get("restored") or ()), service, after))


def decide(settings, host, restart, run_module):
    """The write's result: containerd_nvidia_runtime's, with ``ansible_facts`` (``facts``), failed with the reason where
    containerd is not installed (nothing else runs) or did not come back after the restart. ``run_module(name, args)``
    runs a module on the node."""
    config, service = settings["container_runtime_config"], settings["container_runtime_service"]
    if not _exists(run_module, posixpath.dirname(config)) and not any(_exists(run_module, path) for path in unit_paths(service)):
        return {"failed": True, "changed": False, "msg": not_installed(config, service, host)}
    result = run_module(CONTAINERD, module_args(settings, restart))
    if result.get("failed"):
        return result
    result["ansible_facts"] = facts(result.get("runtime_name"), bool(result.get("restart_required")) and not restart)
    failure = rollback_failure(service, result)
    if failure:
        result.update(failed=True, msg=failure)
    return result


def _exists(run_module, path):
    return bool((run_module(STAT, {"path": path, "get_checksum": False}).get("stat") or {}).get("exists"))


def wave_host(step, runs, node, not_started, host):
    """This host's part of one step of the containerd restarts (``step``: one of harden_rollout's restart_steps, or None:
    every node at once): ``{"run": bool, "reason": str}``, or ``{"failed": True, "msg": ...}`` where the step's gate
    stopped the restarts (``not_started``: harden_rollout's wave step's, by host)."""
    if host in (not_started or {}):
        return {"failed": True, "msg": not_started[host]}
    # the one rule, which tasks/stages.yml's first step also applies to every step (its container_runtime_here)
    run, reason = _stage_steps.restarts_here(step, runs, node)
    return {"run": run, "reason": reason}
