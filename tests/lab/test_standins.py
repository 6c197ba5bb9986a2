# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's stand-ins (systemctl, kubelet, containerd), run against a temp "node root".

No lab needed: GPUHARDEN_STANDIN_ROOT relocates /etc, /run, /var/lib, /var/log.  The kubelet
tests need the real kubelet validation helper, built by lab/controlplane/build.sh (they fail,
not skip, when it cannot be built).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from gpuharden_lab import REPO_ROOT
from gpuharden_lab.standins import kubelet as kl
from gpuharden_lab.standins import systemctl as sc

# They need root and the kubelet-validate binary the control-plane build makes.
pytestmark = pytest.mark.sandbox

PY = sys.executable
VENV_BIN = Path(PY).parent

KUBEADM_UNIT = """\
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

# kubeadm's drop-in, verbatim from the kubernetes release packaging (10-kubeadm.conf).
KUBEADM_DROPIN = """\
# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
--kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS
# variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user
# should use the .NodeRegistration.KubeletExtraArgs object in the configuration files instead.
# KUBELET_EXTRA_ARGS should be sourced from this file.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""

# A fake /usr/bin/kubelet that records its argv and sleeps (the systemctl tests do not need the stand-in).
ARGV_RECORDER = """#!/bin/sh
printf '%s\\n' "$@" > "$GPUHARDEN_STANDIN_ROOT/run/kubelet-argv"
trap 'exit 0' TERM
while :; do sleep 0.1; done
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def node(tmp_path, monkeypatch):
    root = tmp_path / "node"
    for d in ("etc/systemd/system", "run", "var/lib/kubelet", "var/log", "etc/default", "usr/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("GPUHARDEN_STANDIN_ROOT", str(root))
    monkeypatch.setenv("GPUHARDEN_SYSTEMCTL_STOP_TIMEOUT", "5")
    yield root
    # stop whatever a test left running
    units = root / "run" / "gpuharden-units"
    if units.is_dir():
        for u in units.iterdir():
            subprocess.run([PY, "-m", "gpuharden_lab.standins.systemctl", "stop", u.name], env=os.environ.copy(),
                           capture_output=True, timeout=30)


def systemctl(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    p = subprocess.run([PY, "-m", "gpuharden_lab.standins.systemctl", *args], capture_output=True, text=True,
                       timeout=60, env=os.environ.copy())
    if check:
        assert p.returncode == 0, p.stderr
    return p


def wait_for(pred, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for %s" % what)


def install_kubeadm_layout(root: Path, binary: str = ARGV_RECORDER) -> None:
    (root / "etc/systemd/system/kubelet.service").write_text(KUBEADM_UNIT)
    d = root / "etc/systemd/system/kubelet.service.d"
    d.mkdir(exist_ok=True)
    (d / "10-kubeadm.conf").write_text(KUBEADM_DROPIN)
    (root / "var/lib/kubelet/kubeadm-flags.env").write_text(
        'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock '
        '--pod-infra-container-image=registry.k8s.io/pause:3.10"\n')
    (root / "etc/default/kubelet").write_text("KUBELET_EXTRA_ARGS=--node-ip=10.0.0.5\n")
    exe = root / "usr/bin/kubelet"
    exe.write_text(binary)
    exe.chmod(0o755)


def props(unit: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in systemctl("show", unit, check=True).stdout.splitlines() if "=" in line)


# ---------------------------------------------------------------------------------------------
# systemctl


def test_parse_unit_text_continuations_and_comments():
    entries = sc.parse_unit_text("[Service]\n# c\nEnvironment=\"A=1 \\\n  2\"\n; x\nExecStart=/bin/a \\\n  -b\n")
    assert ("Service", "Environment", '"A=1 2"') in entries
    assert ("Service", "ExecStart", "/bin/a -b") in entries


def test_exec_expansion_rules():
    env = {"A": "x y", "B": "z"}
    argv, ign = sc.parse_exec("-/bin/k $A ${A} pre${B}post $B $NOPE ${NOPE} $$HOME", env)
    assert ign is True
    assert argv == ["/bin/k", "x", "y", "x y", "prezpost", "z", "", "$HOME"]


def test_env_file_parsing():
    env = sc.parse_env_file('# c\nA="q u o" \nexport B=2\nC=\'s\'\nD=plain value\n')
    assert env == {"A": "q u o", "B": "2", "C": "s", "D": "plain value"}


def test_kubeadm_layout_start_show_stop(node):
    install_kubeadm_layout(node)
    assert systemctl("daemon-reload").returncode == 0
    p = props("kubelet")
    assert p["LoadState"] == "loaded"
    assert p["ActiveState"] == "inactive"
    assert p["FragmentPath"] == "/etc/systemd/system/kubelet.service"
    assert p["DropInPaths"] == "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
    assert p["NeedDaemonReload"] == "no"
    assert p["UnitFileState"] == "disabled"
    assert "/var/lib/kubelet/kubeadm-flags.env (ignore_errors=yes)" in p["EnvironmentFiles"]

    r = systemctl("start", "kubelet.service")
    assert r.returncode == 0, r.stderr
    argv_file = node / "run/kubelet-argv"
    wait_for(argv_file.exists, what="kubelet argv")
    assert argv_file.read_text().split("\n")[:-1] == [
        "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf",
        "--kubeconfig=/etc/kubernetes/kubelet.conf",
        "--config=/var/lib/kubelet/config.yaml",
        "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock",
        "--pod-infra-container-image=registry.k8s.io/pause:3.10",
        "--node-ip=10.0.0.5",
    ]
    assert systemctl("is-active", "kubelet").stdout.strip() == "active"
    p = props("kubelet")
    assert p["ActiveState"] == "active" and p["SubState"] == "running"
    main = int(p["MainPID"])
    assert main > 0 and sc.pid_alive(main)

    assert systemctl("stop", "kubelet").returncode == 0
    r = systemctl("is-active", "kubelet")
    assert (r.returncode, r.stdout.strip()) == (3, "inactive")
    assert not sc.pid_alive(main)
    assert props("kubelet")["Result"] == "success"


def test_daemon_reload_semantics(node):
    install_kubeadm_layout(node)
    systemctl("daemon-reload", check=True)
    extra = node / "etc/systemd/system/kubelet.service.d/20-extra.conf"
    # (an Environment= for KUBELET_EXTRA_ARGS would lose against EnvironmentFile=/etc/default/kubelet, as in systemd)
    extra.write_text("[Service]\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_CONFIG_ARGS $KUBELET_EXTRA_ARGS --v=4\n")
    assert props("kubelet")["NeedDaemonReload"] == "yes"
    # start uses the last loaded definition (without 20-extra.conf) and warns
    r = systemctl("start", "kubelet")
    assert r.returncode == 0
    assert "changed on disk" in r.stderr
    argv_file = node / "run/kubelet-argv"
    wait_for(argv_file.exists)
    assert "--node-ip=10.0.0.5" in argv_file.read_text()
    systemctl("stop", "kubelet", check=True)
    argv_file.unlink()
    systemctl("daemon-reload", check=True)
    p = props("kubelet")
    assert p["NeedDaemonReload"] == "no"
    assert p["DropInPaths"].split() == [
        "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
        "/etc/systemd/system/kubelet.service.d/20-extra.conf",
    ]
    systemctl("start", "kubelet", check=True)
    wait_for(argv_file.exists)
    assert argv_file.read_text().split() == ["--config=/var/lib/kubelet/config.yaml", "--node-ip=10.0.0.5", "--v=4"]


def test_failed_state_and_restart(node):
    unit = node / "etc/systemd/system/crashy.service"
    unit.write_text("[Service]\nExecStart=/bin/sh -c 'echo boom >&2; exit 3'\n")
    assert systemctl("start", "crashy").returncode == 0  # Type=simple: start returns after spawning
    wait_for(lambda: systemctl("is-active", "crashy").stdout.strip() == "failed", what="failed")
    r = systemctl("is-active", "crashy")
    assert r.returncode == 3
    assert systemctl("is-failed", "crashy").returncode == 0
    p = props("crashy")
    assert (p["Result"], p["ExecMainStatus"], p["SubState"]) == ("exit-code", "3", "failed")
    assert "boom" in (node / "var/log/crashy.log").read_text()
    # fix it, reload, restart
    unit.write_text("[Service]\nExecStart=/bin/sleep 30\n")
    systemctl("daemon-reload", check=True)
    assert systemctl("restart", "crashy").returncode == 0
    assert systemctl("is-active", "crashy").stdout.strip() == "active"
    first = int(props("crashy")["MainPID"])
    assert systemctl("restart", "crashy").returncode == 0
    second = int(props("crashy")["MainPID"])
    assert first != second and not sc.pid_alive(first) and sc.pid_alive(second)
    systemctl("stop", "crashy", check=True)


def test_exec_start_pre_failure_and_missing_binary(node):
    (node / "etc/systemd/system/pre.service").write_text("[Service]\nExecStartPre=/bin/false\nExecStart=/bin/sleep 9\n")
    r = systemctl("start", "pre")
    assert r.returncode == 1 and "control process exited with error code" in r.stderr
    assert systemctl("is-active", "pre").stdout.strip() == "failed"
    # the same after a run that had a main process: the restart's job fails, as systemd's does
    (node / "etc/systemd/system/pre.service").write_text("[Service]\nExecStart=/bin/sleep 9\n")
    systemctl("daemon-reload", check=True)
    assert systemctl("restart", "pre").returncode == 0 and systemctl("is-active", "pre").stdout.strip() == "active"
    (node / "etc/systemd/system/pre.service").write_text("[Service]\nExecStartPre=/bin/false\nExecStart=/bin/sleep 9\n")
    systemctl("daemon-reload", check=True)
    r = systemctl("restart", "pre")
    assert r.returncode == 1 and "control process exited with error code" in r.stderr
    assert systemctl("is-active", "pre").stdout.strip() == "failed"
    (node / "etc/systemd/system/nobin.service").write_text("[Service]\nExecStart=/nonexistent/bin\n")
    assert systemctl("start", "nobin").returncode == 0
    wait_for(lambda: props("nobin")["ActiveState"] == "failed")
    assert props("nobin")["ExecMainStatus"] == "203"


def test_bad_settings_and_unknown_units(node):
    (node / "etc/systemd/system/two.service").write_text("[Service]\nExecStart=/bin/true\nExecStart=/bin/true\n")
    r = systemctl("start", "two")
    assert r.returncode == 1 and "bad unit file setting" in r.stderr
    assert props("two")["LoadState"] == "bad-setting"
    r = systemctl("start", "nosuch")
    assert (r.returncode, r.stderr.strip()) == (5, "Failed to start nosuch.service: Unit nosuch.service not found.")
    r = systemctl("status", "nosuch")
    assert (r.returncode, r.stderr.strip()) == (4, "Unit nosuch.service could not be found.")
    assert systemctl("is-active", "nosuch").returncode == 4
    p = props("nosuch")
    assert p["LoadState"] == "not-found" and p["ActiveState"] == "inactive"


def test_enable_disable_and_list_unit_files(node):
    install_kubeadm_layout(node)
    assert systemctl("is-enabled", "kubelet").stdout.strip() == "disabled"
    systemctl("enable", "kubelet", check=True)
    assert (node / "etc/systemd/system/multi-user.target.wants/kubelet.service").is_symlink()
    r = systemctl("is-enabled", "kubelet")
    assert (r.returncode, r.stdout.strip()) == (0, "enabled")
    out = systemctl("list-unit-files", "kubelet*").stdout
    assert "kubelet.service enabled" in " ".join(out.split())
    systemctl("disable", "kubelet", check=True)
    assert systemctl("is-enabled", "kubelet").returncode == 1


def test_ansible_systemd_service_against_standin(node, tmp_path):
    install_kubeadm_layout(node)
    wrapper_dir = tmp_path / "bin"
    wrapper_dir.mkdir()
    w = wrapper_dir / "systemctl"
    w.write_text("#!/bin/sh\nexec %s -m gpuharden_lab.standins.systemctl \"$@\"\n" % PY)
    w.chmod(0o755)
    env = os.environ.copy()
    env["PATH"] = "%s:%s:%s" % (wrapper_dir, VENV_BIN, env.get("PATH", ""))
    env["ANSIBLE_LOCALHOST_WARNING"] = "false"
    env["ANSIBLE_INVENTORY_UNPARSED_WARNING"] = "false"

    def ansible(args: str) -> dict:
        p = subprocess.run([str(VENV_BIN / "ansible"), "localhost", "-c", "local", "-o", "-m",
                            "ansible.builtin.systemd_service", "-a", args], capture_output=True, text=True,
                           env=env, timeout=180, cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(p.stdout.split("=>", 1)[1])

    res = ansible("name=kubelet state=restarted daemon_reload=true enabled=true")
    assert res["changed"] is True
    assert res["status"]["LoadState"] == "loaded"
    assert systemctl("is-active", "kubelet").stdout.strip() == "active"
    assert systemctl("is-enabled", "kubelet").stdout.strip() == "enabled"
    res = ansible("name=kubelet state=started")
    assert res["changed"] is False
    res = ansible("name=kubelet state=stopped")
    assert res["changed"] is True
    assert systemctl("is-active", "kubelet").stdout.strip() == "inactive"


# ---------------------------------------------------------------------------------------------
# kubelet


@pytest.fixture(scope="session")
def validator() -> str:
    p = subprocess.run(["bash", str(REPO_ROOT / "lab/controlplane/build.sh")], capture_output=True, text=True,
                       timeout=3600)
    assert p.returncode == 0, "lab/controlplane/build.sh failed:\n" + p.stderr[-4000:]
    path = Path(p.stdout.strip().splitlines()[-1]) / "kubelet-validate"
    assert os.access(path, os.X_OK), "build.sh did not produce %s" % path
    return str(path)


# failCgroupV1: the real validation refuses cgroup v1 hosts (1.35+ default); lab nodes mount cgroup2, but the
# test host may not.
BASE_CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
failCgroupV1: false
"""


def start_kubelet(node: Path, validator: str, *flags: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = os.environ.copy()
    env["GPUHARDEN_KUBELET_VALIDATE"] = validator
    p = subprocess.Popen([PY, "-m", "gpuharden_lab.standins.kubelet", "--config=/var/lib/kubelet/config.yaml",
                          "--healthz-port=%d" % port, "--healthz-bind-address=127.0.0.1", *flags],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return p, port


def run_kubelet_expect_exit(node: Path, validator: str, *flags: str) -> tuple[int, str]:
    p, _port = start_kubelet(node, validator, *flags)
    try:
        _out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, err


def healthz(port: int) -> tuple[int, str]:
    with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=2) as r:
        return r.status, r.read().decode()


def wait_healthy(p: subprocess.Popen, port: int) -> None:
    def ok():
        if p.poll() is not None:
            raise AssertionError("kubelet exited %s: %s" % (p.returncode, p.stderr.read()))
        try:
            return healthz(port) == (200, "ok")
        except OSError:
            return False

    wait_for(ok, timeout=30, what="healthz")


def stop_kubelet(p: subprocess.Popen) -> str:
    p.terminate()
    _o, err = p.communicate(timeout=20)
    assert p.returncode == 0
    return err


def test_kubelet_valid_config_serves_healthz_and_writes_checkpoints(node, validator):
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG)
    p, port = start_kubelet(node, validator, "--lab-no-device-plugin-mirror")
    wait_healthy(p, port)
    cpu = json.loads((node / "var/lib/kubelet/cpu_manager_state").read_text())
    mem = json.loads((node / "var/lib/kubelet/memory_manager_state").read_text())
    assert cpu["policyName"] == "none" and mem["policyName"] == "None"
    err = stop_kubelet(p)
    assert "Validated kubelet configuration" in err


def test_kubelet_rejects_invalid_config_with_real_validation(node, validator):
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "topologyManagerPolicy: bogus\n")
    rc, err = run_kubelet_expect_exit(node, validator)
    assert rc == 1
    assert "failed to validate kubelet configuration, error: " in err
    assert "topologyManagerPolicy" in err and "bogus" in err


def test_kubelet_config_file_errors(node, validator):
    # the kubelet falls back to lenient decoding for unknown fields: a typo is silently ignored...
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "cpuManagerPolicyy: static\n")
    p, port = start_kubelet(node, validator, "--lab-no-device-plugin-mirror")
    wait_healthy(p, port)
    assert 'cpuManagerPolicy="none"' in stop_kubelet(p)
    # ...but a file that is not YAML, or is not a KubeletConfiguration, stops it
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "cpuManagerPolicy: [static\n")
    rc, err = run_kubelet_expect_exit(node, validator)
    assert rc == 1 and "failed to load kubelet config file, path: /var/lib/kubelet/config.yaml" in err
    (node / "var/lib/kubelet/config.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    rc, err = run_kubelet_expect_exit(node, validator)
    assert rc == 1 and "failed to load kubelet config file" in err
    (node / "var/lib/kubelet/config.yaml").unlink()
    rc, err = run_kubelet_expect_exit(node, validator)
    assert rc == 1 and "failed to load kubelet config file" in err


def test_kubelet_stale_cpu_manager_state(node, validator):
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n")
    (node / "var/lib/kubelet/cpu_manager_state").write_text('{"policyName":"none","defaultCpuSet":"","checksum":0}')
    rc, err = run_kubelet_expect_exit(node, validator)
    assert rc == 1
    assert ('could not restore state from checkpoint: configured policy \\"static\\" differs from state checkpoint '
            'policy \\"none\\", please drain this node and delete the CPU manager checkpoint file '
            '\\"/var/lib/kubelet/cpu_manager_state\\" before restarting Kubelet') in err


def test_kubelet_stale_memory_manager_state(node, validator):
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG)
    (node / "var/lib/kubelet/memory_manager_state").write_text('{"policyName":"Static","machineState":{},"checksum":0}')
    rc, err = run_kubelet_expect_exit(node, validator)
    assert rc == 1
    assert "[memorymanager] configured policy \\\"None\\\" differs from state checkpoint policy \\\"Static\\\"" in err
    assert "delete the memory manager checkpoint file" in err


def test_kubelet_static_without_reserved_cpus(node, validator):
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "cpuManagerPolicy: static\n")
    rc, err = run_kubelet_expect_exit(node, validator)
    assert rc == 1
    assert "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero" in err
    assert not (node / "var/lib/kubelet/cpu_manager_state").exists()


def test_kubelet_flag_overrides_file(node, validator):
    # the file is valid; the flag makes it static without reservation -> the flag must win
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "cpuManagerPolicy: none\n")
    rc, err = run_kubelet_expect_exit(node, validator, "--cpu-manager-policy=static")
    assert rc == 1 and "static policy requires" in err
    # and a flag fixes a file the other way round
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "topologyManagerPolicy: bogus\n")
    p, port = start_kubelet(node, validator, "--topology-manager-policy=single-numa-node", "--lab-no-device-plugin-mirror")
    wait_healthy(p, port)
    err = stop_kubelet(p)
    assert 'topologyManagerPolicy="single-numa-node"' in err


def test_kubelet_config_dir_dropins_merge(node, validator):
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "cpuManagerPolicy: static\n")
    dd = node / "etc/kubernetes/kubelet.conf.d"
    dd.mkdir(parents=True)
    head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
    (dd / "10-reserve.conf").write_text(head + "kubeReserved:\n  memory: 1Gi\n")
    (dd / "20-reserve.conf").write_text(head + "kubeReserved:\n  cpu: 500m\n")  # merges into the map
    (dd / "30-topo.conf").write_text(head + "topologyManagerPolicy: restricted\n")
    (dd / "README").write_text("not a drop-in")
    p, port = start_kubelet(node, validator, "--config-dir=/etc/kubernetes/kubelet.conf.d",
                            "--lab-no-device-plugin-mirror")
    wait_healthy(p, port)
    err = stop_kubelet(p)
    assert 'topologyManagerPolicy="restricted"' in err and 'reservedCPU="500m"' in err
    assert json.loads((node / "var/lib/kubelet/cpu_manager_state").read_text())["policyName"] == "static"
    # a later drop-in removing the cpu reservation (null) breaks it again
    (node / "var/lib/kubelet/cpu_manager_state").unlink()
    (dd / "40-null.conf").write_text(head + "kubeReserved:\n  cpu: null\n")
    rc, err = run_kubelet_expect_exit(node, validator, "--config-dir=/etc/kubernetes/kubelet.conf.d")
    assert rc == 1 and "static policy requires" in err
    # a drop-in without apiVersion/kind is refused as by the kubelet
    (dd / "40-null.conf").write_text("cpuManagerPolicy: none\n")
    rc, err = run_kubelet_expect_exit(node, validator, "--config-dir=/etc/kubernetes/kubelet.conf.d")
    assert rc == 1 and "no apiVersion/kind" in err


def test_kubelet_k3s_args(node, validator):
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG)
    k3s = node / "etc/rancher/k3s"
    (k3s / "config.yaml.d").mkdir(parents=True)
    (node / "var/lib/rancher/k3s/agent/etc/kubelet.conf.d").mkdir(parents=True)
    (k3s / "config.yaml").write_text("kubelet-arg:\n  - cpu-manager-policy=static\n")
    (k3s / "config.yaml.d/50-x.yaml").write_text("kubelet-arg+:\n  - topology-manager-policy=bogus\n")
    assert kl.k3s_kubelet_args("/etc/rancher/k3s/config.yaml") == [
        "--cpu-manager-policy=static", "--topology-manager-policy=bogus"]
    rc, err = run_kubelet_expect_exit(node, validator, "--k3s-config=/etc/rancher/k3s/config.yaml")
    assert rc == 1 and "failed to validate kubelet configuration" in err


def test_kubelet_missing_validator_fails_loudly(node):
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG)
    rc, err = run_kubelet_expect_exit(node, "/nonexistent/kubelet-validate")
    assert rc == 1 and "kubelet-validate helper" in err


def test_kubelet_under_systemctl_restart_cycle(node, validator):
    """The product's flow: edit config, restart via systemctl, kubelet dies -> unit failed; fix -> active."""
    install_kubeadm_layout(node, binary="#!/bin/sh\nexec %s -m gpuharden_lab.standins.kubelet \"$@\" "
                                        "--healthz-port=%d --lab-no-device-plugin-mirror\n" % (PY, free_port()))
    (node / "etc/systemd/system.conf").write_text(
        "[Manager]\nDefaultEnvironment=GPUHARDEN_KUBELET_VALIDATE=%s\n" % validator)
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "cpuManagerPolicy: static\n")
    systemctl("daemon-reload", check=True)
    systemctl("start", "kubelet", check=True)
    wait_for(lambda: props("kubelet")["ActiveState"] == "failed", timeout=30, what="kubelet failed")
    assert props("kubelet")["Result"] == "exit-code"
    assert "static policy requires" in (node / "var/log/kubelet.log").read_text()
    (node / "var/lib/kubelet/config.yaml").write_text(BASE_CONFIG + "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n")
    systemctl("restart", "kubelet", check=True)
    time.sleep(3)
    assert systemctl("is-active", "kubelet").stdout.strip() == "active"


# ---------------------------------------------------------------------------------------------
# device-plugin mirroring (pure parts)

NODE = "gpu-1"


def dp_pod(node=NODE, phase="Running", env=None, args=None, image="nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
           labels=None, volumes=None, mounts=None, command=None) -> dict:
    c = {"name": "nvidia-device-plugin-ctr", "image": image, "env": env or [], "args": args or []}
    if command:
        c["command"] = command
    if mounts:
        c["volumeMounts"] = mounts
    return {"metadata": {"name": "dp-x", "namespace": "kube-system", "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [c], "volumes": volumes or []},
            "status": {"phase": phase}}


def gpu(mig=False, devices=(), name="NVIDIA H100 80GB HBM3"):
    return {"name": name, "mig_enabled": mig, "mig_devices": list(devices)}


def test_desired_no_plugin_or_not_running():
    inv = [gpu(), gpu()]
    assert kl.desired_nvidia_resources([], NODE, {}, inv) == {}
    assert kl.desired_nvidia_resources([dp_pod(phase="Pending")], NODE, {}, inv) == {}
    assert kl.desired_nvidia_resources([dp_pod(node="other")], NODE, {}, inv) == {}
    gfd = dp_pod(command=["/usr/bin/gpu-feature-discovery"])
    assert kl.desired_nvidia_resources([gfd], NODE, {}, inv) == {}
    other = dp_pod(image="busybox")
    assert kl.desired_nvidia_resources([other], NODE, {}, inv) == {}


def test_desired_whole_gpus_and_label_detection():
    inv = [gpu(), gpu(mig=True, devices=["1g.10gb"] * 7)]
    assert kl.desired_nvidia_resources([dp_pod()], NODE, {}, inv) == {"nvidia.com/gpu": 2}
    by_label = dp_pod(image="registry.local/custom:1", labels={"app.kubernetes.io/name": "nvidia-device-plugin"})
    assert kl.desired_nvidia_resources([by_label], NODE, {}, inv) == {"nvidia.com/gpu": 2}
    assert kl.desired_nvidia_resources([dp_pod()], NODE, {}, []) == {}


def test_desired_mig_single_and_mixed():
    inv = [gpu(mig=True, devices=["1g.10gb"] * 7), gpu(mig=True, devices=["1g.10gb"] * 7)]
    single = dp_pod(env=[{"name": "MIG_STRATEGY", "value": "single"}])
    assert kl.desired_nvidia_resources([single], NODE, {}, inv) == {"nvidia.com/gpu": 14}
    mixed = dp_pod(args=["--mig-strategy=mixed"])
    inv2 = [gpu(mig=True, devices=["1g.10gb", "1g.10gb", "3g.40gb"]), gpu()]
    assert kl.desired_nvidia_resources([mixed], NODE, {}, inv2) == {
        "nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-3g.40gb": 1, "nvidia.com/gpu": 1}
    # a GPU instance split into compute instances: one resource per compute instance, named after the GPU instance
    split = [gpu(mig=True, devices=["1c.3g.40gb"] * 3 + ["2g.20gb"])]
    assert kl.desired_nvidia_resources([mixed], NODE, {}, split) == {"nvidia.com/mig-3g.40gb": 3, "nvidia.com/mig-2g.20gb": 1}
    # arg beats env
    both = dp_pod(env=[{"name": "MIG_STRATEGY", "value": "single"}], args=["--mig-strategy", "none"])
    assert kl.desired_nvidia_resources([both], NODE, {}, inv2) == {"nvidia.com/gpu": 2}
    # single with mixed profiles or partly-MIG nodes: the plugin fails
    with pytest.raises(kl.PluginError):
        kl.desired_nvidia_resources([single], NODE, {}, inv2)
    with pytest.raises(kl.PluginError):
        kl.desired_nvidia_resources([single], NODE, {}, [gpu(mig=True, devices=["1g.10gb", "2g.20gb"])])
    with pytest.raises(kl.PluginError):
        kl.desired_nvidia_resources([dp_pod(args=["--mig-strategy=bogus"])], NODE, {}, inv)


def test_desired_from_configmap_config():
    # the custom name is ignored, as the real plugin ignores `resources` (DisableResourceNamingInConfig), and so is a
    # per-resource rename without renameByDefault
    cfg = ("version: v1\nflags:\n  migStrategy: mixed\nresources:\n  gpus:\n  - pattern: '*'\n    name: gpu-x\n"
           "sharing:\n  timeSlicing:\n    renameByDefault: false\n    resources:\n    - name: nvidia.com/gpu\n      rename: gpu-y\n"
           "      replicas: 4\n")
    pod = dp_pod(env=[{"name": "CONFIG_FILE", "value": "/config/config.yaml"}],
                 volumes=[{"name": "cfg", "configMap": {"name": "dp-config"}}],
                 mounts=[{"name": "cfg", "mountPath": "/config"}])
    cms = {("kube-system", "dp-config"): {"config.yaml": cfg}}
    inv = [gpu(), gpu(mig=True, devices=["2g.20gb"])]
    assert kl.desired_nvidia_resources([pod], NODE, cms, inv) == {"nvidia.com/gpu": 4, "nvidia.com/mig-2g.20gb": 1}
    # env beats the file
    pod["spec"]["containers"][0]["env"].append({"name": "MIG_STRATEGY", "value": "none"})
    assert kl.desired_nvidia_resources([pod], NODE, cms, inv) == {"nvidia.com/gpu": 8}
    # renameByDefault: every shared resource gets the .shared suffix
    cms[("kube-system", "dp-config")]["config.yaml"] = cfg.replace("renameByDefault: false", "renameByDefault: true")
    assert kl.desired_nvidia_resources([pod], NODE, cms, inv) == {"nvidia.com/gpu.shared": 8}
    # a config file the plugin cannot read makes it fail
    with pytest.raises(kl.PluginError):
        kl.desired_nvidia_resources([pod], NODE, {}, inv)


def test_status_patch():
    node = {"status": {"capacity": {"cpu": "8", "nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "7"},
                       "allocatable": {"cpu": "8", "nvidia.com/gpu": "8"}}}
    assert kl.status_patch(node, {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 7}) == {
        "status": {"allocatable": {"nvidia.com/mig-1g.10gb": "7"}}}
    assert kl.status_patch(node, {}) == {"status": {"capacity": {"nvidia.com/gpu": None, "nvidia.com/mig-1g.10gb": None},
                                                    "allocatable": {"nvidia.com/gpu": None}}}
    same = {"status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}}
    assert kl.status_patch(same, {"nvidia.com/gpu": 2}) is None
    assert kl.status_patch({"status": {}}, {}) is None


def test_json_merge_patch_and_flag_parsing():
    assert kl.json_merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"c": None, "d": 3}, "l": [2]}) == {
        "a": {"b": 1, "d": 3}, "l": [2]}
    flags, pos = kl.parse_flags(["--config", "/x", "--fail-swap-on", "--cpu_manager_policy=static", "--v=2"])
    assert pos == [] and flags == [("config", "/x"), ("fail-swap-on", None), ("cpu-manager-policy", "static"),
                                   ("v", "2")]


# ---------------------------------------------------------------------------------------------
# containerd


def run_containerd(node: Path, timeout: float = 60.0) -> tuple[int | None, str]:
    """Start the stand-in; return (None, stderr) once it says it booted, or (exit code, stderr) once it exits.

    Waits on those events, not on a fixed time: on a loaded CI machine the interpreter alone can take seconds
    to start, and a 3 s window once read a refusal that came late as a boot.
    """
    p = subprocess.Popen([PY, "-m", "gpuharden_lab.standins.containerd"], stderr=subprocess.PIPE, text=True,
                         env=os.environ.copy())
    watchdog = threading.Timer(timeout, p.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        for line in p.stderr:
            lines.append(line)
            if "successfully booted" in line:
                p.terminate()
                lines.append(p.stderr.read())
                p.wait()
                return None, "".join(lines)
        return p.wait(), "".join(lines)
    finally:
        watchdog.cancel()
        if p.poll() is None:
            p.kill()
            p.wait()


def test_containerd_config_handling(node):
    d = node / "etc/containerd"
    (d / "conf.d").mkdir(parents=True)
    (d / "config.toml").write_text('version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    (d / "conf.d/99-nvidia.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        'runtime_type = "io.containerd.runc.v2"\n')
    rc, err = run_containerd(node)
    assert rc is None and "runtimes=nvidia" in err  # still running: booted fine
    (d / "conf.d/99-nvidia.toml").write_text("version = 2\n[plugins\n")
    rc, err = run_containerd(node)
    assert rc == 1 and "failed to load TOML" in err
    (d / "conf.d/99-nvidia.toml").unlink()
    (d / "config.toml").write_text("version = 7\n")
    rc, err = run_containerd(node)
    assert rc == 1 and "unsupported config version" in err
    out = subprocess.run([PY, "-m", "gpuharden_lab.standins.containerd", "--version"], capture_output=True, text=True)
    assert out.stdout.startswith("containerd ")


def test_nvml_inventory_through_the_nvml_double(tmp_path):
    """The impure half: GPUs and MIG devices as pynvml reports them from the NVML double."""
    from gpuharden_lab.noderoot import build_node_root

    nr = build_node_root(tmp_path / "drv", "h100-mig-enabled")
    code = "import json; from gpuharden_lab.standins import kubelet as k; print(json.dumps(k.nvml_inventory()))"
    p = subprocess.run([PY, "-c", code], env={**os.environ, **nr.env()}, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    inv = json.loads(p.stdout)
    assert [g["mig_enabled"] for g in inv] == [True, True, True, False]
    assert inv[0]["mig_devices"] == ["1g.10gb"] * 7
    mixed = kl.desired_nvidia_resources([dp_pod(args=["--mig-strategy=mixed"])], NODE, {}, inv)
    assert mixed["nvidia.com/mig-1g.10gb"] == 7 and mixed["nvidia.com/gpu"] == 1
    assert kl.desired_nvidia_resources([dp_pod()], NODE, {}, inv) == {"nvidia.com/gpu": 4}
