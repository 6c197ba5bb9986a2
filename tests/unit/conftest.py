# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures that run product code against the NVML double, in-process and as real module runs."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from gpuharden_lab import NVML_LIBRARY_DIR, REPO_ROOT
from gpuharden_lab.noderoot import build_node_root

from tests.unit import result_keys

LIBRARY = NVML_LIBRARY_DIR / "libnvidia-ml.so.1"
COLLECTIONS = REPO_ROOT / "build" / "collections"
UNPRIVILEGED_UID = 65534


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet HTTP/1.1 handler that answers JSON."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_json(self, status, answer):
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="session")
def nvml_library():
    """Build the double if needed and load it, so pynvml's dlopen("libnvidia-ml.so.1") finds it by soname."""
    sources = sorted((REPO_ROOT / "tests/fakes/nvml").glob("*.[ch]"))
    if not LIBRARY.exists() or any(src.stat().st_mtime > LIBRARY.stat().st_mtime for src in sources):
        subprocess.run(["sh", str(REPO_ROOT / "tests/fakes/nvml/build.sh"), str(NVML_LIBRARY_DIR)], check=True)
    return ctypes.CDLL(str(LIBRARY))


@pytest.fixture
def world_tmp():
    """A scratch directory every uid can traverse (pytest's own tmp_path is 0700 root)."""
    path = Path(tempfile.mkdtemp(prefix="gpuharden-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_node(world_tmp, monkeypatch, nvml_library):
    """make_node(fixture, **overrides) -> NodeRoot, with this process's NVML double pointed at it."""

    def factory(fixture, **kwargs):
        node = build_node_root(world_tmp / "node", fixture, **kwargs)
        for key, value in node.env().items():
            if key != "LD_LIBRARY_PATH":
                monkeypatch.setenv(key, value)
        return node

    return factory


def run_as(uid, function, *args):
    """Run function(*args) in a forked child with uid/gid dropped; return its JSON-able result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        status = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            payload = json.dumps({"result": function(*args)})
        except BaseException as error:  # report anything to the parent, never run pytest's code here
            payload = json.dumps({"error": repr(error)})
            status = 1
        with os.fdopen(write_end, "w") as pipe:
            pipe.write(payload)
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        payload = json.loads(pipe.read())
    os.waitpid(pid, 0)
    if "error" in payload:
        raise AssertionError("child failed: %s" % payload["error"])
    return payload["result"]


MODULE_RUN_TIMEOUT = 120  # a module that never gives up fails its test instead of hanging the suite


def run_module(name, args, env):
    """Run a module file as Ansible would run it locally (a fresh Python, args in a JSON file)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, handle)
    try:
        full_env = dict(os.environ, PYTHONPATH=str(COLLECTIONS), **env)
        completed = subprocess.run(
            [sys.executable, str(REPO_ROOT / "plugins/modules" / (name + ".py")), handle.name],
            env=full_env,
            capture_output=True,
            text=True,
            check=False,
            timeout=MODULE_RUN_TIMEOUT,
        )
    except subprocess.TimeoutExpired as error:
        raise AssertionError("module %s did not end within %d s" % (name, MODULE_RUN_TIMEOUT)) from error
    finally:
        os.unlink(handle.name)
    try:
        result = json.loads(completed.stdout)
    except json.JSONDecodeError as error:
        raise AssertionError("module printed no JSON: %s\n%s" % (completed.stdout, completed.stderr)) from error
    # issue 43, problem 11: every module run of the suite proves its result has no key Ansible reads as its own
    collisions = result_keys.collisions(result)
    assert not collisions, "module %s returned keys Ansible reserves: %s" % (name, collisions)
    return result


def tree_snapshot(root):
    """Every entry under root: bytes of files, link targets, type/rdev/owner/mode and mtimes: equal snapshots mean
    nothing under root changed."""
    snap = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            data = None
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as handle:
                    data = handle.read()
            elif stat.S_ISLNK(st.st_mode):
                data = os.readlink(path)
            snap[path] = (st.st_mode, st.st_rdev, st.st_uid, st.st_gid, st.st_mtime_ns, data)
    return snap


@pytest.fixture(scope="session")
def pushgateway(tmp_path_factory):
    """The URL of a real Prometheus Pushgateway (Debian's prometheus-pushgateway) on a free loopback port, for the
    drift CronJobs' push (tests/unit/test_incluster.py, test_drift_slice.py)."""
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if not binary:
        pytest.fail("prometheus-pushgateway not found: install the Debian package prometheus-pushgateway (make system-deps)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path_factory.mktemp("pushgateway") / "log").open("w")
    process = subprocess.Popen([binary, "--web.listen-address=127.0.0.1:%d" % port], stdout=log, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "the Pushgateway did not start"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()
