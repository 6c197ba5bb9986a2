# SPDX-License-Identifier: GPL-3.0-or-later
"""The one check of the gpuharden.k8s collection every command that needs it makes (cluster_side.require_collection,
from cli.main): missing, it is the same message and exit 2 for each; of another release than the CLI's, a different
major or minor release is refused (exit 2) and a different patch release warned about, each naming the one to upgrade
and the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuharden import __version__, cli, cluster_side

GPUHARDEN = Path(sys.executable).parent / "gpuharden"
# A command line of each command that needs the collection, valid for argparse (what follows never runs).
COMMAND_LINES = {
    "facts": ["facts", "-i", "hosts.yml"],
    "drift": ["drift", "-i", "hosts.yml"],
    "explain": ["explain", "pod", "ml/train-0"],
    "kubeconfig": ["kubeconfig", "-o", "out.kubeconfig"],
}
# The commands that read reports only, and the lab's (its own checkout): no collection check.
WITHOUT_COLLECTION = {"drift-merge", "report", "lab"}


def _subcommands():
    parser = cli.build_parser()
    action = next(action for action in parser._actions if action.dest == "command")
    return set(action.choices)


def test_every_command_is_classified():
    """A new command must say whether it needs the collection: in cli.NEEDS_COLLECTION, or in the list here."""
    assert set(cli.NEEDS_COLLECTION) == set(COMMAND_LINES)
    assert _subcommands() - WITHOUT_COLLECTION == set(cli.NEEDS_COLLECTION), sorted(_subcommands())


def _run(argv, tmp_path, collections):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANSIBLE_", "K8S_AUTH_"))}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
    return subprocess.run([str(GPUHARDEN), *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)


def _fake_collection(root, manifest_version=None, galaxy_version=None):
    collection = root / "ansible_collections" / "gpuharden" / "k8s"
    (collection / "plugins" / "modules").mkdir(parents=True)
    (collection / "plugins" / "modules" / "gpu_consistency.py").write_text("")
    if manifest_version is not None:
        (collection / "MANIFEST.json").write_text(json.dumps({"collection_info": {"version": manifest_version}}))
    if galaxy_version is not None:
        (collection / "galaxy.yml").write_text("namespace: gpuharden\nname: k8s\nversion: %s\n" % galaxy_version)
    return collection


@pytest.fixture(scope="module")
def missing_results(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("missing")
    (tmp_path / "empty").mkdir()
    return {command: _run(argv, tmp_path, tmp_path / "empty") for command, argv in COMMAND_LINES.items()}


@pytest.mark.parametrize("command", sorted(COMMAND_LINES))
def test_without_the_collection_every_command_exits_2_with_the_same_message(command, missing_results, tmp_path_factory):
    result = missing_results[command]
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuharden: the gpuharden.k8s collection is not installed where Ansible looks for collections "
                               "(searched: %s" % tmp_path_factory.getbasetemp()), lines[0]
    assert ("ansible-galaxy collection install 'gpuharden.k8s:==%s'" % __version__) in lines[0]
    assert {other.stderr for other in missing_results.values()} == {result.stderr}


def test_a_minor_release_apart_is_refused_naming_the_older_one(tmp_path):
    major, minor, _patch = (int(part) for part in __version__.split(".")[:3])
    newer = "%d.%d.0" % (major, minor + 1)
    _fake_collection(tmp_path / "collections", manifest_version=newer)
    result = _run(COMMAND_LINES["facts"], tmp_path, tmp_path / "collections")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "gpuharden: gpuharden %s and the gpuharden.k8s collection %s at %s are different releases: upgrade the CLI to the "
        "collection's release: pip install --upgrade 'gpuharden==%s'\n" % (
            __version__, newer, tmp_path / "collections" / "ansible_collections" / "gpuharden" / "k8s", newer))


def test_a_patch_release_apart_is_a_warning_and_the_command_runs(tmp_path):
    major, minor, patch = (int(part) for part in __version__.split(".")[:3])
    newer = "%d.%d.%d" % (major, minor, patch + 1)
    _fake_collection(tmp_path / "collections", manifest_version=newer)
    result = _run(COMMAND_LINES["facts"], tmp_path, tmp_path / "collections")
    lines = result.stderr.splitlines()
    assert lines[0].startswith("gpuharden: warning: gpuharden %s and the gpuharden.k8s collection %s at " % (__version__, newer)), lines
    assert lines[0].endswith("are different patch releases: upgrade the CLI to the collection's release: pip install --upgrade "
                             "'gpuharden==%s'" % newer), lines
    # then facts itself ran: its own complaint about the inventory
    assert result.returncode == 2 and lines[1:] == ["gpuharden facts: inventory hosts.yml does not exist"], result.stderr


@pytest.mark.parametrize(("cli_version", "collection", "expected"), [
    ("0.1.0", "0.1.0", None),
    ("0.1.0", "0.1.0+local", (False, "upgrade the CLI")),  # not the same release
    ("0.2.0", "0.1.3", (True, "upgrade the collection to the CLI's release: ansible-galaxy collection install --force "
                              "gpuharden-k8s-0.2.0.tar.gz (from make dist), or ansible-galaxy collection install --force 'gpuharden.k8s:==0.2.0'")),
    ("1.0.0", "2.0.0", (True, "pip install --upgrade 'gpuharden==2.0.0'")),
    ("0.1.2", "0.1.1", (False, "upgrade the collection")),
    ("0.1.0", "next", (True, "has version 'next', which is no version")),
])
def test_version_mismatch(cli_version, collection, expected):
    mismatch = cluster_side.version_mismatch(cli_version, collection, "/base")
    if expected is None:
        assert mismatch is None
    else:
        assert mismatch[0] is expected[0] and expected[1] in mismatch[1], mismatch
        assert "/base/ansible_collections/gpuharden/k8s" in mismatch[1]


def test_the_version_comes_from_manifest_json_then_galaxy_yml(tmp_path):
    _fake_collection(tmp_path / "installed", manifest_version="0.1.0", galaxy_version="9.9.9")
    _fake_collection(tmp_path / "checkout", galaxy_version="0.1.0")
    _fake_collection(tmp_path / "neither")
    assert cluster_side.collection_version(str(tmp_path / "installed")) == "0.1.0"
    assert cluster_side.collection_version(str(tmp_path / "checkout")) == "0.1.0"
    assert cluster_side.collection_version(str(tmp_path / "neither")) is None
    assert cluster_side.require_collection([str(tmp_path / "nothing"), str(tmp_path / "checkout")], "0.1.0") == (str(tmp_path / "checkout"), None)
    with pytest.raises(cluster_side.CollectionError, match="has no MANIFEST.json or galaxy.yml that gives its version"):
        cluster_side.require_collection([str(tmp_path / "neither")], "0.1.0")
    with pytest.raises(cluster_side.CollectionError, match=r"different releases: upgrade the collection"):
        cluster_side.require_collection([str(tmp_path / "installed")], "0.2.0")
