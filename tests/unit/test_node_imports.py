# SPDX-License-Identifier: GPL-3.0-or-later
"""What a node compiles for one audit: node_audit imports the planners of the checks it may run, and no more.

Ansible ships every module_utils file the module names anywhere (tests/unit/test_module_payloads.py), but the node
compiles one, from the payload's zip and on every run, only when it is imported.  The MIG planners, the GPU facts
and the originals record are imported where they are used (a run asking for a MIG layout, for facts, a write), so
that the drift audit, which asks for none of them, does not pay for them.  Each case runs in a Python of its own:
this pytest process has imported them all already.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import COLLECTIONS

PREFIX = "ansible_collections.gpuharden.k8s.plugins.module_utils."
LAZY = ("node._mig", "nvml._mig_nvml", "nvml._gpu_facts", "core._originals")


def imported_after(statements):
    """The collection's module_utils (relative to PREFIX) a fresh Python has imported after ``statements``."""
    code = "import json, sys\n%s\nprint(json.dumps(sorted(m[len(%r):] for m in sys.modules if m.startswith(%r))))" % (
        statements, PREFIX, PREFIX)
    completed = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(COLLECTIONS)}, capture_output=True, text=True,
                               check=True, timeout=120)
    return set(json.loads(completed.stdout))


def test_the_audit_does_not_import_what_only_some_runs_use():
    loaded = imported_after("from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit")
    assert {"audit._node_audit", "node._kubelet", "node._containerd", "bpf._device_audit_node"} <= loaded
    assert loaded.isdisjoint(LAZY)


def test_the_mig_check_imports_its_planners_when_it_runs():
    loaded = imported_after("from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit\n"
                            "_node_audit._mig_spec(); _node_audit._mig_rules()")
    assert "nvml._mig_nvml" in loaded and "node._mig" in loaded
