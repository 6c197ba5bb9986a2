# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The words the collection and the CLI share, written once (issue 45 item 3): the severity scale of every finding
and the harden stages in their order.

The CLI imports this very file: src/gpuharden/vocabulary.py is a symbolic link to it (the wheel and the sdist carry
its content), because the CLI runs without the collection for the commands that only read reports (report,
drift-merge).  So it imports nothing and holds only data.
"""

from __future__ import annotations

# Lowest first.  core/_findings.py refuses a finding of any other severity.
SEVERITIES = ("info", "warning", "error", "critical")
# The harden stages (each one tag of harden_gpu_nodes.yml and one role), in the order the playbooks run them
# (playbooks/tasks/stages.yml), then the post-check, which only reads.
STAGES = ("device_permissions", "container_runtime", "runtime_class", "kubelet_topology", "mig", "cgroup_limits", "device_plugin")
POSTCHECK = "postcheck"
