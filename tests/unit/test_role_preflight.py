# SPDX-License-Identifier: GPL-3.0-or-later
"""roles/device_permissions/tasks/preflight.yml: one task checks every rule of the policy and its owner, group and
mode, names each rule a value breaks, and passes the combinations the role accepts. One ansible-playbook run on
localhost, one play per case."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import ansible_runner
import yaml

REPO = Path(__file__).resolve().parents[2]
ENV = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
UNSET = {"device_permissions_owner": None, "device_permissions_group": None, "device_permissions_mode": None}
# case -> (policy and values, None when accepted, else the pieces its message names)
CASES = {
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


def test_device_permissions_preflight_names_every_broken_rule_and_passes_the_rest():
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        plays = [{
            "hosts": "localhost", "gather_facts": False, "vars": dict(UNSET, **values),
            "tasks": [{"block": [{"ansible.builtin.include_tasks": str(REPO / "roles/device_permissions/tasks/preflight.yml")},
                                 {"ansible.builtin.set_fact": {"outcome": None}}],
                       "rescue": [{"ansible.builtin.set_fact": {"outcome": "{{ ansible_failed_result.msg }}"}}]},
                      {"ansible.builtin.copy": {"dest": str(out / ("%d.json" % index)), "content": "{{ outcome | to_json }}"}}],
        } for index, (values, _expected) in enumerate(CASES.values())]
        (Path(tmp) / "pb.yml").write_text(yaml.safe_dump(plays))
        run = ansible_runner.run(private_data_dir=tmp, playbook=str(Path(tmp) / "pb.yml"), envvars=ENV, quiet=True,
                                 inventory="localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
        assert run.rc == 0, run.stdout.read()[-3000:]
        for index, (case, (_values, expected)) in enumerate(CASES.items()):
            message = json.loads((out / ("%d.json" % index)).read_text())
            if expected is None:
                assert message is None, (case, message)
            else:
                assert message is not None, case
                for piece in expected:
                    assert piece in message, (case, piece, message)
