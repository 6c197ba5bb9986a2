# SPDX-License-Identifier: GPL-3.0-or-later
"""The cgroup_limits preflight's enforceNodeAllocatable rules, judged by the kubelet's own validation.

kubelet-validate (lab/controlplane, built against k8s.io/kubernetes v1.36.3) runs the kubelet's config loader and
validation (pkg/kubelet/apis/config/validation/validation.go) on a file.  For every list of one or two entries (and
each entry twice), with and without the reservations' cgroups, the preflight refuses exactly what the validation
refuses, plus one rule the validation does not hold: an enforced reservation needs its amount, or the kubelet fails
when it starts enforcing it (pkg/kubelet/cm/node_container_manager_linux.go enforceExistingCgroup: "cgroup is not
configured properly" for a nil ResourceList).
"""

from __future__ import annotations

import itertools

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _role_preflight as rules
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._defaults import ENFORCE_NODE_ALLOCATABLE

from tests.fuzz.validators import KUBELET_DECODER_REFUSES, KUBELET_VALIDATE_REFUSES, kubelet_validate_exit

LISTS = [list(pair) for size in (1, 2) for pair in itertools.combinations(ENFORCE_NODE_ALLOCATABLE, size)]
LISTS += [[entry, entry] for entry in ENFORCE_NODE_ALLOCATABLE] + [["pods", "kube"]]
CGROUPS = {"with cgroups": {"kubeReservedCgroup": "/kube.slice", "systemReservedCgroup": "/system.slice"}, "without cgroups": {}}


def validation_refuses(tmp_path, fields):
    text = yaml.safe_dump({"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "cgroupDriver": "systemd", **fields})
    exit_code = kubelet_validate_exit(tmp_path, text)
    assert exit_code != KUBELET_DECODER_REFUSES, "the case itself does not decode: %s" % text
    return exit_code == KUBELET_VALIDATE_REFUSES


def preflight_lines(enforced, cgroups, amounts):
    return rules.cgroup_limits({
        "cgroup_limits_factor": 0.9, "cgroup_limits_enforce_node_allocatable": enforced,
        "cgroup_limits_kube_reserved": {"cpu": "1"} if amounts else {}, "cgroup_limits_system_reserved": {"memory": "1Gi"} if amounts else {},
        "cgroup_limits_kube_reserved_cgroup": cgroups.get("kubeReservedCgroup", ""),
        "cgroup_limits_system_reserved_cgroup": cgroups.get("systemReservedCgroup", ""),
    })


@pytest.mark.parametrize("cgroups", sorted(CGROUPS))
@pytest.mark.parametrize("enforced", LISTS, ids=[",".join(entries) for entries in LISTS])
def test_the_preflight_refuses_what_the_kubelet_refuses(tmp_path, enforced, cgroups):
    fields = {"enforceNodeAllocatable": enforced, "kubeReserved": {"cpu": "1"}, "systemReserved": {"memory": "1Gi"}, **CGROUPS[cgroups]}
    kubelet_refuses = validation_refuses(tmp_path, fields)
    lines = preflight_lines(enforced, CGROUPS[cgroups], amounts=True)
    assert bool(lines) == kubelet_refuses, (enforced, cgroups, lines)
    assert all(line.startswith("cgroup_limits_enforce_node_allocatable=") for line in lines)


@pytest.mark.parametrize("entry", ["kube-reserved", "kube-reserved-compressible", "system-reserved", "system-reserved-compressible"])
def test_an_enforced_reservation_without_its_amount_is_refused(entry):
    assert preflight_lines([entry], CGROUPS["with cgroups"], amounts=True) == []
    (line,) = preflight_lines([entry], CGROUPS["with cgroups"], amounts=False)
    assert "enforces %s without its amount or cgroup" % entry in line
