# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.

from __future__ import annotations


class ModuleDocFragment:
    # The gpu_operator option of the node modules whose stage the NVIDIA GPU Operator may own (module_utils/node/
    # _gpu_operator.py argument()).
    DOCUMENTATION = r"""
options:
  gpu_operator:
    description:
      - What the NVIDIA GPU Operator runs on this node, as the controller read it from the ClusterPolicy
        (C(harden_gpu_nodes.yml) and C(drift_check.yml) pass it from their plan), and which stages gpuharden takes over
        from it.
      - The node's own layout is read in any case, without the API; either is enough for a stage to defer.
    type: dict
    suboptions:
      toolkit:
        description:
          - Why the operator's container toolkit runs here (the ClusterPolicy, its field and the node's
            C(nvidia.com/gpu.deploy.container-toolkit) label), or V(null).
        type: str
      driver:
        description: The same for the operator's driver container (C(nvidia.com/gpu.deploy.driver)), or V(null).
        type: str
      mig_manager:
        description: The same for the operator's MIG manager (C(nvidia.com/gpu.deploy.mig-manager)), or V(null).
        type: str
      toolkit_dir:
        description:
          - Where the operator's toolkit installs its runtime (the ClusterPolicy's C(spec.toolkit.installDir) followed by
            C(/toolkit)). A containerd runtime whose C(BinaryName) lies here, or the C(nvidia-container-runtime) in it,
            shows the operator's toolkit on the node.
        type: path
        default: /usr/local/nvidia/toolkit
      driver_root:
        description:
          - Where the operator's driver container serves the driver (the ClusterPolicy's C(spec.hostPaths.driverInstallDir)).
            A non-empty directory here, or C(/run/nvidia/validations/.driver-ctr-ready), shows the driver container.
        type: path
        default: /run/nvidia/driver
      error:
        description:
          - Why the controller could not read the ClusterPolicy, or V(null). The part is then reported as not checked
            (the node's own layout still is).
        type: str
      takeover:
        description:
          - The stages gpuharden takes over from the operator (C(gpuharden_operator_takeover)). A stage listed here acts
            with a warning; one the operator owns and that is not listed changes nothing and returns C(refused).
        type: list
        elements: str
        choices: [container_runtime, device_permissions, mig]
        default: []
"""
