# SPDX-License-Identifier: GPL-3.0-or-later
"""No deprecation noise from the tools gpuharden runs: an ansible command in this venv (what pyproject.toml installs:
ansible-core, and cryptography pinned below the release that deprecates DSA, which ansible-core imports at start-up)
prints no CryptographyDeprecationWarning, nor any other Python warning."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent


@pytest.mark.parametrize("command", [
    ["ansible", "localhost", "-c", "local", "-i", "localhost,", "-e", "ansible_python_interpreter=%s" % sys.executable, "-m", "ping"],
    ["ansible-playbook", "--version"],
    ["ansible-galaxy", "collection", "list", "gpuharden.k8s"],
])
def test_ansible_commands_print_no_python_warning(command, tmp_path):
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONWARNINGS",)}
    env["ANSIBLE_LOCALHOST_WARNING"] = "false"
    run = subprocess.run([str(VENV_BIN / command[0]), *command[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    output = run.stdout + run.stderr
    assert "DeprecationWarning" not in output and "Warning:" not in output, output[-3000:]
