# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The node's own Python environment for gpuharden's node-side modules (a venv, so PEP 668 systems work).

A distribution that marks its Python externally managed (an ``EXTERNALLY-MANAGED`` file in the stdlib directory,
PEP 668: Debian 12, Ubuntu 23.04 and later) makes ``pip install`` into that Python fail.  A venv is outside that rule
(pip's ``check_externally_managed`` returns at once in a virtual environment), so the node gets one, with the
packages the node-side modules import, from an index or from wheels copied to the node.

What is installed is read from the venv itself: its ``importlib.metadata`` for the versions, and the requirement
parser pip carries (``pip._vendor.packaging``), so the check needs neither the network nor a package the system
Python may lack.  ``plan`` decides from that; ``run`` reads, plans and applies (nothing in check mode).
"""

from __future__ import annotations

import json
import os
import sys

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _command
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

CREATE_TIMEOUT = 300
READ_TIMEOUT = 60
INSTALL_TIMEOUT = 900

# Runs in the venv's Python: for each requirement (argv[1], a JSON list), the installed version and whether it fits.
_READ_SCRIPT = r"""
import json, sys
from importlib import metadata
from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
out = []
for line in json.loads(sys.argv[1]):
    try:
        req = Requirement(line)
    except InvalidRequirement as error:
        out.append({"requirement": line, "invalid": str(error)})
        continue
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        version = None
    out.append({"requirement": line, "installed": version,
                "satisfied": version is not None and req.specifier.contains(version, prereleases=True)})
print(json.dumps(out))
"""


def venv_python(path):
    return os.path.join(path, "bin", "python3")


def create_argv(python, path):
    return [python, "-m", "venv", path]


def read_argv(path, packages):
    return [venv_python(path), "-c", _READ_SCRIPT, json.dumps(list(packages))]


def install_argv(path, packages, index_url="", find_links=""):
    """pip install into the venv: from ``find_links`` only (an air-gapped node's wheels), else from ``index_url``,
    else from pip's own configuration (its default index, or the node's pip.conf)."""
    argv = [venv_python(path), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    if find_links:
        argv += ["--no-index", "--find-links", find_links]
    elif index_url:
        argv += ["--index-url", index_url]
    return argv + list(packages)


def parse_read(stdout, path):
    """The read script's answer: [{requirement, installed, satisfied}]; an invalid requirement is the caller's error."""
    try:
        states = json.loads(stdout)
    except ValueError:
        raise GpuhardenError("node_venv: %s answered no package list (%r)" % (venv_python(path), stdout[-200:]),
                             fix="remove %s and run again" % path) from None
    invalid = [state for state in states if "invalid" in state]
    if invalid:
        raise GpuhardenError("node_venv: packages: %r is not a pip requirement (%s)" % (invalid[0]["requirement"], invalid[0]["invalid"]),
                             fix="write it as pip does, for example nvidia-ml-py>=12.535,<14")
    return states


def plan(exists, states, packages):
    """What to do: create the venv (it has no Python yet), and which requirements to install (all of them into a new
    venv, else the ones not installed or at a version outside their specifier)."""
    if not exists:
        return {"create": True, "install": list(packages)}
    return {"create": False, "install": [state["requirement"] for state in states if not state["satisfied"]]}


def _tail(text, lines=5):
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _check(rc, out, err, what, fix):
    if rc != 0:
        raise GpuhardenError("node_venv: %s failed (rc %s): %s" % (what, rc, _tail(err or out)), fix=fix)


def run(params, check_mode, run_command=_command.run, exists=os.path.exists):
    path, packages = params["path"], params["packages"]
    if not os.path.isabs(path) or os.path.normpath(path) == "/":
        raise GpuhardenError("node_venv: path: %r is not an absolute directory below /" % path, fix="give the venv's directory, e.g. /opt/gpuharden/venv")
    if not packages:
        raise GpuhardenError("node_venv: packages: the list is empty", fix="list the node packages (the gpuharden[node] extra)")
    python = params.get("python") or sys.executable
    present = exists(venv_python(path))
    states = []
    if present:
        rc, out, err = run_command(read_argv(path, packages), timeout=READ_TIMEOUT)
        _check(rc, out, err, "reading the packages of %s" % path, "remove the broken venv %s and run again" % path)
        states = parse_read(out, path)
    actions = plan(present, states, packages)
    if not check_mode:
        if actions["create"]:
            rc, out, err = run_command(create_argv(python, path), timeout=CREATE_TIMEOUT)
            _check(rc, out, err, "%s -m venv %s" % (python, path),
                   "install the distribution's venv package for %s (Debian/Ubuntu: python3-venv) and run again" % python)
        if actions["install"]:
            rc, out, err = run_command(install_argv(path, actions["install"], params.get("index_url") or "", params.get("find_links") or ""),
                                       timeout=INSTALL_TIMEOUT)
            _check(rc, out, err, "pip install into %s" % path,
                   "let the node reach the index (index_url), or give it wheels for every package and its dependencies "
                   "(pip download -d DIR on a machine with the node's Python version and architecture)")
    changed = actions["create"] or bool(actions["install"])
    return {
        "changed": changed,
        # the venv holds every package now (false only in check mode, when something was still to do)
        "ready": not (check_mode and changed),
        "python": venv_python(path),
        "created": actions["create"],
        "installed": actions["install"],
        "packages": states,
    }
