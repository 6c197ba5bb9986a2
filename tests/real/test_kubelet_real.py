# SPDX-License-Identifier: GPL-3.0-or-later
"""The real kubelet is the judge: what kubelet_config writes on a kubeadm node, the real kubelet (standalone, on the
real containerd) starts with and runs; the stale CPU Manager checkpoint the module reports is the one the real kubelet
refuses to start with, and removing it (remove_stale_state, what the kubelet_topology role does) lets it start.

The node tree is what kubeadm leaves: /var/lib/kubelet/config.yaml, kubeadm-flags.env with --config-dir. This machine
is hybrid cgroup v1 without systemd (real-components.md): the kubelet starts only with failCgroupV1: false,
cgroupsPerQOS: false, enforceNodeAllocatable: [] and cgroupDriver: cgroupfs. Those, and what a kubelet without an API
server needs (no webhook authn/authz, no client CA, no certificate rotation) plus the temp-root paths, live in a
separate LAB-ONLY drop-in (LAB_DROPIN), apart from what the product manages (its own drop-in, 50-gpuharden.conf).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.real import daemons
from tests.unit.conftest import run_module
from tests.unit.test_containerd import install

pytestmark = pytest.mark.real

UNIT_FIXTURE = Path(__file__).parent.parent / "unit" / "fixtures" / "kubelet" / "kubeadm" / "etc"
CONFIG_DIR = "/etc/kubernetes/kubelet.conf.d"
PRODUCT_DROPIN = CONFIG_DIR + "/50-gpuharden.conf"
LAB_DROPIN = CONFIG_DIR + "/90-lab-standalone-hybrid-cgroupv1.conf"
CHECKPOINT = "/var/lib/kubelet/cpu_manager_state"
TOPOLOGY = {"topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static", "reserved_system_cpus": "0"}

# /var/lib/kubelet/config.yaml as `kubeadm join` writes it (kubeadm cmd/kubeadm/app/componentconfigs/kubelet.go
# defaults: webhook authn/authz, client CA, healthz on 127.0.0.1:10248, certificate rotation, static pod path;
# containerRuntimeEndpoint from nodeRegistration.criSocket since kubeadm v1.27).
KUBEADM_CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: unix:///var/run/containerd/containerd.sock
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
resolvConf: /run/systemd/resolve/resolv.conf
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"""

LAB_TEXT = """\
# LAB ONLY (tests/real/test_kubelet_real.py), never written by gpuharden.
# 1. This test machine is hybrid cgroup v1 and PID 1 is not systemd (real-components.md): without these the
#    kubelet refuses to start ("kubelet is configured to not run on a host using cgroup v1").
# 2. Standalone (no --kubeconfig, no API server): no webhook authn/authz, no client CA, no certificate rotation.
# 3. Paths and the CRI endpoint in the test's temp root.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
cgroupDriver: cgroupfs
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
  x509:
    clientCAFile: ""
authorization:
  mode: AlwaysAllow
rotateCertificates: false
resolvConf: /etc/resolv.conf
containerRuntimeEndpoint: unix://%(socket)s
staticPodPath: %(root)s/etc/kubernetes/manifests
"""


@pytest.fixture
def runtime(tmp_path, world_tmp, host_guard):
    """The real containerd (2.x, config v4 with the nvidia runtime from containerd_nvidia_runtime): its CRI socket."""
    version = daemons.versions()["CONTAINERD_VERSION"]
    daemons.kubelet_bin()  # skip before starting anything when the kubelet is not built
    root = install(world_tmp / "containerd-node", "v4-single.toml")
    result = run_module("containerd_nvidia_runtime", {"root": str(root)}, {})
    assert result["changed"] is True, result
    jailed = daemons.jail_containerd(root, result["files"][0], result["files"], version)
    daemon = daemons.start_containerd(version, jailed["config"], tmp_path / "containerd.log")
    try:
        assert daemons.wait_containerd(daemon, version, jailed["socket"]), daemon.text()[-3000:]
        yield jailed["socket"]
    finally:
        daemon.stop()


@pytest.fixture
def kubelets(tmp_path):
    started = []

    def start(root, name):
        daemon = daemons.start_kubelet(root, root / "jail", tmp_path / ("kubelet-%s.log" % name))
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def kubeadm_node(base: Path, socket: Path) -> Path:
    """A fresh kubeadm node: the kubelet unit and kubeadm drop-in, config.yaml, kubeadm-flags.env with --config-dir,
    and the lab-only drop-in."""
    root = base / "node"
    shutil.copytree(UNIT_FIXTURE, root / "etc")
    files = {
        "/var/lib/kubelet/config.yaml": KUBEADM_CONFIG,
        "/var/lib/kubelet/kubeadm-flags.env": 'KUBELET_KUBEADM_ARGS="--config-dir=%s"\n' % CONFIG_DIR,
        LAB_DROPIN: LAB_TEXT % {"socket": socket, "root": root},
    }
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (root / "etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)
    (root / "jail").mkdir()
    return root


def kubelet_config(root: Path, **args) -> dict:
    return run_module("kubelet_config", {"root": str(root), **TOPOLOGY, **args}, {})


def assert_serving(daemon) -> dict:
    assert daemons.wait_kubelet_healthy(daemon), "kubelet not healthy (rc %s):\n%s" % (daemon.returncode(), daemon.text()[-6000:])
    return daemons.kubelet_configz(daemon)


def test_kubeadm_node_topology_and_static_cpu_manager_run_on_the_real_kubelet(world_tmp, runtime, kubelets):
    root = kubeadm_node(world_tmp, runtime)
    # before: the kubelet as kubeadm left it (policies none); it writes its own cpu_manager_state
    first = kubelets(root, "before")
    config = assert_serving(first)
    assert (config["cpuManagerPolicy"], config["topologyManagerPolicy"]) == ("none", "none")
    assert config["failCgroupV1"] is False and config["cgroupsPerQOS"] is False  # the lab drop-in is read
    # the CPU Manager writes its checkpoint when it starts, which can come after /configz answers (a loaded machine
    # stopped the kubelet before it had)
    assert daemons.wait_for(lambda: (root / CHECKPOINT.lstrip("/")).exists(), 60, first), "no cpu_manager_state written"
    first.stop()
    checkpoint = json.loads((root / CHECKPOINT.lstrip("/")).read_text())
    assert checkpoint["policyName"] == "none"

    # the product: the settings go into its own drop-in (the node reads --config-dir); the real checkpoint is stale
    result = kubelet_config(root)
    assert result["changed"] is True and not result.get("failed"), result
    assert [entry["path"] for entry in result["files"] if entry["changed"]] == [PRODUCT_DROPIN], result["files"]
    assert [entry["path"] for entry in result["stale_state_files"]] == [CHECKPOINT], result["stale_state_files"]
    assert result["restart_required"] is True and result["persistence"] == "durable"

    # the real kubelet refuses the stale checkpoint, as the module said
    refused = kubelets(root, "stale")
    rc = refused.wait_exit(60)
    log = refused.text()
    assert rc not in (None, 0), "kubelet started with a stale checkpoint:\n%s" % log[-4000:]
    # pkg/kubelet/cm/cpumanager/state/state_checkpoint.go (quotes escaped in the structured log line)
    assert re.search(r'configured policy \\?"static\\?" differs from state checkpoint policy \\?"none\\?"', log), log[-4000:]
    assert "please drain this node and delete the CPU manager checkpoint file" in log
    assert str(root / CHECKPOINT.lstrip("/")) in log

    # removing it (kubelet_topology: remove_stale_state with the kubelet stopped) lets it start with the policies
    removed = kubelet_config(root, remove_stale_state=True)
    assert removed["changed"] is True and not (root / CHECKPOINT.lstrip("/")).exists(), removed
    running = kubelets(root, "after")
    config = assert_serving(running)
    assert config["cpuManagerPolicy"] == "static"
    assert config["topologyManagerPolicy"] == "single-numa-node"
    assert config["reservedSystemCPUs"] == "0"
    assert config["failCgroupV1"] is False and config["cgroupsPerQOS"] is False  # the lab drop-in still applies
    # as before the change: the checkpoint can come after /configz answers (a fresh-clone run read it too early)
    assert daemons.wait_for(lambda: (root / CHECKPOINT.lstrip("/")).exists(), 60, running), "no cpu_manager_state written"
    written = json.loads((root / CHECKPOINT.lstrip("/")).read_text())
    assert written["policyName"] == "static", written
    log = running.text()
    # pkg/kubelet/cm/topologymanager/topology_manager.go, pkg/kubelet/cm/cpumanager/cpu_manager.go
    assert re.search(r'Creating topology manager with policy per scope.*topologyPolicyName=\\?"single-numa-node', log), log[-4000:]
    assert re.search(r'cpu_manager.go:\d+\] "Starting" policy=\\?"static', log), log[-4000:]
    # kubelet 1.36 takes the cgroup driver from the CRI runtime (cmd/kubelet/app/server.go getCgroupDriverFromCRI:
    # containerd reports SystemdCgroup of its default runtime), not from cgroupDriver in the files
    driver = re.search(r'Using cgroup driver setting received from the CRI runtime" cgroupDriver=\\?"(\w+)', log)
    assert driver and config["cgroupDriver"] == driver.group(1) == "systemd", (driver, config["cgroupDriver"])

    # and the module agrees with what now runs: nothing to change, nothing stale
    again = kubelet_config(root)
    assert again["changed"] is False and again["stale_state_files"] == [] and again["restart_required"] is False, again


# ---------------------------------------------------------------------------------------------
# what the real kubelet refuses to start with, kubelet_config refuses before writing (and writes nothing)

OTHER_DROPIN = CONFIG_DIR + "/60-other.conf"
HEADER = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
KUBELET_REFUSES = {
    # case: (module params, files on the node (both sides), the drop-in the daemon side gets in the module's place
    #        (what writing the values without the module's check would give), what the kubelet says, module fragments)
    "static-cpu-manager-without-reservation": (
        {"cpu_manager_policy": "static"}, {}, HEADER + "cpuManagerPolicy: static\n",
        # pkg/kubelet/cm/cpumanager/cpu_manager.go NewManager (no reservation at all: nodeAllocatableReservation has
        # no cpu entry; the "greater than zero" message there is for an explicit zero)
        r"\[cpumanager\] unable to determine reserved CPU resources for static policy",
        ["cpuManagerPolicy static without reserved CPUs", "the kubelet refuses to start"]),
    "memory-manager-reservation-not-node-allocatable": (
        {"memory_manager_policy": "Static", "reserved_memory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}, {},
        HEADER + "memoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits:\n    memory: 1Gi\n",
        # pkg/kubelet/cm/memorymanager/memory_manager.go validateReservedMemory
        r'the total amount \\?"1Gi\\?" of type \\?"memory\\?" is not equal to the value \\?"100Mi\\?" determined by Node Allocatable',
        ["memoryManagerPolicy Static", "memory=1Gi", "100Mi", "the kubelet refuses to start"]),
    "drop-in-without-kind": (
        dict(TOPOLOGY), {OTHER_DROPIN: "apiVersion: kubelet.config.k8s.io/v1beta1\nmaxPods: 50\n"}, None,
        # cmd/kubelet/app/server.go mergeKubeletConfigurations / loadDropinConfigFileIntoJSON, the decoder's error
        # from k8s.io/apimachinery pkg/runtime/error.go (missingKindErr)
        r"failed to load kubelet dropin file, path: \S*60-other\.conf, error: Object 'Kind' is missing",
        [OTHER_DROPIN, "without kind", "the kubelet refuses it"]),
}


@pytest.mark.parametrize("case", sorted(KUBELET_REFUSES))
def test_what_the_real_kubelet_refuses_the_module_refuses(world_tmp, runtime, kubelets, case):
    params, files, dropin, said, fragments = KUBELET_REFUSES[case]
    # the real kubelet on that input
    daemon_root = kubeadm_node(world_tmp / "daemon", runtime)
    for path, text in {**files, **({PRODUCT_DROPIN: dropin} if dropin else {})}.items():
        (daemon_root / path.lstrip("/")).write_text(text)
    refused = kubelets(daemon_root, case)
    rc = refused.wait_exit(60)
    log = refused.text()
    assert rc not in (None, 0), "kubelet kept running with %s:\n%s" % (case, log[-4000:])
    assert re.search(said, log), log[-4000:]
    # the module on the same node: refuses, names the problem, writes nothing
    root = kubeadm_node(world_tmp / "module", runtime)
    for path, text in files.items():
        (root / path.lstrip("/")).write_text(text)
    before = sorted((str(path), path.read_bytes()) for path in root.rglob("*") if path.is_file())
    result = run_module("kubelet_config", {"root": str(root), **params}, {})
    assert result.get("failed") is True, result
    for fragment in fragments:
        assert fragment in result["msg"], (fragment, result["msg"])
    assert sorted((str(path), path.read_bytes()) for path in root.rglob("*") if path.is_file()) == before


def test_memory_manager_static_as_the_module_checks_it_runs_on_the_real_kubelet(world_tmp, runtime, kubelets):
    # reservedMemory equal to kubeReserved + systemReserved + the default evictionHard memory.available (100Mi)
    root = kubeadm_node(world_tmp, runtime)
    result = run_module("kubelet_config", {"root": str(root), "memory_manager_policy": "Static",
                                           "reserved_memory": [{"numaNode": 0, "limits": {"memory": "100Mi"}}]}, {})
    assert result["changed"] is True and not result.get("failed"), result
    running = kubelets(root, "memory-manager")
    config = assert_serving(running)
    assert config["memoryManagerPolicy"] == "Static"
    assert config["reservedMemory"] == [{"numaNode": 0, "limits": {"memory": "100Mi"}}]
    # like the CPU Manager's checkpoint, the Memory Manager's state is written when it starts, which can come after
    # /configz answers (a loaded machine got there first once)
    state = root / "var/lib/kubelet/memory_manager_state"
    assert daemons.wait_for(state.exists, 60, running), "no memory_manager_state written"
    assert json.loads(state.read_text())["policyName"] == "Static"
