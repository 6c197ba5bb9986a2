# SPDX-License-Identifier: GPL-3.0-or-later
"""What `make dist` ships: the CLI's wheel and sdist without the lab, the collection tarball with what an adopter needs
and nothing of the development set-up.  Built once per module into a scratch directory (seconds; the Python build
fetches setuptools from PyPI), so what is checked is what this checkout builds now, never a stale dist/."""

from __future__ import annotations

import configparser
import json
import tarfile
import zipfile
from email.parser import Parser

import pytest
from packaging.requirements import Requirement

from tests.distfixtures import REPO, build

NODE_ONLY = {"nvidia-ml-py", "ruamel-yaml", "tomlkit"}
# The tarball's top level: everything else (tests, lab, tool configs, build outputs) is development set-up.
COLLECTION_TOP = {"MANIFEST.json", "FILES.json", "COPYING", "README.md", "CHANGELOG.md", "requirements-node.txt",
                  "plugins", "roles", "playbooks", "meta", "deploy", "docs", "inventories"}


def _canonical(name):
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    return build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def wheel(archives):
    with zipfile.ZipFile(archives.wheel) as archive:
        names = archive.namelist()
        info = next(name.rsplit("/", 1)[0] for name in names if name.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(info + "/METADATA").decode())
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(info + "/entry_points.txt").decode())
    return names, metadata, entry_points


@pytest.fixture(scope="module")
def collection(archives):
    with tarfile.open(archives.collection) as archive:
        names = [member.name for member in archive.getmembers() if member.isfile()]
        manifest = json.load(archive.extractfile("MANIFEST.json"))
    return names, manifest


def test_wheel_is_the_cli_without_the_lab(wheel):
    names, _, entry_points = wheel
    packages = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert packages == {"gpuharden"}, packages
    assert {"gpuharden/__init__.py", "gpuharden/cli.py", "gpuharden/drift.py"} <= set(names)
    assert not [name for name in names if "lab" in name.split("/")[0] or "scenario" in name], names
    # only the CLI itself: the lab's `gpuharden lab` plugs in from its own distribution
    assert {section: dict(entry_points[section]) for section in entry_points.sections()} == {
        "console_scripts": {"gpuharden": "gpuharden.cli:main"}}


def test_wheel_requires_no_node_packages_but_allows_ansible_core_2_19_and_2_20(wheel):
    _, metadata, _ = wheel
    requirements = [Requirement(line) for line in metadata.get_all("Requires-Dist")]
    base = {_canonical(req.name): req for req in requirements if req.marker is None}
    node = {_canonical(req.name) for req in requirements if req.marker and req.marker.evaluate({"extra": "node"})}
    assert {"ansible-core", "ansible-runner", "kubernetes", "pyyaml"} <= set(base), sorted(base)
    assert not NODE_ONLY & set(base), "node-only packages in the base requirements: %s" % sorted(NODE_ONLY & set(base))
    assert "gpuharden-lab" not in base
    assert node == NODE_ONLY | {"pyyaml"}, node  # PyYAML is in both: the CLI reads YAML, and mig_layout on the node
    assert "node" in metadata.get_all("Provides-Extra")
    core = base["ansible-core"].specifier
    assert all(core.contains(version) for version in ("2.19.0", "2.19.14", "2.20.0", "2.20.9")), core
    assert not any(core.contains(version) for version in ("2.18.9", "2.21.0")), core


def test_sdist_is_the_cli_without_the_lab(archives):
    with tarfile.open(archives.sdist) as archive:
        names = [member.name.split("/", 1)[1] for member in archive.getmembers() if "/" in member.name]
        top = {name.split("/")[0] for name in names}
        entry_points = next((archive.extractfile(member).read().decode() for member in archive.getmembers()
                             if member.name.endswith(".egg-info/entry_points.txt")), "")
    assert {"pyproject.toml", "src/gpuharden/cli.py", "src/gpuharden/drift.py"} <= set(names)
    assert top <= {"src", "pyproject.toml", "README.md", "COPYING", "PKG-INFO", "setup.cfg"}, top
    assert not [name for name in names if "gpuharden_lab" in name or "scenario" in name], names
    assert "gpuharden.commands" not in entry_points


def test_collection_ships_modules_roles_and_playbooks(collection):
    names, _ = collection
    assert {name for name in names if name.startswith("plugins/modules/")} == {
        "plugins/modules/%s" % path.name for path in (REPO / "plugins" / "modules").glob("*.py")}
    for role in (REPO / "roles").iterdir():
        assert "roles/%s/tasks/main.yml" % role.name in names, role.name
        assert "roles/%s/meta/argument_specs.yml" % role.name in names, role.name
    playbooks = {"playbooks/%s" % path.name for path in (REPO / "playbooks").glob("*.yml")}
    assert {"playbooks/harden_gpu_nodes.yml", "playbooks/drift_check.yml", "playbooks/bootstrap_gpu_node.yml",
            "playbooks/audit_node.yml", "playbooks/postcheck.yml"} <= playbooks
    assert playbooks <= set(names), sorted(playbooks - set(names))
    assert {"meta/runtime.yml", "deploy/rbac/gpuharden-rbac.yaml", "inventories/example/hosts.yml",
            "requirements-node.txt", "README.md"} <= set(names)


def test_collection_ships_nothing_of_the_development_setup(collection):
    names, manifest = collection
    top = {name.split("/")[0] for name in names}
    assert top <= COLLECTION_TOP, sorted(top - COLLECTION_TOP)
    assert {name.split("/")[1] for name in names if name.startswith("inventories/")} == {"example"}
    for unwanted in ("tests/", ".ansible-lint", "ansible.cfg", "inventories/localhost", "inventories/lab", "Makefile",
                     "lab/", "src/", "molecule/", "tools/", "bench/", "pyproject.toml", "execution-environment"):
        assert not [name for name in names if name.startswith(unwanted)], unwanted
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    info = manifest["collection_info"]
    # real project URLs or none
    assert not [key for key, value in info.items() if isinstance(value, str) and "example.invalid" in value]
