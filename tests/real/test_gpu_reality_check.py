# SPDX-License-Identifier: GPL-3.0-or-later
"""tools/gpu_reality_check.py: read-only by construction, and silent when both sides are the same double."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real.device_plugin import require_plugin, versions

pytestmark = pytest.mark.real

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_reality_check.py"
WRAPPER = TOOL.with_suffix(".sh")
REALITY = Path(__file__).resolve().parent / "reality"
READ_ONLY_SMI = {"-L", "-q", "--query-gpu"}


def tool():
    """tools/gpu_reality_check.py as a module."""
    sys.path.insert(0, str(TOOL.parent))
    import gpu_reality_check

    return gpu_reality_check


def test_the_tool_only_runs_read_only_things():
    """No nvidia-smi, no NVML setter, and only the read-only modules gpu_facts, nvml_check and node_audit."""
    source = TOOL.read_text()
    assert "nvidia-smi" not in source.replace("no nvidia-smi", "")
    assert not any(word in source for word in ("nvmlDeviceSet", "SetMigMode", "CreateGpuInstance", "nvmlDeviceReset"))
    modules = {
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "run_module"
        and isinstance(node.args[0], ast.Constant)
    }
    assert modules == {"gpu_facts", "nvml_check", "node_audit"}
    table = {"1g.18gb": {"instance_count": 7, "slices": 1}, "7g.141gb": {"instance_count": 1, "slices": 7}}
    args = tool().audit_args("/", {"0": {"table": table}})
    # node_audit is read-only unless it takes the run lock; the MIG layout is only planned.
    assert "lock" not in args and set(args) == {"root", "device_nodes", "nvml", "device_cgroups", "mig"}
    assert args["mig"] == {"layout": {"all": {"1g.18gb": 7}}, "strategy": "mixed"}


def test_the_wrapper_only_calls_read_only_nvidia_smi():
    """The bare-machine wrapper: nvidia-smi only with -L, -q or --query-gpu (no -r, -mig, -pm, -ac, -pl, -e, -c)."""
    code = "\n".join(line for line in WRAPPER.read_text().splitlines() if not line.lstrip().startswith("#"))
    calls = re.findall(r"(?<![-\w/])nvidia-smi(?![-\w.])((?: +-[-\w=.,]+)*)", code)
    assert calls
    for flags in calls:
        first = flags.split()[0].split("=")[0]
        assert first in READ_ONLY_SMI, flags
        assert all(flag.split("=")[0] in READ_ONLY_SMI | {"--format"} for flag in flags.split()), flags


def self_test(fixture, tmp_path, *options, version_key="NVIDIA_DEVICE_PLUGIN_VERSION"):
    if os.geteuid() != 0:
        pytest.skip("the tool runs as root")
    require_plugin(versions()[version_key])
    report = tmp_path / "report.json"
    p = subprocess.run([sys.executable, str(TOOL), "--self-test", fixture, "--json", str(report), *options],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    return p, json.loads(report.read_text())


@pytest.mark.parametrize("fixture", ["h100-mig-enabled", "l4", "h200-vm"])
def test_self_test_finds_no_disagreement(fixture, tmp_path):
    p, report = self_test(fixture, tmp_path)
    assert "nearest fixture: %s " % fixture in p.stderr
    parts = ("gpu_facts", "nvml_check", "node_audit", "device_plugin") + (("mig_profiles",) if fixture != "l4" else ())
    for part in parts:
        assert "== %s (real vs double %s): 0 value(s) differ" % (part, fixture) in p.stdout, p.stdout
    assert set(report["double"]) == set(parts)


def test_the_older_plugin_release_registers_with_a_stand_in_kubelet_and_agrees(tmp_path):
    """v0.15.x has no --kubelet-socket: the tool lets it register with dp-listwatch playing the kubelet."""
    p, report = self_test("h200-vm", tmp_path, "--plugin-version", "old", version_key="NVIDIA_DEVICE_PLUGIN_OLD_VERSION")
    assert report["plugin_version"] == versions()["NVIDIA_DEVICE_PLUGIN_OLD_VERSION"]
    assert "== device_plugin (real vs double h200-vm): 0 value(s) differ" in p.stdout
    for strategy, run in report["double"]["device_plugin"].items():
        assert run["resources"]["nvidia.com/gpu"]["count"] == 1 and run["errors"] == [], (strategy, run)


# Values a node root cannot match: the dynamic majors the real kernel handed out, and the cgroup version (a node root
# has no cgroup mount).
NODE_SPECIFIC = re.compile(r"^ansible_facts\.gpuharden\.(cgroup_version$|char_majors\.nvidia-(uvm|nvswitch|nvlink|caps)"
                           r"|device_nodes\./dev/nvidia-(uvm|caps/).*\.major$)")


def test_the_double_answers_as_the_real_h200(tmp_path):
    """The h200-vm fixture against what a real H200 answered (tests/real/reality/h200-vm.json, read with
    tools/gpu_reality_check.sh on 2026-12-04): the collection's modules, the MIG profile table (NVML answers it with
    MIG disabled) and the real device plugin's advertisement for each MIG strategy agree, UUID aside."""
    recorded = json.loads((REALITY / "h200-vm.json").read_text())["real"]
    fixture = json.loads((TOOL.parents[1] / "tests/fakes/nvml/fixtures/h200-vm.json").read_text())
    _p, report = self_test("h200-vm", tmp_path)
    double = json.loads(json.dumps(report["double"]).replace(fixture["gpus"][0]["uuid"], "GPU-REAL"))
    for part in ("gpu_facts", "nvml_check", "mig_profiles", "device_plugin"):
        rows = [row for row in tool().disagreements(recorded[part], double[part])
                if not NODE_SPECIFIC.match(row[0])]
        assert rows == [], part
