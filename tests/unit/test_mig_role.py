# SPDX-License-Identifier: GPL-3.0-or-later
"""Role mig end to end through ansible-playbook on localhost, on the NVML double (issue 45: the apply's steps moved from
Jinja into the action gpuharden.k8s.mig_stage): check mode changes nothing, a layout change is applied once and a second
run skips it, a busy GPU's pending mode change is reset by mig_reset_command and applied again, and without a reset
method the host fails with the line that names the GPUs.  No drain and no plugin restart (no cluster here: mig_drain and
mig_restart_device_plugin off), and the device_permissions tag skipped (it would repair this machine's /dev)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import ansible_runner
import pytest
import yaml
from gpuharden_lab import REPO_ROOT
from gpuharden_lab.noderoot import build_node_root

ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
CTL = REPO_ROOT / "tests/fakes/nvml/nvml_double_ctl.py"
# GPU0 keeps its 7x 1g.10gb, GPU1 goes to 3x 2g.20gb, GPU2 to 2x 3g.40gb, GPU3 stays without MIG (as tests/integration/test_mig.py)
LAYOUT = {"0": {"1g.10gb": 7}, "1": {"2g.20gb": 3}, "2": {"3g.40gb": 2}, "3": "disabled"}
TASKS = ("MIG | plan (no NVML mutation)", "MIG | apply the layout", "MIG | reset the GPUs whose mode change is pending",
         "MIG | reboot to finish the pending mode change", "MIG | apply again after the reset", "MIG | cordon and drain the node",
         "MIG | uncordon the node", "MIG | restart the node's device plugin pods, which would go on advertising the old layout",
         "MIG | make the device nodes of the new instances' capabilities (the device_permissions stage again)")


@pytest.fixture
def node(world_tmp, nvml_library):
    return build_node_root(world_tmp / "node", "h100-mig-enabled")


def ctl(node, *args):
    return subprocess.run([sys.executable, str(CTL), *args, "--state", str(node.state_file), "--fixture", str(node.fixture)],
                          capture_output=True, text=True, check=False)


def play(node, variables, check=False):
    """{rc, tasks: {name: (event, result)}, mig_result}: one run of the role on localhost."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "mig_result.json"
        playbook = [{"hosts": "localhost", "gather_facts": False, "environment": node.env(),
                     "vars": dict({"mig_drain": False, "mig_restart_device_plugin": False}, **variables),
                     "tasks": [{"ansible.builtin.include_role": {"name": "gpuharden.k8s.mig"}},
                               {"ansible.builtin.copy": {"dest": str(out), "content": "{{ mig_result | to_json }}", "mode": "0644"},
                                "check_mode": False}]}]
        (Path(tmp) / "pb.yml").write_text(yaml.safe_dump(playbook))
        run = ansible_runner.run(private_data_dir=tmp, playbook=str(Path(tmp) / "pb.yml"), envvars=ENV, quiet=True,
                                 cmdline="--skip-tags device_permissions" + (" --check" if check else ""),
                                 inventory="localhost ansible_connection=local ansible_python_interpreter=%s" % sys.executable)
        tasks = {event["event_data"]["task"]: (event["event"], event["event_data"].get("res") or {}) for event in run.events
                 if event.get("event") in ("runner_on_ok", "runner_on_skipped", "runner_on_failed")}
        return {"rc": run.rc, "tasks": tasks, "mig_result": json.loads(out.read_text()) if out.exists() else None,
                "stdout": run.stdout.read()[-4000:]}


def outcome(report, name):
    event, _result = report["tasks"][name]
    return event.replace("runner_on_", "")


def test_check_mode_then_apply_then_nothing_to_do(node):
    ctl(node, "show")  # the double writes its state file on first use
    checked = play(node, {"mig_layout": LAYOUT}, check=True)
    assert checked["rc"] == 0, checked["stdout"]
    before = node.state_file.read_bytes()
    assert [outcome(checked, name) for name in TASKS[:5]] == ["ok", "ok", "skipped", "skipped", "ok"]
    assert checked["tasks"]["MIG | apply the layout"][1]["changed"] is True
    assert checked["mig_result"]["changed"] is True and checked["mig_result"]["after"]["2"] == {"mig_enabled": True, "mig_devices": {"3g.40gb": 2}}
    assert node.state_file.read_bytes() == before  # check mode: the double's MIG state is byte-identical

    applied = play(node, {"mig_layout": LAYOUT})
    assert applied["rc"] == 0, applied["stdout"]
    result = applied["tasks"]["MIG | apply the layout"][1]
    assert result["changed"] is True and result["reset_required"] is False and result["reset"] is False
    assert applied["mig_result"]["after"] == result["after"]
    reapply = applied["tasks"]["MIG | apply again after the reset"][1]
    assert reapply["changed"] is False and reapply["follow_up"] == {"device_nodes": False, "restart_device_plugin": False}
    # mig_drain off: no drain, no uncordon; the device_permissions tag skipped: no device nodes again
    assert [outcome(applied, name) for name in TASKS[5:]] == ["skipped"] * 4

    again = play(node, {"mig_layout": LAYOUT})
    assert again["rc"] == 0, again["stdout"]
    assert outcome(again, "MIG | apply the layout") == "skipped" and again["tasks"]["MIG | plan (no NVML mutation)"][1]["changed"] is False
    assert again["mig_result"]["disruptive"] is False  # the plan, the last step that ran


def test_a_busy_gpu_s_pending_mode_change_is_reset_and_applied_again(node):
    layout = dict(LAYOUT, **{"3": {"1g.10gb": 7}})
    assert ctl(node, "set-processes", "--gpu", "3", "--json", '[{"pid": 4711, "used_memory_mib": 64}]').returncode == 0
    stopped = play(node, {"mig_layout": layout, "mig_force": True, "mig_reset_method": "none"})
    assert stopped["rc"] != 0
    event, result = stopped["tasks"]["MIG | apply the layout"]
    assert event == "runner_on_failed" and result["changed"] is True
    assert result["msg"].startswith("MIG mode change pending on 00000000:5D:00.0: reset these GPUs") and "(mig_reset_method is none)" in result["msg"]

    # the command sees the bus ids the apply left pending in mig_gpus_to_reset (as the default nvidia-smi -r -i <bus ids>)
    told = node.root / "reset-told"
    reset = ["sh", "-c", 'echo "$1" > %s && exec "$0" "$2" reset --state "$3" --fixture "$4" --gpu 3 --force' % told,
             sys.executable, "{{ mig_gpus_to_reset | default([]) | join(',') }}", str(CTL), str(node.state_file), str(node.fixture)]
    report = play(node, {"mig_layout": layout, "mig_force": True, "mig_reset_command": reset})
    assert report["rc"] == 0, report["stdout"]
    assert told.read_text() == "00000000:5D:00.0\n"
    assert report["tasks"]["MIG | apply the layout"][1]["gpus_to_reset"] == ["00000000:5D:00.0"]
    assert outcome(report, "MIG | reset the GPUs whose mode change is pending") == "ok"
    assert report["tasks"]["MIG | reset the GPUs whose mode change is pending"][1]["changed"] is True
    final = report["tasks"]["MIG | apply again after the reset"][1]
    assert final["reset_required"] is False and final["after"]["3"] == {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}}
    assert report["mig_result"]["after"]["3"] == {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}}
    assert play(node, {"mig_layout": layout})["tasks"]["MIG | plan (no NVML mutation)"][1]["changed"] is False
