# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The device plugin stage's decisions (controller side: the action gpuharden.k8s.device_plugin_stage, roles/device_plugin).

Two steps, each one task of the role (tasks/main.yml):

1. ``node`` (per host): whether the host is a GPU node (``gpu_node_known``: the role's device_plugin_gpu_node, else the
   driver's GPU list the run's GPU facts hold; only where neither says, a stat of the driver's GPU list on the node) and
   its Kubernetes node name (``node_part``).
2. ``apply`` (once for the play, on the controller): the GPU nodes labelled and the CPU-only ones unlabelled
   (``node_labels``) in the same gpuharden.k8s.device_plugin run that installs or repairs the plugin (``module_args``).

Everything here is pure: plain values in and out, no I/O.
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

# The NVIDIA driver lists one directory per GPU it drives here (the kernel module's procfs, nvidia/gpus/<bus id>): the
# directory exists where the driver is loaded with a GPU, the same fact gpu_facts' driver_gpus reads (core/_host.py).
DRIVER_GPUS = "/proc/driver/nvidia/gpus"
# The step node's answer (node_part), which it hands over on its host and the step apply takes from every host of the play
# (plugins/plugin_utils/_handover.py).
NODE_RESULT = "__device_plugin_node"


def as_bool(value, name):
    """A role variable read as the role's ``| bool`` read it; refused, naming it, where it is no boolean."""
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise GpuhardenError("%s=%r is not a boolean" % (name, value), fix="set %s to true or false" % name) from None


def gpu_node_known(gpu_node, facts):
    """(is_gpu, source) where the run already knows whether the host is a GPU node, else (None, None): the role's
    device_plugin_gpu_node, else the driver's GPU list the run's GPU facts hold (gpu_facts, or harden's plan through
    node_audit's facts option: driver_gpus is null where the driver shows none)."""
    if gpu_node is not None:
        return as_bool(gpu_node, "device_plugin_gpu_node"), "device_plugin_gpu_node"
    gathered = (facts or {}).get("gpuharden") if isinstance(facts, dict) else None
    if isinstance(gathered, dict) and "driver_gpus" in gathered:
        return gathered["driver_gpus"] is not None, "ansible_facts.gpuharden.driver_gpus"
    return None, None


def node_part(node_name, is_gpu, source):
    """What the step apply takes of this host."""
    if not isinstance(node_name, str) or not node_name:
        raise GpuhardenError("device_plugin_node_name=%r is not a Kubernetes node name" % (node_name,),
                             fix="set device_plugin_node_name (or gpuharden_k8s_node_name) to the host's Node name")
    return {"node_name": node_name, "gpu_node": bool(is_gpu), "source": source}


def parts_of(play_hosts, registered):
    """([node_part of each host, in the play's order], [hosts without one]): ``registered`` maps a host to what the
    step node registered there (None where it did not run: the host is then neither labelled nor unlabelled)."""
    parts, missing = [], []
    for host in play_hosts:
        part = registered.get(host)
        if isinstance(part, dict) and isinstance(part.get("node_name"), str) and "gpu_node" in part:
            parts.append(part)
        else:
            missing.append(host)
    return parts, missing


def node_labels(label_options, parts, label_nodes, unlabel_cpu_nodes):
    """device_plugin's node_labels option, or None where the role labels no node (device_plugin_label_nodes false):
    the label and taint of ``label_options`` on the GPU nodes, taken off the CPU-only ones where
    device_plugin_unlabel_cpu_nodes."""
    if not as_bool(label_nodes, "device_plugin_label_nodes"):
        return None
    unlabel = as_bool(unlabel_cpu_nodes, "device_plugin_unlabel_cpu_nodes")
    return dict(label_options,
                nodes=[part["node_name"] for part in parts if part["gpu_node"]],
                unlabel_nodes=[part["node_name"] for part in parts if not part["gpu_node"]] if unlabel else [])


def module_args(audit_options, kubeconfig, context, labels):
    """gpuharden.k8s.device_plugin's arguments: the role's options map (device_plugin_audit_options, the one harden's
    plan dry-runs), the cluster identity where given, and the node labels where the role labels."""
    args = dict(audit_options or {})
    if kubeconfig:
        args["kubeconfig"] = kubeconfig
    if context:
        args["context"] = context
    if labels is not None:
        args["node_labels"] = labels
    return args
