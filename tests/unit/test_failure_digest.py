# SPDX-License-Identifier: GPL-3.0-or-later
"""tools/failure_digest.py: what `make test` prints last when a part failed (CI keeps only the tail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "failure_digest.py"

# As molecule prints a converge: ANSI colours and a box-drawing frame around ansible-playbook's own output.
MOLECULE_CONVERGE = """\
\x1b[2m\u2502\x1b[0m TASK [gpuharden.k8s.container_runtime : Ensure containerd has the NVIDIA
\x1b[2m\u2502\x1b[0m   runtime] ***
\x1b[2m\x1b[33m\u2502\x1b[0m \x1b[0;33mchanged: [gpu-l4-0]\x1b[0m
\x1b[2m\u2502\x1b[0m TASK [Probe that may fail] ***
\x1b[2m\u2502\x1b[0m [ERROR]: Task failed: Module failed: probe said no
\x1b[2m\x1b[31m\u2502\x1b[0m \x1b[0;31mfatal: [gpu-l4-0]: FAILED! => \x1b[0m
\x1b[2m\x1b[31m\u2502\x1b[0m \x1b[0;31m    msg: probe said no\x1b[0m
\x1b[2m\u2502\x1b[0m ...ignoring
\x1b[2m\u2502\x1b[0m TASK [gpuharden.k8s.postcheck : Postcheck | fail the host on findings at or above the threshold] ***
\x1b[2m\u2502\x1b[0m [ERROR]: Task failed: Action failed: 1 finding(s) at or above error on gpu-a100-0: gpu_not_advertised
\x1b[2m\x1b[31m\u2502\x1b[0m \x1b[0;31mfatal: [gpu-a100-0]: FAILED! => \x1b[0m
\x1b[2m\x1b[31m\u2502\x1b[0m \x1b[0;31m    assertion: __postcheck_failing | length == 0\x1b[0m
\x1b[2m\x1b[31m\u2502\x1b[0m \x1b[0;31m    msg: '1 finding(s) at or above error on gpu-a100-0: gpu_not_advertised'\x1b[0m
\x1b[2m\u2502\x1b[0m
\x1b[2m\u2502\x1b[0m PLAY RECAP ****
"""

PYTEST_TAIL = """\
E         fatal: [real-c17-0]: FAILED! =>
E             msg: 'the kubelet did not become healthy'
E
=========================== short test summary info ============================
FAILED tests/integration/test_mig.py::test_busy_gpu_pending_mode_is_reset_by_the_role - assert 2 == 0
ERROR tests/integration/test_drift.py::test_report - LabError: up failed
"""


def digest(tmp_path, **logs):
    paths = []
    for name, text in logs.items():
        path = tmp_path / name
        path.write_text(text)
        paths.append(str(path))
    return subprocess.run([sys.executable, str(TOOL), *paths, str(tmp_path / "absent.log")],
                          capture_output=True, text=True, check=True).stdout


def test_a_failed_task_is_named_with_its_message_and_an_ignored_one_is_not(tmp_path):
    out = digest(tmp_path, converge=MOLECULE_CONVERGE)
    lines = out.splitlines()
    assert lines[0] == "=== what failed, from %s" % (tmp_path / "converge")
    assert lines[1] == "task [gpuharden.k8s.postcheck : Postcheck | fail the host on findings at or above the threshold]"
    assert "  [ERROR]: Task failed: Action failed: 1 finding(s) at or above error on gpu-a100-0: gpu_not_advertised" in lines
    assert "  msg: '1 finding(s) at or above error on gpu-a100-0: gpu_not_advertised'" in lines
    assert "probe said no" not in out and "\x1b" not in out and "\u2502" not in out


def test_pytest_summaries_and_the_results_in_their_output_are_kept(tmp_path):
    lines = digest(tmp_path, lab=PYTEST_TAIL).splitlines()
    assert "  msg: 'the kubelet did not become healthy'" in lines
    assert "FAILED tests/integration/test_mig.py::test_busy_gpu_pending_mode_is_reset_by_the_role - assert 2 == 0" in lines
    assert "ERROR tests/integration/test_drift.py::test_report - LabError: up failed" in lines


def test_a_clean_log_prints_nothing(tmp_path):
    assert digest(tmp_path, clean="TASK [x] ***\nok: [h]\n\nPLAY RECAP ***\n1 passed in 3.0s\n") == ""
