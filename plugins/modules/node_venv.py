#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_venv
short_description: Give a node a Python venv with the packages gpuharden's node-side modules import
version_added: 0.1.0
description:
  - Creates the venv O(path) with O(python)'s C(venv) module when it has no Python yet, and installs into it with its
    own pip the O(packages) it lacks or holds at a version outside their specifier. A venv is outside PEP 668, so this
    works on a distribution whose Python is externally managed (Debian 12, Ubuntu 23.04 and later), where
    C(pip install) into the system Python fails with C(externally-managed-environment).
  - Installs from the wheels in O(find_links) alone (C(--no-index), for an air-gapped node), else from O(index_url),
    else from pip's own configuration on the node.
  - What is installed is read from the venv (C(importlib.metadata), and pip's own requirement parser), so a run with
    nothing to do needs no network and reports C(changed=false).
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads the venv's packages and reports what it would create and install.
  diff_mode:
    support: none
options:
  path:
    description:
      - The venv's directory on the node (absolute).
    type: path
    default: /opt/gpuharden/venv
  python:
    description:
      - The Python that creates the venv (the venv runs this Python's version). Omitted, the Python that runs this module.
    type: path
  packages:
    description:
      - pip requirements, for example V(nvidia-ml-py>=12.535,<14) (the C(node) extra of the gpuharden distribution).
    type: list
    elements: str
    required: true
  index_url:
    description:
      - The package index to install from (pip's C(--index-url)). Empty uses pip's configuration on the node.
    type: str
    default: ""
  find_links:
    description:
      - A directory on the node holding wheels of every package and its dependencies; pip installs from it alone
        (C(--no-index --find-links)). Empty installs from the index.
    type: path
notes:
  - Needs the distribution's C(venv) support for O(python) (Debian and Ubuntu package it as C(python3-venv)).
"""

EXAMPLES = r"""
- name: Give the node the packages of gpuharden's node-side modules, from the index
  gpuharden.k8s.node_venv:
    packages: ["nvidia-ml-py>=12.535,<14", "ruamel.yaml>=0.18,<0.20", "tomlkit>=0.13,<0.16", "PyYAML>=6,<7"]

- name: The same on an air-gapped node, from wheels copied to it
  gpuharden.k8s.node_venv:
    path: /opt/gpuharden/venv
    packages: ["nvidia-ml-py>=12.535,<14", "ruamel.yaml>=0.18,<0.20", "tomlkit>=0.13,<0.16", "PyYAML>=6,<7"]
    find_links: /opt/gpuharden/wheels
"""

RETURN = r"""
python:
  description: The venv's Python, for C(ansible_python_interpreter) of the node-side tasks.
  returned: success
  type: str
  sample: /opt/gpuharden/venv/bin/python3
ready:
  description: Whether the venv holds every package now (false only in check mode when something was still to do).
  returned: success
  type: bool
created:
  description: Whether the venv was (or in check mode would be) created.
  returned: success
  type: bool
installed:
  description: The requirements installed (or in check mode to install).
  returned: success
  type: list
  elements: str
packages:
  description: Each requirement as the venv held it before this run (C(requirement), C(installed) version or null, C(satisfied)); empty for a new venv.
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _node_venv


def build_module():
    return AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/opt/gpuharden/venv"},
            "python": {"type": "path"},
            "packages": {"type": "list", "elements": "str", "required": True},
            "index_url": {"type": "str", "default": ""},
            "find_links": {"type": "path"},
        },
        supports_check_mode=True,
    )


def main():
    _module_shell.run_module(build_module(), lambda module: _node_venv.run(module.params, module.check_mode))


if __name__ == "__main__":
    main()
