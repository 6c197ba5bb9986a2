# SPDX-License-Identifier: GPL-3.0-or-later
"""Run the real NVIDIA k8s-device-plugin binary (lab/realcomponents/build-device-plugin.sh) against the NVML double.

The plugin runs in a private mount namespace (``unshare -m``, root) where the node root built by
gpuharden_lab.noderoot is bind-mounted over /proc/driver and /sys/bus/pci/devices and a temp dir over
/var/lib, so its fixed socket directory /var/lib/kubelet/device-plugins is private.  It starts with
``--kubelet-socket ''`` (no registration).  What it advertises is read by dp-listwatch (a kubelet-side
ListAndWatch client built with the plugin, lab/realcomponents/dp-listwatch) through the same sockets
seen from outside the namespace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.builds import skip_unbuilt

REPO = Path(__file__).resolve().parents[2]
VERSIONS_ENV = REPO / "lab" / "realcomponents" / "versions.env"
NVML_BUILD_DIR = Path(os.environ.get("NVML_DOUBLE_BUILD_DIR") or REPO / "build" / "nvml")
CTL = REPO / "tests" / "fakes" / "nvml" / "nvml_double_ctl.py"
MAKE_TARGET = "make real-device-plugin"


def versions() -> dict[str, str]:
    out = {}
    for line in VERSIONS_ENV.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _sep, value = line.partition("=")
            out[key] = value
    return out


def plugin_dir(version: str) -> Path:
    cache = Path(os.environ.get("GPUHARDEN_CACHE") or Path.home() / ".cache" / "gpuharden")
    return cache / "realcomponents" / ("nvidia-device-plugin-" + version)


def require_plugin(version: str) -> Path:
    d = plugin_dir(version)
    for name in ("nvidia-device-plugin", "dp-listwatch"):
        if not os.access(d / name, os.X_OK):
            skip_unbuilt(f"the real device plugin {version} is not built ({d / name} missing): run `{MAKE_TARGET}`")
    return d


@dataclass
class PluginRun:
    """One plugin process and what it showed."""

    proc: subprocess.Popen
    workdir: Path
    bindir: Path
    state_file: Path | None
    fixture: Path | None
    log_path: Path
    returncode: int | None = None
    kubelet: subprocess.Popen | None = None  # dp-listwatch -kubelet: the plugin registers with it

    @property
    def socket_dir(self) -> Path:
        return self.workdir / "varlib" / "kubelet" / "device-plugins"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_settled(self, timeout: float = 30.0, quiet: float = 0.8) -> None:
        """Until the plugin exits, or has served every plugin and been quiet for ``quiet`` s."""
        deadline = time.monotonic() + timeout
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                self.returncode = rc
                return
            text = self.log()
            if text != last:
                last, since = text, time.monotonic()
            started = "Registered device plugin for" in text or "No devices found" in text
            if started and time.monotonic() - since >= quiet:
                return
            time.sleep(0.1)
        raise AssertionError(f"the device plugin neither served nor exited within {timeout}s:\n{self.log()}")

    def wait_for_log(self, pattern: str, timeout: float = 15.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log())
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in the device plugin's log:\n{self.log()}")

    def listwatch(self, *args: str, timeout: float = 30.0) -> list[dict]:
        """dp-listwatch over every socket: its JSON lines."""
        p = subprocess.run(
            [str(self.bindir / "dp-listwatch"), "-dir", str(self.socket_dir), "-timeout", "5s", *args],
            capture_output=True, text=True, timeout=timeout,
        )
        lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        assert p.returncode == 0, f"dp-listwatch rc={p.returncode}: {p.stdout}{p.stderr}\nplugin log:\n{self.log()}"
        return lines

    def kubelet_lines(self, timeout: float = 40.0) -> list[dict]:
        """What the fake kubelet saw (registrations and ListAndWatch answers), once it has finished."""
        try:
            out, err = self.kubelet.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kubelet.kill()
            out, err = self.kubelet.communicate()
        assert self.kubelet.returncode == 0, f"dp-listwatch -kubelet rc={self.kubelet.returncode}: {out}{err}\n{self.log()}"
        return [json.loads(x) for x in out.splitlines() if x.startswith("{")]

    def resources(self) -> dict[str, list[dict]]:
        """Resource name -> devices of each socket's first ListAndWatch answer."""
        if self.kubelet is not None:
            lines = self.kubelet_lines()
            registered = {x["socket"]: x["resource"] for x in lines if x["event"] == "register"}
            return {registered[x["socket"]]: x["devices"] for x in lines if x["event"] == "list" and x["seq"] == 0}
        out = {}
        for line in self.listwatch():
            if line["event"] == "list" and line["seq"] == 0:
                out[resource_of_socket(line["socket"])] = line["devices"]
        return out

    def inject_xid(self, gpu: int, xid: int) -> None:
        subprocess.run(
            [sys.executable, str(CTL), "inject-xid", "--state", str(self.state_file), "--fixture", str(self.fixture),
             "--gpu", str(gpu), "--xid", str(xid)],
            check=True, capture_output=True, text=True,
        )

    def stop(self) -> int:
        if self.kubelet is not None and self.kubelet.poll() is None:
            self.kubelet.kill()
            self.kubelet.communicate()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.returncode = self.proc.returncode
        return self.returncode


def resource_of_socket(socket: str) -> str:
    """nvidia-mig-1g.10gb.sock -> nvidia.com/mig-1g.10gb (the plugin names sockets nvidia-<name>.sock)."""
    return "nvidia.com/" + socket.removeprefix("nvidia-").removesuffix(".sock")


def counts(resources: dict[str, list[dict]]) -> dict[str, int]:
    return {name: len(devs) for name, devs in sorted(resources.items())}


class PluginRunner:
    """Starts plugin processes (``start``) and removes them and their temp dirs (``close``)."""

    def __init__(self):
        if os.geteuid() != 0:
            pytest.skip("the real device plugin tests need root (unshare -m, bind mounts, mknod)")
        if not shutil.which("unshare"):
            pytest.skip("unshare (util-linux) is needed")
        self.runs: list[PluginRun] = []
        self.dirs: list[Path] = []

    def start(self, fixture: str | None, config: dict | str, *, version: str | None = None, library: bool = True,
              env: dict | None = None, settle: bool = True, kubelet: bool = False) -> PluginRun:
        """The plugin on ``fixture``'s node (None: no NVML fixture) with ``config`` (its config file: a dict is written
        as JSON, which is YAML, a string as it is).

        ``kubelet``: the plugin registers with dp-listwatch playing the kubelet (v0.15.x cannot skip
        registration); otherwise it runs with ``--kubelet-socket ''``.
        """
        from gpuharden_lab.noderoot import build_node_root

        version = version or versions()["NVIDIA_DEVICE_PLUGIN_VERSION"]
        bindir = require_plugin(version)
        if library and not (NVML_BUILD_DIR / "libnvidia-ml.so.1").exists():
            pytest.skip(f"the NVML double is not built ({NVML_BUILD_DIR}): run `make nvml-double`")
        # Short: socket paths under it must stay below the 108-byte sun_path limit.
        work = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
        self.dirs.append(work)
        (work / "varlib" / "kubelet" / "device-plugins").mkdir(parents=True)
        (work / "config.yaml").write_text(config if isinstance(config, str) else json.dumps(config))  # JSON is YAML
        child_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(work)}
        state = fixture_path = None
        mounts = f"mount --bind {work}/varlib /var/lib"
        if fixture is not None:
            node = build_node_root(work / "node", fixture)
            state, fixture_path = node.state_file, node.fixture
            child_env.update(node.env())
            mounts += (f" && mount --bind {node.root}/proc/driver /proc/driver"
                       f" && mount --bind {node.root}/sys/bus/pci/devices /sys/bus/pci/devices")
        if library:
            child_env["LD_LIBRARY_PATH"] = str(NVML_BUILD_DIR)
        else:
            child_env.pop("LD_LIBRARY_PATH", None)
        child_env.update(env or {})
        log_path = work / "plugin.log"
        fake_kubelet = None
        socket_dir = work / "varlib" / "kubelet" / "device-plugins"
        if kubelet:
            fake_kubelet = subprocess.Popen(
                [str(bindir / "dp-listwatch"), "-dir", str(socket_dir), "-kubelet", "30s", "-quiet", "1.5s",
                 "-timeout", "5s"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            deadline = time.monotonic() + 10
            while not (socket_dir / "kubelet.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        flags = "" if kubelet else '--kubelet-socket ""'
        script = f'{mounts} && cd {work} && exec "$0" {flags} --config-file {work}/config.yaml'
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(bindir / "nvidia-device-plugin")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env, cwd=work,
            )
        run = PluginRun(proc=proc, workdir=work, bindir=bindir, state_file=state, fixture=fixture_path,
                        log_path=log_path, kubelet=fake_kubelet)
        self.runs.append(run)
        if settle:
            run.wait_settled()
        return run

    def close(self) -> None:
        for run in self.runs:
            run.stop()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------------------
# Plugin configs and what each release does with them at start: one table for the real binaries
# (tests/real/test_device_plugin_binary.py runs every case on each release built here) and for the planner
# (tests/unit/test_device_plugin.py asserts the audit's finding for the same case and release), so the two cannot
# drift apart.  v0.20.0 is not served by the Go module proxy here: its column is read from its source
# (NVIDIA/k8s-device-plugin v0.20.0 cmd/nvidia-device-plugin/main.go, api/config/v1) and only the planner checks it.

RELEASES = ("v0.15.0", "v0.18.2", "v0.20.0")


@dataclass(frozen=True)
class ConfigCase:
    """A config file (and the container's environment) and what each release does with it at start."""

    config: dict | str  # the file: a dict is written as JSON, a string as it is (YAML)
    refused: dict[str, str]  # release -> regex of the log line of its refusal (it exits 1); a release not named starts
    finding: str | None = None  # the audit's error finding where the release refuses it
    accepted_finding: str | None = None  # the audit's finding where a release starts anyway (a key it ignores)
    env: dict[str, str] = field(default_factory=dict)
    fixture: str = "l4"
    advertised: dict[str, int] | None = None  # where it starts: what it advertises (resource -> devices)


def _every(pattern: str, *releases: str) -> dict[str, str]:
    return {release: pattern for release in releases or RELEASES}


def _sharing(kind: str, resources, **keys) -> dict:
    return {"version": "v1", "sharing": {kind: dict(keys, resources=resources)}}


GPU_X2 = [{"name": "nvidia.com/gpu", "replicas": 2}]
REFUSED_CONFIGS = {
    "version-v2": ConfigCase({"version": "v2"}, _every(r"unknown version: v2"), "plugin_config_invalid"),
    "version-number": ConfigCase("version: 1\n", _every(r"unknown version: 1"), "plugin_config_invalid"),
    "not-yaml": ConfigCase("version: [v1\n", _every(r"unable to parse config file"), "plugin_config_invalid"),
    "time-slicing-replicas-1": ConfigCase(_sharing("timeSlicing", [{"name": "nvidia.com/gpu", "replicas": 1}]),
                                          _every(r"number of replicas must be >= 2"), "plugin_config_invalid"),
    "time-slicing-replicas-string": ConfigCase(_sharing("timeSlicing", [{"name": "nvidia.com/gpu", "replicas": "4"}]),
                                               _every(r"cannot unmarshal string into Go .* of type int"), "plugin_config_invalid"),
    "time-slicing-no-resources": ConfigCase({"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True}}},
                                            _every(r"no resources specified"), "plugin_config_invalid"),
    # timeSlicing is a struct, decoded whenever the key is there, even null (replicas.go UnmarshalJSON runs on null).
    "time-slicing-null": ConfigCase({"version": "v1", "sharing": {"timeSlicing": None}}, _every(r"no resources specified"),
                                    "plugin_config_invalid"),
    "time-slicing-devices": ConfigCase(_sharing("timeSlicing", [dict(GPU_X2[0], devices="some")]),
                                       _every(r"devices set as 'some'"), "plugin_config_invalid"),
    "mps-mixed": ConfigCase(dict(_sharing("mps", GPU_X2), flags={"migStrategy": "mixed", "mpsRoot": "/run/nvidia/mps"}),
                            _every(r"using --mig-strategy=mixed is not supported with MPS"), "plugin_mps_invalid"),
    "mps-no-root": ConfigCase(_sharing("mps", GPU_X2), _every(r"using MPS requires --mps-root to be specified"), "plugin_mps_invalid"),
    "device-id-strategy": ConfigCase({"version": "v1", "flags": {"plugin": {"deviceIDStrategy": "serial"}}},
                                     _every(r"invalid --device-id-strategy option: serial"), "plugin_device_id_strategy_invalid"),
    "device-id-strategy-env": ConfigCase({"version": "v1"}, _every(r"invalid --device-id-strategy option: serial"),
                                         "plugin_device_id_strategy_invalid", env={"DEVICE_ID_STRATEGY": "serial"}),
    "device-list-strategy-none": ConfigCase({"version": "v1", "flags": {"plugin": {"deviceListStrategy": "none"}}},
                                            _every(r"invalid --device-list-strategy option"), "plugin_device_list_strategy_invalid"),
    # A config string is one strategy, never split at commas (only the flag and its environment variable are).
    "device-list-strategy-comma": ConfigCase({"version": "v1", "flags": {"plugin": {"deviceListStrategy": "envvar,volume-mounts"}}},
                                             _every(r"invalid strategy: envvar,volume-mounts"), "plugin_device_list_strategy_invalid"),
    "mig-strategy": ConfigCase({"version": "v1", "flags": {"migStrategy": "auto"}},
                               dict(_every(r"unknown MIG strategy: auto"), **{"v0.15.0": r"unknown strategy: auto"}),
                               "plugin_mig_strategy_invalid"),
    # The keys of a struct match in any case: MIGStrategy is migStrategy.
    "mig-strategy-key-case": ConfigCase({"version": "v1", "flags": {"MIGStrategy": "auto"}},
                                        dict(_every(r"unknown MIG strategy: auto"), **{"v0.15.0": r"unknown strategy: auto"}),
                                        "plugin_mig_strategy_invalid"),
    # Of two spellings of one key, the one that sorts last wins (sigs.k8s.io/yaml hands encoding/json the keys sorted).
    "mig-strategy-spellings": ConfigCase({"version": "v1", "flags": {"migStrategy": "none", "migstrategy": "auto"}},
                                         dict(_every(r"unknown MIG strategy: auto"), **{"v0.15.0": r"unknown strategy: auto"}),
                                         "plugin_mig_strategy_invalid"),
    "mig-strategy-spellings-accepted": ConfigCase({"version": "v1", "flags": {"MigStrategy": "auto", "migStrategy": "none"}}, {},
                                                  advertised={"nvidia.com/gpu": 2}),
    # YAML 1.1: an unquoted no is a boolean; a string field under flags refuses it (only version takes a number or a
    # boolean as its text, as "version-number" shows).
    "mig-strategy-yaml-no": ConfigCase("version: v1\nflags:\n  migStrategy: no\n",
                                       _every(r"cannot unmarshal bool into Go struct field .*migStrategy of type string"),
                                       "plugin_config_invalid"),
    "fail-on-init-error-string": ConfigCase({"version": "v1", "flags": {"failOnInitError": "false"}},
                                            _every(r"cannot unmarshal string into Go struct field"), "plugin_config_invalid"),
    "fail-on-init-error-env": ConfigCase({"version": "v1"}, _every(r'could not parse "no" as bool value'), "plugin_config_invalid",
                                         env={"FAIL_ON_INIT_ERROR": "no"}),
    "resource-name-domain": ConfigCase({"version": "v1", "resources": {"gpus": [{"pattern": "*", "name": "example.com/gpu"}]}},
                                       _every(r"incorrect format for resource name"), "plugin_resource_name_invalid"),
    # Keys a release does not know yet: ignored there, validated from the release that reads them.
    "discovery-strategy": ConfigCase({"version": "v1", "flags": {"deviceDiscoveryStrategy": "gpu"}},
                                     _every(r"invalid --device-discovery-strategy option gpu", "v0.18.2", "v0.20.0"),
                                     "plugin_config_invalid", "plugin_config_unknown_key", advertised={"nvidia.com/gpu": 2}),
    "imex-channel-ids": ConfigCase({"version": "v1", "imex": {"channelIDs": [1]}},
                                   _every(r"invalid IMEX channel IDs", "v0.18.2", "v0.20.0"), "plugin_config_invalid",
                                   "plugin_config_unknown_key", advertised={"nvidia.com/gpu": 2}),
    "allocation-policy": ConfigCase({"version": "v1", "flags": {"plugin": {"sharedDevicesAllocationPolicy": "spread"}}},
                                    _every(r"invalid --shared-devices-allocation-policy option", "v0.20.0"), "plugin_config_invalid",
                                    "plugin_config_unknown_key", advertised={"nvidia.com/gpu": 2}),
    # Accepted everywhere, the key ignored without a word: the misspelt key's value, which the right key refuses, never
    # reaches the plugin ...
    "unknown-key": ConfigCase({"version": "v1", "flags": {"migStrategey": "auto"}}, {}, None, "plugin_config_unknown_key",
                              advertised={"nvidia.com/gpu": 2}),
    # ... and the keys of sharing.timeSlicing match their case exactly: RenameByDefault renames nothing.
    "rename-key-case": ConfigCase(_sharing("timeSlicing", GPU_X2, RenameByDefault=True), {}, None, "plugin_config_unknown_key",
                                  advertised={"nvidia.com/gpu": 4}),
}
