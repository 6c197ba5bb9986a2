# SPDX-License-Identifier: GPL-3.0-or-later
"""Run `ansible-test sanity` on exactly what the collection ships.

ansible-test wants an `ansible_collections/<ns>/<name>` tree that is a git checkout, and it
bootstraps pip in its per-test virtualenvs with a get-pip script it downloads from a host this
machine cannot reach.  So: build the collection tarball, unpack it into such a tree, commit it, and
put a stand-in for the get-pip script where ansible-test looks first.  The tree gets tests/config.yml
(ansible-test's settings) from this checkout, since the tarball ships no tests.  Everything runs offline
except the per-test requirements, which come from PyPI.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build"
# One tree per run, so that concurrent runs (several developers on one machine) do not collide.
RUN_DIR = BUILD / ("sanity-%d" % os.getpid())
TREE = RUN_DIR / "ansible_collections" / "gpuharden" / "k8s"
VENV_BIN = Path(sys.executable).parent

GET_PIP_STAND_IN = '''\
"""Stand-in for ansible-test's downloaded get-pip script (written by gpuharden tools/sanity.py)."""
import subprocess
import sys

args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
'''


def ansible_test_pip_version() -> str:
    from ansible_test._internal import python_requirements  # noqa: PLC0415 (only needed here)

    source = Path(python_requirements.__file__).read_text()
    marker = "pip='"
    start = source.index(marker) + len(marker)
    return source[start : source.index("'", start)]


def write_get_pip_stand_in() -> None:
    version = ansible_test_pip_version()
    cache = Path.home() / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / ("get_pip_%s.py" % version.replace(".", "_"))).write_text(GET_PIP_STAND_IN)


def build_tree() -> None:
    dist = RUN_DIR / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    subprocess.run(
        [str(VENV_BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(dist), str(REPO)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (tarball,) = glob.glob(str(dist / "gpuharden-k8s-*.tar.gz"))
    shutil.rmtree(TREE, ignore_errors=True)
    TREE.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(TREE, filter="data")
    # ansible-test's own settings (the modules' Python versions): a test file, so not in the tarball.
    (TREE / "tests").mkdir()
    shutil.copy(REPO / "tests" / "config.yml", TREE / "tests" / "config.yml")
    # ansible-test sanity checks the files git knows about.
    git = ["git", "-c", "user.name=sanity", "-c", "user.email=sanity@localhost", "-C", str(TREE)]
    subprocess.run(git[:1] + ["init", "-q", str(TREE)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "sanity snapshot"], check=True)


def main() -> int:
    write_get_pip_stand_in()
    build_tree()
    env = dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")))
    command = [str(VENV_BIN / "ansible-test"), "sanity", "--python", "%d.%d" % sys.version_info[:2], "--color", "no"]
    command += sys.argv[1:]
    print("+ (cd %s && %s)" % (TREE, " ".join(command)), flush=True)
    try:
        return subprocess.run(command, cwd=TREE, env=env, check=False).returncode
    finally:
        shutil.rmtree(RUN_DIR, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
