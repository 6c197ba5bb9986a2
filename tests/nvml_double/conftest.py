"""Fixtures for driving the real pynvml against the NVML test double.

The double (tests/fakes/nvml) is built once per session into
$NVML_DOUBLE_BUILD_DIR (default <repo>/build/nvml) when missing or stale.
Most tests run in-process: the library is preloaded with ctypes.CDLL(abs
path), so pynvml's CDLL("libnvidia-ml.so.1") finds it by soname, and the
NVML_DOUBLE_* variables are switched per test (the double re-reads them on
every nvmlInit). Tests that need another uid or another process use
`node.run(...)`, a `python -c` child started with LD_LIBRARY_PATH set.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

try:
    import pynvml  # nvidia-ml-py
except ImportError as exc:  # pragma: no cover - environment problem, not a skip
    raise RuntimeError("these tests need nvidia-ml-py (import name pynvml) installed") from exc

REPO = Path(__file__).resolve().parents[2]
FAKE_DIR = REPO / "tests" / "fakes" / "nvml"
FIXTURES = FAKE_DIR / "fixtures"
CTL = FAKE_DIR / "nvml_double_ctl.py"
BUILD_DIR = Path(os.environ.get("NVML_DOUBLE_BUILD_DIR") or REPO / "build" / "nvml")
LIB = BUILD_DIR / "libnvidia-ml.so.1"
NOBODY = 65534

ENV_KEYS = ("NVML_DOUBLE_FIXTURE", "NVML_DOUBLE_STATE", "NVML_DOUBLE_DEV_DIR")

# Test modules import helpers from this unambiguous alias rather than from "conftest".
sys.modules.setdefault("nvml_double_support", sys.modules[__name__])


def _build_library() -> Path:
    sources = [FAKE_DIR / n for n in ("nvml_double.c", "json.c", "json.h", "build.sh")]
    if LIB.exists() and LIB.stat().st_mtime >= max(s.stat().st_mtime for s in sources):
        return LIB
    if not shutil.which(os.environ.get("CC", "gcc")):
        pytest.fail("gcc (or $CC) is required to build the NVML test double", pytrace=False)
    proc = subprocess.run(["sh", str(FAKE_DIR / "build.sh"), str(BUILD_DIR)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"building the NVML test double failed:\n{proc.stdout}{proc.stderr}", pytrace=False)
    return LIB


@pytest.fixture(scope="session")
def nvml_lib() -> Path:
    lib = _build_library()
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return lib


def load_fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class Node:
    """One simulated node: fixture + state file + a dev dir with real char nodes."""

    def __init__(self, root: Path, fixture: dict):
        self.root = root
        self.fixture = fixture
        self.fixture_path = root / "fixture.json"
        self.state_path = root / "state" / "state.json"
        self.dev = root / "dev"
        self.dev.mkdir()
        (root / "state").mkdir()
        os.chmod(root / "state", 0o755)
        self.write_fixture(fixture)
        self.mknod("nvidiactl", 255)
        for i, gpu in enumerate(fixture.get("gpus", [])):
            self.mknod(f"nvidia{gpu.get('minor', i)}", gpu.get("minor", i))
        if any("mig" in gpu for gpu in fixture.get("gpus", [])):
            # the MIG config and monitor capabilities, as on a MIG-capable node (noderoot.default_devices)
            self.mknod("nvidia-caps/nvidia-cap1", 1, 0o400)
            self.mknod("nvidia-caps/nvidia-cap2", 2, 0o444)

    def write_fixture(self, fixture: dict | str) -> None:
        text = fixture if isinstance(fixture, str) else json.dumps(fixture)
        self.fixture_path.write_text(text)
        os.chmod(self.fixture_path, 0o644)

    def mknod(self, name: str, minor: int, mode: int = 0o666) -> Path:
        path = self.dev / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(195, minor))
        os.chmod(path, mode)  # mknod honours the umask
        return path

    @property
    def env(self) -> dict:
        return {
            "NVML_DOUBLE_FIXTURE": str(self.fixture_path),
            "NVML_DOUBLE_STATE": str(self.state_path),
            "NVML_DOUBLE_DEV_DIR": str(self.dev),
        }

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ, **self.env)
        proc = subprocess.run([sys.executable, str(CTL), *args], capture_output=True, text=True, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"ctl {args} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def run(self, code: str, uid: int | None = None, env: dict | None = None) -> dict:
        """Run `code` in a fresh interpreter (optionally as `uid`); it sets `result`.

        Helpers available to the code: pynvml as `n`, and `err(fn, *args)`
        returning the NVML error value raised by fn (None on success).

        The library is loaded before the child drops to `uid`, as a node's
        world-readable libnvidia-ml would be: the build directory lies inside
        the checkout, which `mktemp -d` (a CI clone) makes 0700, and the
        permission decisions under test are the device nodes' and the
        fixture's, not the checkout's.
        """
        prelude = textwrap.dedent(
            f"""
            import json, os, sys
            import pynvml as n
            uid = {uid!r}
            if uid is not None:
                import ctypes
                ctypes.CDLL({str(LIB)!r}, mode=ctypes.RTLD_GLOBAL)
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            def err(fn, *a):
                try:
                    fn(*a)
                except n.NVMLError as e:
                    return e.value
                return None
            result = None
            """
        )
        script = prelude + textwrap.dedent(code) + "\nprint('@@RESULT@@' + json.dumps(result))\n"
        full_env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
        full_env.update(self.env)
        full_env["LD_LIBRARY_PATH"] = str(BUILD_DIR)
        full_env.update(env or {})
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=full_env, timeout=60)
        if proc.returncode != 0 or "@@RESULT@@" not in proc.stdout:
            raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return json.loads(proc.stdout.split("@@RESULT@@", 1)[1])


@pytest.fixture
def make_node(nvml_lib, monkeypatch):
    """make_node(fixture_name_or_dict) -> Node, with the NVML_DOUBLE_* env pointing at it."""
    roots = []

    if os.geteuid() != 0:
        pytest.fail("the NVML double tests must run as root (mknod of char devices, setuid children)", pytrace=False)

    def factory(fixture: str | dict) -> Node:
        if isinstance(fixture, str):
            fixture = load_fixture(fixture)
        # /tmp-based and world-searchable so that children running as nobody can reach it.
        root = Path(tempfile.mkdtemp(prefix="nvml-double-", dir="/tmp"))
        os.chmod(root, 0o755)
        roots.append(root)
        node = Node(root, fixture)
        for k, v in node.env.items():
            monkeypatch.setenv(k, v)
        return node

    yield factory
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def nvml(nvml_lib):
    """pynvml, with nvmlShutdown() called for every successful nvmlInit() of the test."""
    inits = []
    real_init = pynvml.nvmlInit

    def init():
        real_init()
        inits.append(1)

    yield _Nvml(init)
    for _ in inits:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


class _Nvml:
    def __init__(self, init):
        self.init = init

    def __getattr__(self, name):
        return getattr(pynvml, name)


def nvml_error(fn, *args):
    """Return the NVML error code fn raises (None when it succeeds)."""
    try:
        fn(*args)
    except pynvml.NVMLError as e:
        return e.value
    return None
