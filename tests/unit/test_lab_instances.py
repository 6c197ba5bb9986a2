# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden_lab.layout per instance: two labs at once share no name, address, port or path, and neither's prefix
matches the other's (lab down matches by prefix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = (
    "import json; from gpuharden_lab import layout as l; print(json.dumps({k: str(getattr(l, k)) for k in ("
    "'PREFIX', 'LAB_DIR', 'LOCK_FILE', 'INVENTORY_FILE', 'SUBNET_PREFIX', 'CGROUP_ROOT_NAME', 'BRIDGE', "
    "'ETCD_PORT', 'ETCD_PEER_PORT', 'API_PORT', 'KCM_PORT', 'SCHEDULER_PORT')}))"
)


def _layout(instance):
    env = {k: v for k, v in os.environ.items() if k not in ("GPUHARDEN_LAB_DIR", "GPUHARDEN_LAB_INSTANCE")}
    if instance is not None:
        env["GPUHARDEN_LAB_INSTANCE"] = instance
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=False, env=env)


def test_instance_zero_keeps_the_historical_names():
    names = json.loads(_layout(None).stdout)
    assert names == json.loads(_layout("0").stdout)
    assert names["PREFIX"] == "gpuhlab"
    assert names["LAB_DIR"] == "/var/tmp/gpuharden-lab"
    assert names["LOCK_FILE"] == "/var/tmp/gpuharden-lab.lock"
    assert names["INVENTORY_FILE"].endswith("inventories/lab/hosts.yml")
    assert (names["SUBNET_PREFIX"], names["API_PORT"]) == ("10.213.0.", "6443")


def test_instances_share_nothing():
    layouts = [json.loads(_layout(str(i)).stdout) for i in range(10)]
    ports = [int(lay[k]) for lay in layouts for k in ("ETCD_PORT", "ETCD_PEER_PORT", "API_PORT", "KCM_PORT", "SCHEDULER_PORT")]
    assert len(set(ports)) == len(ports)
    for key in ("PREFIX", "LAB_DIR", "LOCK_FILE", "INVENTORY_FILE", "SUBNET_PREFIX", "CGROUP_ROOT_NAME", "BRIDGE"):
        assert len({lay[key] for lay in layouts}) == 10, key
    for a in layouts:
        for b in layouts:
            if a is not b:
                assert not b["PREFIX"].startswith(a["PREFIX"])
                assert not (b["LAB_DIR"] + "/").startswith(a["LAB_DIR"] + "/")
    assert all(len(lay["BRIDGE"]) <= 15 and len(lay["PREFIX"] + "-h99") <= 15 for lay in layouts)  # IFNAMSIZ - 1


@pytest.mark.parametrize("value", ["10", "-1", "a", ""])
def test_a_bad_instance_is_refused_by_name(value):
    completed = _layout(value)
    assert completed.returncode != 0
    assert "GPUHARDEN_LAB_INSTANCE=%r" % value in completed.stderr
