# SPDX-License-Identifier: GPL-3.0-or-later
"""Scenario keys for bare nodes (unschedulable, taints, python_missing), without bringing a lab up: the running
bare lab is checked in tests/integration/test_bootstrap.py."""

from __future__ import annotations

import pytest
import yaml
from gpuharden_lab import cluster, manager, scenario
from gpuharden_lab.node import Node, _dist_files, node_site_packages
from gpuharden_lab.system import LabError


def test_bare_scenario_nodes_join_cordoned_tainted_and_unconfigured():
    loaded = scenario.load("bare")
    assert [node.name for node in loaded.nodes] == ["bare-l4-0", "bare-dgx-lost-0"]
    assert loaded.cluster == {"objects": []}
    for spec in loaded.nodes:
        assert spec.unschedulable is True
        assert spec.taints == [{"key": "gpuharden.io/bootstrap", "value": "pending", "effect": "NoSchedule"}]
        assert spec.python_missing == ["nvidia-ml-py"]
        assert spec.labels == {}
        config = yaml.safe_load(spec.files["/var/lib/kubelet/config.yaml"])
        assert not {"cpuManagerPolicy", "topologyManagerPolicy", "topologyManagerScope", "reservedSystemCPUs"} & set(config)
        # containerd's config is the real release's own default (no nvidia runtime), written at `up`
        assert spec.real_containerd == "2" and "/etc/containerd/config.toml" not in spec.files
        assert "/var/lib/kubelet/cpu_manager_state" not in spec.files  # the real kubelet writes its own
        obj = cluster.node_object(Node(spec, 0), {"gpus": []})
        assert obj["spec"] == {"unschedulable": True, "taints": spec.taints}
        assert not {"gpuharden.io/hardened", "nvidia.com/gpu.present"} & set(obj["metadata"]["labels"])


def test_other_scenarios_keep_schedulable_untainted_nodes():
    for spec in scenario.load("healthy").nodes:
        assert (spec.unschedulable, spec.taints, spec.python_missing) == (False, [], [])
        assert cluster.node_object(Node(spec, 0), {"gpus": []})["spec"] == {}


@pytest.mark.parametrize("entry, message", [
    ({"taints": [{"key": "a"}]}, "'taints' must be a list"),
    ({"taints": "a:NoSchedule"}, "'taints' must be a list"),
    ({"python_missing": "nvidia-ml-py"}, "'python_missing' must be a list"),
])
def test_bad_bare_keys_are_refused(tmp_path, monkeypatch, entry, message):
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump({"nodes": [{"name": "n0", "fixture": "l4", **entry}]}))
    monkeypatch.setattr(scenario, "SCENARIO_DIR", tmp_path)
    with pytest.raises(LabError, match=message):
        scenario.load("broken")


@pytest.mark.lab
def test_whiteouts_cover_what_nvidia_ml_py_installed():
    manager.ensure_node_python()  # what `lab up` builds first (pip install: the lab stage, not the unit suite)
    site_packages = node_site_packages()
    assert site_packages is not None
    hidden = _dist_files(site_packages, "nvidia-ml-py")
    assert "pynvml.py" in hidden
    assert any(path.startswith("nvidia_ml_py-") and path.endswith(".dist-info") for path in hidden)
    with pytest.raises(LabError, match="no distribution"):
        _dist_files(site_packages, "no-such-distribution")
