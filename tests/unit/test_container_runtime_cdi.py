# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 43 item 9: CDI on containerd 1.7.

The device plugin's CDI strategies (cdi-annotations, cdi-cri) reach a container only through containerd's CDI support.
containerd 1.7 has it off (v1.7 pkg/cri/config/config_unix.go DefaultConfig: EnableCDI false) and then ignores every
container's CDI annotations and CDIDevices without an error (pkg/cri/server/container_create_linux.go: WithCDI only with
EnableCDI). So the container_runtime stage enables it wherever device_plugin_device_list_strategy names a CDI strategy,
and refuses to be told otherwise.  tests/real/test_containerd_real.py pins that the real containerd 1.7.35 loads the
written enable_cdi = true and reports CDI enabled.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import ansible_runner
import yaml

from tests.unit.test_role_preflight import ENV

CASES = {
    # case -> (variables, expected container_runtime_enable_cdi, expected refusal pieces or None)
    "the default strategy": ({}, False, None),
    "envvar": ({"device_plugin_device_list_strategy": ["envvar"]}, False, None),
    "cdi-cri": ({"device_plugin_device_list_strategy": ["cdi-cri"]}, True, None),
    "envvar and cdi-annotations": ({"device_plugin_device_list_strategy": ["envvar", "cdi-annotations"]}, True, None),
    "cdi-annotations, told false": ({"device_plugin_device_list_strategy": ["cdi-annotations"], "container_runtime_enable_cdi": False},
                                    False, ["container_runtime_enable_cdi=false", "cdi-annotations", "containerd 1.7"]),
    "envvar, told true": ({"container_runtime_enable_cdi": True}, True, None),
}


def test_enable_cdi_follows_the_plugins_cdi_strategies_and_false_is_refused_with_them(tmp_path):
    config = tmp_path / "containerd"
    config.mkdir()
    record = ("{{ {'outcome': outcome, 'enable_cdi': container_runtime_enable_cdi | bool,"
              " 'module_option': container_runtime_audit_options.enable_cdi | bool} | to_json }}")
    with tempfile.TemporaryDirectory() as tmp:
        plays = [{
            "hosts": "localhost", "gather_facts": False, "vars": dict(values, container_runtime_config=str(config / "config.toml")),
            "tasks": [{"block": [{"ansible.builtin.include_role": {"name": "gpuharden.k8s.container_runtime", "tasks_from": "preflight",
                                                                    "public": True}},
                                 {"ansible.builtin.set_fact": {"outcome": None}}],
                       "rescue": [{"ansible.builtin.set_fact": {"outcome": "{{ ansible_failed_result.msg }}"}}]},
                      {"ansible.builtin.copy": {"dest": str(Path(tmp) / ("%d.json" % index)), "content": record}}],
        } for index, (values, _enabled, _refusal) in enumerate(CASES.values())]
        (Path(tmp) / "pb.yml").write_text(yaml.safe_dump(plays))
        run = ansible_runner.run(private_data_dir=tmp, playbook=str(Path(tmp) / "pb.yml"), envvars=ENV, quiet=True,
                                 inventory="localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
        assert run.rc == 0, run.stdout.read()[-3000:]
        outcomes = {case: json.loads((Path(tmp) / ("%d.json" % index)).read_text()) for index, case in enumerate(CASES)}
    for case, (_values, enabled, refusal) in CASES.items():
        outcome = outcomes[case]
        assert outcome["enable_cdi"] is enabled and outcome["module_option"] is enabled, (case, outcome)
        if refusal is None:
            assert outcome["outcome"] is None, (case, outcome)
        else:
            assert outcome["outcome"] is not None and all(piece in outcome["outcome"] for piece in refusal), (case, outcome)
