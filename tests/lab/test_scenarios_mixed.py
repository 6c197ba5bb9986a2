# SPDX-License-Identifier: GPL-3.0-or-later
"""mixed-fleet is mixed (its own module: the seed-failures lab of test_scenarios holds the lab lock until that module ends)."""

from __future__ import annotations

import pytest
from gpuharden_lab import cluster, manager
from kubernetes import client

from tests.labfixtures import running_lab

pytestmark = pytest.mark.lab


def test_mixed_fleet():
    with running_lab("mixed-fleet") as state:
        address = state["nodes"]["l4-k3s-0"]["address"]
        result = manager.ssh(address, "systemctl is-active k3s-agent && curl -sf http://127.0.0.1:10248/healthz")
        assert result.stdout.split() == ["active", "ok"]
        cpu = manager.ssh(state["nodes"]["cpu-0"]["address"], "ls /dev/nvidia* 2>/dev/null | wc -l; ls /proc/driver/nvidia 2>&1 | wc -l")
        assert cpu.stdout.split()[0] == "0"
        labels = client.CoreV1Api(cluster.api_client(state["cluster"]["admin_kubeconfig"])).read_node("cpu-0").metadata.labels
        assert "nvidia.com/gpu.present" not in labels
