# SPDX-License-Identifier: GPL-3.0-or-later
"""Role node_prerequisites' decisions (module_utils/cluster/_node_prerequisites_plan.py, action
gpuharden.k8s.node_prerequisites): its tasks made them in Jinja before issue 45.  Each decision: a case that fires and
one that must not."""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _node_prerequisites_plan as plan

ROLE = Path(__file__).resolve().parents[2] / "roles" / "node_prerequisites"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def test_the_planner_reads_the_roles_variables_and_only_them():
    assert set(plan.READ) == set(DEFAULTS)


def test_from_the_index_no_wheels_are_copied():
    decided = plan.plan(DEFAULTS)
    assert decided["copy"] is None
    assert decided["venv_args"] == {"path": "/opt/gpuharden/venv", "packages": DEFAULTS["node_prerequisites_packages"], "index_url": ""}
    # no system Python given: node_venv's own default (the Python Ansible runs on the node), not an empty string
    assert "python" not in decided["venv_args"] and "find_links" not in decided["venv_args"]


def test_wheels_are_copied_into_their_directory_and_installed_from_there_alone():
    decided = plan.plan(dict(DEFAULTS, node_prerequisites_wheels="/srv/wheels/", node_prerequisites_wheels_dest="/var/lib/w",
                             node_prerequisites_system_python="/usr/bin/python3.11", node_prerequisites_index_url="https://pypi.example/simple"))
    assert decided["copy"] == {"src": "/srv/wheels/", "dest": "/var/lib/w/", "owner": "root", "group": "root", "mode": "0644",
                               "directory_mode": "0755"}
    assert decided["venv_args"]["find_links"] == "/var/lib/w" and decided["venv_args"]["python"] == "/usr/bin/python3.11"
    assert decided["venv_args"]["index_url"] == "https://pypi.example/simple"  # node_venv ignores it with find_links

