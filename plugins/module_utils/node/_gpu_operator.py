# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""What the NVIDIA GPU Operator owns on a node, and the node stages that defer to it.

Where the operator runs the container toolkit, the driver or the MIG manager on a node, its DaemonSets rewrite what
gpuharden's container_runtime, device_permissions and mig stages would change: each such stage reports a refusal
(``{what, why, fix}``) and changes nothing, unless the stage is named in ``takeover`` (``gpuharden_operator_takeover``).

Two sources, either of which is enough:

* the controller's reading of the ClusterPolicy (``cluster/_gpu_operator_policy.py``), passed down in the
  ``gpu_operator`` option as one line per component that names the ClusterPolicy, its field and the node's label;
* the node's own layout, read here without the API:

  - the toolkit container installs the runtime under ``<spec.toolkit.installDir>/toolkit``, ``/usr/local/nvidia/toolkit``
    by default (NVIDIA/gpu-operator v26.7.0 ``controllers/object_controls.go`` DefaultToolkitInstallDir
    ``/usr/local/nvidia``; NVIDIA/nvidia-container-toolkit v1.20.0 ``cmd/nvidia-ctk-installer/main.go`` toolkitSubDir
    ``toolkit``), and points containerd's runtimes ``nvidia``, ``nvidia-cdi`` and ``nvidia-legacy`` at
    ``nvidia-container-runtime``, ``nvidia-container-runtime.cdi`` and ``.legacy`` there
    (``cmd/nvidia-ctk-installer/container/operator/operator.go`` GetRuntimes), in the drop-in
    ``/etc/containerd/conf.d/99-nvidia.toml`` (``cmd/nvidia-ctk-installer/container/runtime/containerd/containerd.go``
    DefaultDropInConfig; gpu-operator ``object_controls.go`` DefaultContainerdDropInConfigFile);
  - the driver container mounts its root at ``/run/nvidia/driver`` (gpu-operator ``object_controls.go``
    DefaultDriverInstallDir; ``assets/state-driver/0500_daemonset.yaml`` mounts ``/run/nvidia`` with Bidirectional
    propagation) and, once ready, leaves ``/run/nvidia/validations/.driver-ctr-ready`` (``cmd/nvidia-validator/main.go``
    driverContainerStatusFilePath).  An empty ``/run/nvidia/driver`` is no evidence: the toolkit's and the MIG
    manager's DaemonSets create it (hostPath DirectoryOrCreate, ``assets/state-container-toolkit/0500_daemonset.yaml``)
    on nodes whose driver is installed on the host too;
  - the MIG manager leaves nothing of its own on the node: only the ClusterPolicy tells.
"""

from __future__ import annotations

import os

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _host

TOOLKIT_DIR = "/usr/local/nvidia/toolkit"
DRIVER_ROOT = "/run/nvidia/driver"
DRIVER_READY = "/run/nvidia/validations/.driver-ctr-ready"
# The runtimes the operator's toolkit writes (operator.go GetRuntimes: nvidia and one per mode, cdi and legacy)
TOOLKIT_RUNTIMES = ("nvidia", "nvidia-cdi", "nvidia-legacy")

# node stage -> (the controller's key for the component that owns it, what the component is called, what it does with
# what the stage would change, how to change that through the operator instead)
STAGES = {
    "container_runtime": ("toolkit", "container toolkit",
                          "its pod writes the drop-in again whenever it starts, so a change here would be reverted and fight the operator",
                          "configure the runtime through the ClusterPolicy (spec.toolkit, spec.cdi)"),
    "device_permissions": ("driver", "driver container",
                           "it loads the nvidia module with its own modprobe options (the host's modprobe.d does not apply) and the "
                           "operator's validator makes the device nodes and /dev/char links",
                           "set the driver's options through the ClusterPolicy (spec.driver)"),
    "mig": ("mig_manager", "MIG manager",
            "it applies the layout the node's nvidia.com/mig.config label names, so a layout set here would be reverted",
            "choose the layout through the MIG manager (the node label nvidia.com/mig.config, the ClusterPolicy's "
            "spec.migManager.config)"),
}
TAKEOVER_VARIABLE = "gpuharden_operator_takeover"
RBAC_FIX = ("grant gpuharden's identity get/list on clusterpolicies.nvidia.com and on nodes (deploy/rbac/gpuharden-rbac.yaml); "
            "the node's own layout was still checked")


def argument():
    """The ``gpu_operator`` option of the node modules and of node_audit (the same dict for every stage)."""
    return {"type": "dict", "apply_defaults": True, "options": {
        "toolkit": {"type": "str"},
        "driver": {"type": "str"},
        "mig_manager": {"type": "str"},
        "toolkit_dir": {"type": "path", "default": TOOLKIT_DIR},
        "driver_root": {"type": "path", "default": DRIVER_ROOT},
        "error": {"type": "str"},
        "takeover": {"type": "list", "elements": "str", "default": [], "choices": sorted(STAGES)},
    }}


def options(params):
    """The validated ``gpu_operator`` option, with its defaults where a caller (a unit test) left it out."""
    given = params.get("gpu_operator") or {}
    merged = {"toolkit": None, "driver": None, "mig_manager": None, "toolkit_dir": TOOLKIT_DIR, "driver_root": DRIVER_ROOT,
              "error": None, "takeover": []}
    merged.update({key: value for key, value in given.items() if value is not None})
    return merged


def under_dir(path, directory):
    return isinstance(path, str) and os.path.normpath(path).startswith(os.path.normpath(directory).rstrip("/") + "/")


def toolkit_layout(root, toolkit_dir, runtimes):
    """What shows the operator's toolkit on the node: ``runtimes`` is every (file, runtime name, BinaryName) containerd's
    config files define; a runtime that runs a binary under ``toolkit_dir``, or the toolkit's runtime binary there."""
    evidence = ["%s defines runtime %r with BinaryName %s" % (path, name, binary)
                for path, name, binary in runtimes if under_dir(binary, toolkit_dir)]
    installed = os.path.join(toolkit_dir, "nvidia-container-runtime")
    if os.path.lexists(_host.host_path(root, installed)):
        evidence.append("%s exists (the operator's toolkit container installs there)" % installed)
    return evidence


def driver_layout(root, driver_root):
    """What shows the operator's driver container on the node: a non-empty driver root, or its ready file."""
    evidence = []
    real = _host.host_path(root, driver_root)
    try:
        entries = sorted(os.listdir(real)) if os.path.isdir(real) else []
    except OSError:
        entries = []
    if entries:
        evidence.append("%s holds the driver container's root (%s)" % (driver_root, ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")))
    if os.path.lexists(_host.host_path(root, DRIVER_READY)):
        evidence.append("%s exists (the driver container is ready)" % DRIVER_READY)
    return evidence


def decide(stage, what, evidence, params):
    """(refused, not_checked, warnings) for ``stage`` on this node: ``evidence`` is what the node shows (toolkit_layout,
    driver_layout), the controller's claim comes from the ``gpu_operator`` option.  Refused: the operator owns the part
    and the stage is not taken over; not_checked: the controller could not read the ClusterPolicy (the node's layout was
    read); a warning where a taken-over stage acts on what the operator owns."""
    operator = options(params)
    key, component, consequence, through = STAGES[stage]
    claim = operator.get(key)
    reasons = ([claim] if claim else []) + list(evidence)
    not_checked = []
    if operator.get("error") and not reasons:
        not_checked.append({"what": "whether the GPU Operator's ClusterPolicy runs the %s on this node" % component,
                            "cause": operator["error"], "fix": RBAC_FIX})
    if not reasons:
        return [], not_checked, []
    if stage in operator["takeover"]:
        return [], not_checked, ["%s: taken over from the GPU Operator's %s (%s names %s), although %s; the operator puts its own "
                                 "back whenever its pod starts unless you disable the %s in the ClusterPolicy"
                                 % (what, component, TAKEOVER_VARIABLE, stage, "; ".join(reasons), component)]
    why = "the NVIDIA GPU Operator's %s owns it: %s. %s" % (component, "; ".join(reasons), consequence[0].upper() + consequence[1:])
    fix = ("%s; or disable the %s in the ClusterPolicy and let gpuharden take the stage over (%s: [%s])"
           % (through, component, TAKEOVER_VARIABLE, stage))
    return [{"what": what, "why": why, "fix": fix}], not_checked, []


def warnings(refused, not_checked):
    """The warnings a module gives for what it refused and what it could not check, one line each."""
    return (["%s: not changed (refused): %s. Fix: %s" % (entry["what"], entry["why"], entry["fix"]) for entry in refused]
            + ["%s: not checked: %s. Fix: %s" % (entry["what"], entry["cause"], entry["fix"]) for entry in not_checked])
