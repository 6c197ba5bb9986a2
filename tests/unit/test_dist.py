# SPDX-License-Identifier: GPL-3.0-or-later
"""What `make dist` ships: the CLI's wheel and sdist without the lab, the collection tarball with what an adopter needs
and nothing of the development set-up.  Built once per module into a scratch directory (seconds; the Python build
fetches setuptools from PyPI), so what is checked is what this checkout builds now, never a stale dist/."""

from __future__ import annotations

import configparser
import io
import json
import re
import shutil
import subprocess
import tarfile
import zipfile
from email.parser import Parser

import pytest
from packaging.requirements import Requirement

from tests.distfixtures import REPO, build
from tools import dist

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
    # the build's project URL over galaxy.yml's placeholder; nothing else of .invalid
    assert {key: info[key] for key in ("repository", "documentation", "homepage")} == dict.fromkeys(
        ("repository", "documentation", "homepage"), dist.TEST_URL)
    assert not [key for key, value in info.items() if isinstance(value, str) and ".invalid" in value and dist.TEST_URL not in value]


def test_collection_ships_no_developer_docs_and_no_dead_links(archives, collection):
    names, _ = collection
    assert {"docs/collection.md", "docs/upgrading.md", "docs/uninstall.md"} <= set(names)
    assert not {"docs/development.md", "docs/benchmarks.md"} & set(names)
    assert dist.tarball_problems(archives.collection) == []
    with tarfile.open(archives.collection) as archive:
        readme = archive.extractfile("README.md").read().decode()
        units = archive.extractfile("deploy/systemd/gpuharden-drift.service").read().decode()
        rules = archive.extractfile("deploy/monitoring/gpuharden-alerts.yml").read().decode()
    # the README's relative links point at the project's sources: the developer docs are not shipped, and Galaxy
    # renders the README away from the files
    assert "](%s/blob/main/docs/development.md)" % dist.TEST_URL in readme
    assert "](%s/blob/main/docs/collection.md)" % dist.TEST_URL in readme
    assert "Documentation=%s\n" % dist.TEST_URL in units
    runbooks = set(re.findall(r'runbook_url: "([^"]*)"', rules))
    assert runbooks == {dist.TEST_URL + "#troubleshooting"}, runbooks


def test_tarball_check_finds_the_placeholder_a_developer_doc_and_a_dead_link(tmp_path):
    tarball = tmp_path / "bad.tar.gz"
    with tarfile.open(tarball, "w:gz") as archive:
        for name, text in {"README.md": "see [dev](docs/development.md) and [up](#top)",
                           "docs/upgrading.md": "[x](uninstall.md#a) [y](../README.md) [z](https://example.org/)",
                           "docs/development.md": "", "galaxy.yml": "repository: %s\n" % dist.PLACEHOLDER}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            archive.addfile(info, io.BytesIO(text.encode()))
    problems = dist.tarball_problems(tarball)
    assert problems == ["galaxy.yml: the placeholder https://gpuharden.invalid (make dist GPUHARDEN_URL=...)",
                        "docs/development.md: a developer doc (galaxy.yml build_ignore)",
                        "README.md: its relative link docs/development.md is dead where Galaxy renders it",
                        "docs/upgrading.md: its link uninstall.md#a names no file of the tarball"], problems


@pytest.mark.parametrize(("url", "test_build", "message"), [
    ("", False, "hold the placeholder https://gpuharden.invalid: set GPUHARDEN_URL"),
    ("ftp://example.org/x", False, "GPUHARDEN_URL=ftp://example.org/x: not an http(s) URL"),
    ("https://example.invalid/gpuharden", False, "the .invalid domain never resolves"),
    ("", True, "hold the placeholder"),
])
def test_dist_refuses_a_missing_or_placeholder_url(url, test_build, message):
    with pytest.raises(dist.DistError, match=re.escape(message)):
        dist.check_url(url, test_build)


def test_dist_accepts_a_real_url_and_a_test_url_only_for_a_test_build():
    assert dist.check_url("https://github.com/org/gpuharden/", False) == "https://github.com/org/gpuharden"
    assert dist.check_url(dist.TEST_URL, True) == dist.TEST_URL


@pytest.mark.parametrize(("remote", "url"), [
    ("https://github.com/org/gpuharden.git", "https://github.com/org/gpuharden"),
    ("git@github.com:org/gpuharden.git", "https://github.com/org/gpuharden"),
    ("ssh://git@gitlab.example.com/infra/gpuharden", "https://gitlab.example.com/infra/gpuharden"),
    ("/srv/git/gpuharden", None),
    ("file:///srv/git/gpuharden", None),
    ("", None),
])
def test_a_clone_of_a_public_remote_gets_its_url(remote, url):
    assert dist.origin_url(remote) == url


def test_staging_refuses_an_invalid_url_left_in_a_file(tmp_path):
    source = tmp_path / "source"
    (source / "deploy").mkdir(parents=True)
    (source / "galaxy.yml").write_text("build_ignore: [skipped]\nrepository: %s\n" % dist.PLACEHOLDER)
    (source / "deploy" / "unit.service").write_text("Documentation=https://example.invalid/gpuharden\n")
    (source / "skipped").write_text("https://other.invalid/\n")
    with pytest.raises(dist.DistError, match=re.escape("deploy/unit.service: https://example.invalid/gpuharden")) as error:
        dist.stage(tmp_path / "staged", "https://example.org/g", "https://example.org/g/blob/main", source=source)
    assert "other.invalid" not in str(error.value)
    (source / "deploy" / "unit.service").write_text("Documentation=%s#readme\n" % dist.PLACEHOLDER)
    staged = dist.stage(tmp_path / "staged2", "https://example.org/g", "https://example.org/g/blob/main", source=source)
    assert staged == ["deploy/unit.service", "galaxy.yml"]
    assert (tmp_path / "staged2" / "deploy" / "unit.service").read_text() == "Documentation=https://example.org/g#readme\n"


def _make_rules():
    """{target: prerequisites} of the Makefile, as `make -p` (GNU make's database) prints them."""
    database = subprocess.run(["make", "-pRrq", "-f", str(REPO / "Makefile"), "-C", str(REPO), "dist"],
                              capture_output=True, text=True, check=False).stdout
    rules = {}
    for line in database.splitlines():
        match = re.match(r"^([A-Za-z0-9_./-]+):(?!=)\s*(.*)$", line)
        if match and not line.startswith(("#", "\t")):
            rules.setdefault(match.group(1), set()).update(word for word in match.group(2).replace("|", " ").split())
    return rules


def test_make_dist_needs_the_build_tools_only():
    rules = _make_rules()
    needed, todo = set(), ["dist"]
    while todo:
        target = todo.pop()
        if target not in needed:
            needed.add(target)
            todo.extend(rules.get(target, ()))
    assert {"python-dist", "collection-build", "dist-url-check", "build/dist-venv/.installed"} <= needed, sorted(needed)
    # never the development venv (pytest, molecule, ansible-lint, ansible-builder)
    assert not {"venv", ".venv/.installed", "setup"} & needed, sorted(needed)
    wanted = {re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0].lower() for requirement in dist.requirements()}
    assert wanted == {"setuptools", "wheel", "build", "ansible-core", "cryptography"}, wanted


def test_the_documented_runbook_sed_keeps_the_rule_tests_green(tmp_path):
    """deploy/monitoring/README.md's sed, run over the rules and their tests, gives every alert the new runbook, and
    promtool's unit tests of the rules still pass."""
    readme = (REPO / "deploy" / "monitoring" / "README.md").read_text()
    script = re.search(r"`sed -i '([^']+)' gpuharden-alerts.yml`", readme).group(1)
    shutil.copytree(REPO / "deploy" / "monitoring", tmp_path / "monitoring")
    for name in ("gpuharden-alerts.yml", "tests/alerts-test.yml"):
        subprocess.run(["sed", "-i", script, str(tmp_path / "monitoring" / name)], check=True)
    rules = (tmp_path / "monitoring" / "gpuharden-alerts.yml").read_text()
    assert set(re.findall(r'runbook_url: "([^"]*)"', rules)) == {"https://wiki.example.com/gpuharden#troubleshooting"}
    result = subprocess.run(["promtool", "test", "rules", "alerts-test.yml"], cwd=tmp_path / "monitoring" / "tests",
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_the_dist_venv_holds_no_test_tools():
    """What `make dist` builds with (build/dist-venv; warm, instant; cold, seconds from pip's cache or PyPI): the
    build tools and ansible-core only."""
    subprocess.run(["make", "-s", "-C", str(REPO), "dist-venv"], check=True, capture_output=True, timeout=600)
    listed = subprocess.run([str(REPO / "build" / "dist-venv" / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                            check=True, capture_output=True, text=True, timeout=120)
    installed = {package["name"].lower() for package in json.loads(listed.stdout)}
    assert {"build", "setuptools", "wheel", "ansible-core"} <= installed, sorted(installed)
    assert not {"pytest", "molecule", "ansible-lint", "ansible-builder", "ruff", "hypothesis", "gpuharden"} & installed, sorted(installed)
