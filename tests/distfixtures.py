# SPDX-License-Identifier: GPL-3.0-or-later
"""The archives `make dist` builds (the CLI's wheel and sdist, the collection tarball), for the tests of their contents
(tests/unit/test_dist.py) and of the adopter's install (tests/integration/test_installed_artifacts.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DIST = REPO / "dist"
VENV_BIN = Path(sys.executable).parent
# What goes into one archive or the other; an archive in dist/ older than any of these is stale.  (Not all of
# inventories/: the lab rewrites inventories/lab/ each time it comes up.)
INPUTS = ("pyproject.toml", "galaxy.yml", "README.md", "CHANGELOG.md", "COPYING", "requirements-node.txt",
          "src", "plugins", "roles", "playbooks", "meta", "deploy", "docs", "inventories/example")


@dataclass(frozen=True)
class Archives:
    wheel: Path
    sdist: Path
    collection: Path


def expected(directory: Path) -> Archives:
    """The three archive paths in ``directory`` for the versions pyproject.toml and galaxy.yml declare."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    return Archives(
        wheel=directory / ("gpuharden-%s-py3-none-any.whl" % version),
        sdist=directory / ("gpuharden-%s.tar.gz" % version),
        collection=directory / ("%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"])),
    )


def build(directory: Path) -> Archives:
    """What `make dist` does, into ``directory``: `python -m build` (setuptools from PyPI into an isolated env) and
    the collection built as `make test` builds it (tools/dist.py, a test build: dist.TEST_URL for the project URL)."""
    from tools import dist  # noqa: PLC0415 (the same staging and checks as make dist)

    directory.mkdir(parents=True, exist_ok=True)
    built = subprocess.run([sys.executable, "-m", "build", "--quiet", "--outdir", str(directory), str(REPO)],
                           capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    dist.build_collection(directory, dist.TEST_URL, test_build=True, ansible_galaxy=str(VENV_BIN / "ansible-galaxy"))
    archives = expected(directory)
    for path in vars(archives).values():
        assert path.is_file(), "%s not built (%s)" % (path.name, sorted(item.name for item in directory.iterdir()))
    return archives


def _newest_input() -> float:
    newest = 0.0
    for name in INPUTS:
        top = REPO / name
        if not top.exists():
            continue
        newest = max(newest, top.stat().st_mtime)
        for root, dirs, files in os.walk(top):
            dirs[:] = [entry for entry in dirs if entry != "__pycache__" and not entry.endswith(".egg-info")]
            for entry in dirs + files:
                newest = max(newest, os.lstat(os.path.join(root, entry)).st_mtime)
    return newest


def built_or_build(scratch: Path) -> Archives:
    """The archives in dist/ when `make dist` built them after the last change to what they contain, else fresh
    ones built into ``scratch``."""
    archives = expected(DIST)
    paths = list(vars(archives).values())
    if all(path.is_file() for path in paths) and min(path.stat().st_mtime for path in paths) > _newest_input():
        return archives
    return build(scratch)
