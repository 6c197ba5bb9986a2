# SPDX-License-Identifier: GPL-3.0-or-later
"""tools/gpu_reality_check.py: read-only by construction, and silent when both sides are the same double."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real.device_plugin import require_plugin, versions

pytestmark = pytest.mark.real

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_reality_check.py"


def test_the_tool_only_runs_read_only_things():
    """No nvidia-smi, no NVML setter, and only the read-only modules gpu_facts and nvml_check."""
    source = TOOL.read_text()
    assert "nvidia-smi" not in source.replace("no nvidia-smi", "")
    assert not any(word in source for word in ("nvmlDeviceSet", "SetMigMode", "CreateGpuInstance", "nvmlDeviceReset"))
    modules = {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "run_module"
        and isinstance(node.args[0], ast.Constant)
    }
    assert modules == {"gpu_facts", "nvml_check"}


@pytest.mark.parametrize("fixture", ["h100-mig-enabled", "l4"])
def test_self_test_finds_no_disagreement(fixture, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the tool runs as root")
    require_plugin(versions()["NVIDIA_DEVICE_PLUGIN_VERSION"])
    report = tmp_path / "report.json"
    p = subprocess.run([sys.executable, str(TOOL), "--self-test", fixture, "--json", str(report)],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    assert "nearest fixture: %s " % fixture in p.stderr
    for part in ("gpu_facts", "nvml_check", "device_plugin"):
        assert "== %s (real vs double %s): 0 value(s) differ" % (part, fixture) in p.stdout, p.stdout
    assert report.exists()
