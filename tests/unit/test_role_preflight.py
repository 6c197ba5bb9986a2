# SPDX-License-Identifier: GPL-3.0-or-later
"""The roles' preflights that check several rules in one task (roles/device_permissions and roles/postcheck,
tasks/preflight.yml): each names every rule a value breaks and passes the combinations its role accepts. One
ansible-playbook run on localhost per role, one play per case."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import ansible_runner
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENV = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
UNSET = {"device_permissions_owner": None, "device_permissions_group": None, "device_permissions_mode": None}
# case -> (policy and values, None when accepted, else the pieces its message names)
DEVICE_PERMISSIONS = {
    "default": ({"device_permissions_policy": "default"}, None),
    "default with a mode": ({"device_permissions_policy": "default", "device_permissions_mode": "0660"},
                            ["policy=default", "owner/group/mode null"]),
    "restricted without a group": ({"device_permissions_policy": "restricted"}, ["needs device_permissions_group", "group=None"]),
    "restricted, others may read": ({"device_permissions_policy": "restricted", "device_permissions_group": "video",
                                     "device_permissions_mode": "0664"}, ["a mode ending in 0", "mode=0664"]),
    "restricted": ({"device_permissions_policy": "restricted", "device_permissions_group": "video",
                    "device_permissions_mode": "0660"}, None),
    "custom without a mode": ({"device_permissions_policy": "custom"}, ["custom needs device_permissions_mode"]),
    "custom, not octal": ({"device_permissions_policy": "custom", "device_permissions_mode": "999"},
                          ["device_permissions_mode=999 is not a quoted octal mode"]),
    "two rules broken": ({"device_permissions_policy": "restricted", "device_permissions_group": "video",
                          "device_permissions_mode": "abc"}, ["a mode ending in 0", "mode=abc is not a quoted octal mode"]),
    "custom": ({"device_permissions_policy": "custom", "device_permissions_mode": "0666"}, None),
}
POSTCHECK_DEFAULTS = {"postcheck_nvml": True, "postcheck_topology": True, "postcheck_consistency": True,
                      "postcheck_expected_gpus": None, "postcheck_expected_mig_devices": None}
POSTCHECK = {
    "defaults": ({}, None),
    "topology without NVML": ({"postcheck_nvml": False, "postcheck_consistency": False}, ["set postcheck_nvml=true"]),
    "no NVML, nothing needs it": ({"postcheck_nvml": False, "postcheck_topology": False, "postcheck_consistency": False}, None),
    "counts": ({"postcheck_expected_gpus": 8, "postcheck_expected_mig_devices": "0"}, None),
    "a negative count": ({"postcheck_expected_gpus": -1}, ["postcheck_expected_gpus=-1", "whole numbers"]),
    "a fraction, and NVML off": ({"postcheck_expected_mig_devices": "1.5", "postcheck_nvml": False},
                                 ["set postcheck_nvml=true", "postcheck_expected_mig_devices=1.5"]),
}


def _outcomes(role, unset, cases):
    """{case: the preflight's message, or None where it passed}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        plays = [{
            "hosts": "localhost", "gather_facts": False, "vars": dict(unset, **values),
            "tasks": [{"block": [{"ansible.builtin.include_tasks": str(REPO / "roles" / role / "tasks/preflight.yml")},
                                 {"ansible.builtin.set_fact": {"outcome": None}}],
                       "rescue": [{"ansible.builtin.set_fact": {"outcome": "{{ ansible_failed_result.msg }}"}}]},
                      {"ansible.builtin.copy": {"dest": str(out / ("%d.json" % index)), "content": "{{ outcome | to_json }}"}}],
        } for index, (values, _expected) in enumerate(cases.values())]
        (Path(tmp) / "pb.yml").write_text(yaml.safe_dump(plays))
        run = ansible_runner.run(private_data_dir=tmp, playbook=str(Path(tmp) / "pb.yml"), envvars=ENV, quiet=True,
                                 inventory="localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
        assert run.rc == 0, run.stdout.read()[-3000:]
        return {case: json.loads((out / ("%d.json" % index)).read_text()) for index, case in enumerate(cases)}


@pytest.mark.parametrize(("role", "unset", "cases"), [("device_permissions", UNSET, DEVICE_PERMISSIONS),
                                                      ("postcheck", POSTCHECK_DEFAULTS, POSTCHECK)])
def test_preflight_names_every_broken_rule_and_passes_the_rest(role, unset, cases):
    outcomes = _outcomes(role, unset, cases)
    for case, (_values, expected) in cases.items():
        message = outcomes[case]
        if expected is None:
            assert message is None, (case, message)
        else:
            assert message is not None, case
            for piece in expected:
                assert piece in message, (case, piece, message)


def test_container_runtime_preflight_looks_for_the_unit_only_without_the_configuration_directory(tmp_path):
    """One stat where containerd's configuration directory is there; without it (and without a unit) the role stops
    with a message that names both."""
    present = tmp_path / "containerd"
    present.mkdir()
    record = "{{ {'outcome': outcome, 'unit_looked_for': __container_runtime_unit is not skipped} | to_json }}"
    cases = {
        "directory there": {"container_runtime_config": str(present / "config.toml")},
        "neither": {"container_runtime_config": str(tmp_path / "absent/config.toml"),
                    "container_runtime_service": "gpuharden-test-no-such-unit"},
    }
    with tempfile.TemporaryDirectory() as tmp:
        plays = [{
            "hosts": "localhost", "gather_facts": False, "vars": values,
            "tasks": [{"block": [{"ansible.builtin.include_role": {"name": "gpuharden.k8s.container_runtime", "tasks_from": "preflight"}},
                                 {"ansible.builtin.set_fact": {"outcome": None}}],
                       "rescue": [{"ansible.builtin.set_fact": {"outcome": "{{ ansible_failed_result.msg }}"}}]},
                      {"ansible.builtin.copy": {"dest": str(Path(tmp) / ("%d.json" % index)), "content": record}}],
        } for index, values in enumerate(cases.values())]
        (Path(tmp) / "pb.yml").write_text(yaml.safe_dump(plays))
        run = ansible_runner.run(private_data_dir=tmp, playbook=str(Path(tmp) / "pb.yml"), envvars=ENV, quiet=True,
                                 inventory="localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
        assert run.rc == 0, run.stdout.read()[-3000:]
        there, neither = (json.loads((Path(tmp) / ("%d.json" % index)).read_text()) for index in range(2))
    assert there == {"outcome": None, "unit_looked_for": False}
    assert neither["unit_looked_for"] is True
    assert "no %s and no gpuharden-test-no-such-unit.service" % (tmp_path / "absent") in neither["outcome"]
