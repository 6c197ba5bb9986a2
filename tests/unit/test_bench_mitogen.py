# SPDX-License-Identifier: GPL-3.0-or-later
"""Mitogen for Ansible as an opt-in (issue 45 item 7): the project's extra installs it, bench/mitogen_env.py's
environment enables it for one run, and that run really goes through its strategy with this ansible-core.

The strategy case runs where the extra is installed (``pip install -e '.[mitogen]'``) and skips, naming the extra,
elsewhere: Mitogen is not part of the dev extra, so that nobody's default run depends on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MITOGEN_ENV = REPO / "bench" / "mitogen_env.py"


def test_the_extra_names_the_measured_release_and_no_default_installs_it():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["mitogen"] == ["mitogen>=0.3.54,<0.4"]
    assert not any("mitogen" in requirement for name, requirements in extras.items() if name != "mitogen" for requirement in requirements)
    # enabled per run only: ansible.cfg names no strategy
    assert "strategy" not in (REPO / "ansible.cfg").read_text()


def test_without_the_extra_the_environment_names_it():
    code = "import sys; sys.modules['ansible_mitogen'] = None; sys.path.insert(0, %r); import mitogen_env; mitogen_env.main()" % str(
        MITOGEN_ENV.parent)
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert completed.returncode != 0
    assert "pip install -e '.[mitogen]'" in completed.stderr


def test_a_run_with_the_environment_goes_through_mitogens_strategy(tmp_path):
    pytest.importorskip("ansible_mitogen", reason="the mitogen extra is not installed: pip install -e '.[mitogen]'")
    exports = subprocess.run([sys.executable, str(MITOGEN_ENV)], capture_output=True, text=True, timeout=60, check=True).stdout
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    for line in exports.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = value.strip("'")
    assert env["ANSIBLE_STRATEGY"] == "mitogen_linear" and Path(env["ANSIBLE_STRATEGY_PLUGINS"], "mitogen_linear.py").is_file()
    playbook = tmp_path / "play.yml"
    # Under Mitogen a module runs in the interpreter Mitogen started (its argv names "mitogen:"), not in an AnsiballZ
    # wrapper's Python: the parent of the module's shell says which strategy ran it.
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n    - ansible.builtin.shell: ps -o args= -p $PPID\n"
                        "      register: parent\n    - ansible.builtin.debug: {var: parent.stdout}\n")
    command = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook)]
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable
    with_mitogen = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert with_mitogen.returncode == 0, with_mitogen.stdout[-2000:] + with_mitogen.stderr[-2000:]
    assert "(mitogen:" in with_mitogen.stdout
    without = {name: value for name, value in env.items() if name not in ("ANSIBLE_STRATEGY", "ANSIBLE_STRATEGY_PLUGINS")}
    plain = subprocess.run(command, env=without, capture_output=True, text=True, timeout=300, check=False)
    assert plain.returncode == 0 and "AnsiballZ_command.py" in plain.stdout and "(mitogen:" not in plain.stdout
