#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Documentation only: the action plugin plugins/action/cluster_stage_gate.py does the work, on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: cluster_stage_gate
short_description: Decide once for the play whether harden runs a cluster-side stage
version_added: 0.1.0
description:
  - Reads the plans of the play's hosts (M(gpuharden.k8s.node_stages), registered as C(gpuharden_node_plan)) and the
    dry runs of the plan's one LIST of the GPU pods, and returns whether the C(harden_gpu_nodes.yml) stage named in
    O(stage) runs.
  - C(runtime_class) runs unless the dry run of it would change and report nothing and no node of the serial batch
    has its containerd stage to run. C(harden_gpu_nodes.yml) decides it with its fleet read instead
    (M(gpuharden.k8s.harden_rollout) with C(step=restarts), the same code).
  - C(device_plugin) runs unless every node's dry run of it is clean, no node-side stage runs on any node, no host
    sets C(gpuharden_gpu_node) and every node's facts show its GPUs; never after a failed step of the rollout (a
    node left with its kubelet stopped would hold the plugin's rolling update).
  - Runs on the controller only and contacts no host; use it with C(run_once=true), delegated to localhost.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.INFO_MODULE
options:
  stage:
    description: The cluster-side stage to decide.
    type: str
    required: true
    choices: [runtime_class, device_plugin]
attributes:
  action:
    support: full
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
"""

EXAMPLES = r"""
- name: Whether the device plugin stage runs (decided once, for the play)
  gpuharden.k8s.cluster_stage_gate:
    stage: device_plugin
  delegate_to: localhost
  run_once: true
  register: harden_device_plugin_gate
"""

RETURN = r"""
run:
  description: Whether the stage runs.
  returned: success
  type: bool
  sample: false
why:
  description: Why, in words.
  returned: success
  type: str
  sample: the plan's dry run of it would change and report nothing, and no node-side stage ran
"""
