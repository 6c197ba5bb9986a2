# SPDX-License-Identifier: GPL-3.0-or-later
"""The healthy scenario is a fresh install on real nodes, reached by the product's harden run (its `harden:` key),
without bringing a lab up: the running healthy lab is checked in tests/integration (TestHealthy in test_postcheck.py,
test_installed_artifacts.py, test_node_maintenance.py)."""

from __future__ import annotations

import pytest
import yaml
from gpuharden_lab import scenario
from gpuharden_lab.system import LabError

# What a fresh kubeadm install's kubelet config leaves unset (the kubelet's own defaults), and harden then sets.
MANAGED_BY_HARDEN = {"cpuManagerPolicy", "topologyManagerPolicy", "topologyManagerScope", "reservedSystemCPUs", "memoryThrottlingFactor"}


def test_healthy_nodes_start_as_fresh_real_installs_and_are_reached_by_harden():
    loaded = scenario.load("healthy")
    assert loaded.harden == {}
    assert {spec.name: spec.real_containerd for spec in loaded.nodes} == {"gpu-a100-0": "2", "gpu-h100-0": "1.7", "gpu-l4-0": "2"}
    assert loaded.cluster == {} and loaded.pods == []  # no plugin, RuntimeClass or ConfigMap: harden brings them
    for spec in loaded.nodes:
        config = yaml.safe_load(spec.files["/var/lib/kubelet/config.yaml"])
        assert not MANAGED_BY_HARDEN & set(config), (spec.name, config)
        assert "/var/lib/kubelet/cpu_manager_state" not in spec.files
        # containerd's config is the release's own default, written at `up` (realnode.default_containerd_config)
        assert "/etc/containerd/config.toml" not in spec.files


def test_scenarios_written_in_their_state_have_no_harden_run():
    assert scenario.load("seed-failures").harden is None
    assert scenario.load("real-nodes").harden is None  # fresh: the tests harden it themselves


@pytest.mark.parametrize("data, message", [
    ({"harden": ["device_plugin_version=v1"], "nodes": [{"name": "n0", "fixture": "l4", "real": {"containerd": "2"}}]},
     "'harden' must be a mapping"),
    # A harden run on stand-ins would only confirm what they were written to accept.
    ({"harden": {}, "nodes": [{"name": "n0", "fixture": "l4", "real": {"containerd": "2"}}, {"name": "n1", "fixture": "l4"}]},
     r"'harden' needs every node real .*\['n1'\]"),
])
def test_a_bad_harden_key_is_refused(tmp_path, monkeypatch, data, message):
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(scenario, "SCENARIO_DIR", tmp_path)
    with pytest.raises(LabError, match=message):
        scenario.load("broken")
