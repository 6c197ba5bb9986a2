# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Defaults that several places share, written once (issue 45 item 3): the modules' argument specs take them from
here, and so does the settings table (core/_settings.py), from which the roles' defaults are generated.

A module's DOCUMENTATION repeats its default as text (ansible-test sanity's validate-modules compares the two), and
the docs name them; those are docs, not a second setting.  This file imports nothing, so it costs a node-side payload
a few lines.
"""

from __future__ import annotations

# The NVIDIA device plugin release (image tag) gpuharden installs unless told otherwise.
DEVICE_PLUGIN_VERSION = "v0.20.0"
# The RuntimeClass gpuharden manages, which the device plugin's pods name as runtimeClassName.
RUNTIME_CLASS_NAME = "nvidia"
# containerd's runtime for NVIDIA GPUs (the toolkit's name for it), which the RuntimeClass names as its handler.
NVIDIA_RUNTIME_NAME = "nvidia"
# The entries the kubelet takes in enforceNodeAllocatable (kubernetes v1.36.3 pkg/kubelet/types/constants.go; its
# validation refuses any other): the kubelet_config module's check and the cgroup_limits role's choices.
ENFORCE_NODE_ALLOCATABLE = ("pods", "system-reserved", "kube-reserved", "system-reserved-compressible", "kube-reserved-compressible", "none")
