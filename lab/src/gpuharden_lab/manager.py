# SPDX-License-Identifier: GPL-3.0-or-later
"""`gpuharden lab up | status | down`: bring a scenario's fleet up, report it, remove all of it."""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gpuharden_lab import NVML_LIBRARY_DIR, REPO_ROOT, cluster, controlplane, layout, operatornode, realnode, workloads
from gpuharden_lab import node as lab_node
from gpuharden_lab.noderoot import load_fixture
from gpuharden_lab.scenario import Scenario, load
from gpuharden_lab.system import NODE_WORKERS, LabError, cgroup_v1_hierarchies, kill_cgroup_tree, require_root, run

# Where a GPU node keeps its driver library (the NVML double), named in /etc/ld.so.conf.d as a driver install does.
DRIVER_LIBRARY_DIR = "/usr/local/nvidia/lib64"

# The node's Python gets only what node-side modules need, so a module that needs more fails in the lab.
NODE_PYTHON_PACKAGES = ["nvidia-ml-py>=12.535,<14", "ruamel.yaml>=0.18,<0.20", "tomlkit>=0.13,<0.16", "PyYAML>=6,<7"]


def _log(message: str) -> None:
    print("lab: %s" % message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _build_lock(path: Path):
    """Labs of other instances may come up at the same moment: one builds, the others wait and find it built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_node_python() -> Path:
    python = layout.NODE_PYTHON / "bin" / "python"
    stamp = layout.NODE_PYTHON / ".packages"
    wanted = "\n".join(NODE_PYTHON_PACKAGES)
    with _build_lock(layout.NODE_PYTHON.with_name(layout.NODE_PYTHON.name + ".lock")):
        if python.exists() and stamp.exists() and stamp.read_text() == wanted:
            return python
        shutil.rmtree(layout.NODE_PYTHON, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(layout.NODE_PYTHON)])
        run([str(python), "-m", "pip", "install", "-q", *NODE_PYTHON_PACKAGES])
        stamp.write_text(wanted)
    return python


def ensure_nvml_double() -> Path:
    library = NVML_LIBRARY_DIR / "libnvidia-ml.so.1"
    with _build_lock(NVML_LIBRARY_DIR.with_name(NVML_LIBRARY_DIR.name + ".lock")):
        if not library.exists():
            run(["sh", str(REPO_ROOT / "tests/fakes/nvml/build.sh"), str(NVML_LIBRARY_DIR)])
    return library


# Every real kubelet and containerd takes inotify instances (cAdvisor, the CRI's and the kubelet's file watchers), and
# the limit is per user, so the lab's real nodes share root's on this host: the default 128 runs out at about ten real
# nodes across the labs of one machine, and the kubelet then exits with "Failed to start cAdvisor ... inotify_init: too
# many open files".  kind asks its hosts for the same (kind docs, known-issues: "Pod errors due to too many open
# files").  The lab raises these host limits and never lowers them.
INOTIFY_LIMITS = {"fs/inotify/max_user_instances": 8192, "fs/inotify/max_user_watches": 1048576}


def raise_inotify_limits(sysctl_root: Path = Path("/proc/sys")) -> None:
    for name, wanted in INOTIFY_LIMITS.items():
        path = sysctl_root / name
        if int(path.read_text()) < wanted:
            _log("raising %s to %d for the real nodes' kubelets and containerds" % (name.replace("/", "."), wanted))
            path.write_text("%d\n" % wanted)


def _ssh_keys() -> None:
    layout.SSH_DIR.mkdir(parents=True, exist_ok=True)
    layout.SSH_DIR.chmod(0o700)
    for name in ("host_ed25519", "id_ed25519"):
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuharden-lab", "-f", str(layout.SSH_DIR / name)])
    (layout.SSH_DIR / "authorized_keys").write_text((layout.SSH_DIR / "id_ed25519.pub").read_text())


def _bridge() -> None:
    run(["ip", "link", "add", layout.BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", "%s/%d" % (layout.BRIDGE_ADDRESS, layout.PREFIX_LENGTH), "dev", layout.BRIDGE])
    run(["ip", "link", "set", layout.BRIDGE, "up"])


STANDINS = {"/usr/local/sbin/systemctl": "systemctl", "/usr/local/bin/kubelet": "kubelet", "/usr/local/bin/containerd": "containerd"}


def _node_files(node: lab_node.Node, library: Path, validator: Path | None) -> None:
    """What every lab node has besides its scenario files: the NVML double as its driver library and
    the stand-ins for systemctl, kubelet and containerd (the only doubles besides NVML)."""
    if node.spec.fixture is not None:  # CPU-only nodes have no driver library
        # As the driver's installer lays it out: the versioned library, the soname link, the loader's cache (node.py
        # runs ldconfig).  The NVIDIA container toolkit finds the driver's directory from the versioned name.
        version = load_fixture(node.spec.fixture)[1]["driver_version"]
        node.write_file("%s/libnvidia-ml.so.%s" % (DRIVER_LIBRARY_DIR, version), library.read_bytes(), mode=0o755)
        node.write_symlink("%s/libnvidia-ml.so.1" % DRIVER_LIBRARY_DIR, "libnvidia-ml.so.%s" % version)
        node.write_file("/etc/ld.so.conf.d/000-nvidia.conf", DRIVER_LIBRARY_DIR + "\n")
    for path, standin in STANDINS.items():
        if node.spec.real_containerd is not None and standin != "systemctl":
            continue
        node.write_file(path, '#!/bin/sh\n# gpuharden lab stand-in\nexec %s -m gpuharden_lab.standins.%s "$@"\n' % (sys.executable, standin), 0o755)
    if node.spec.real_containerd is not None:
        release = node.spec.real_containerd
        node.write_file("/usr/local/bin/kubelet", realnode.kubelet_wrapper(node.address), 0o755)
        node.write_file("/usr/local/bin/containerd", realnode.containerd_wrapper(release), 0o755)
        node.write_file("/usr/local/bin/ctr", realnode.ctr_wrapper(release), 0o755)
        node.write_file(realnode.LAB_BIN + "/runc", realnode.runc_wrapper(), 0o755)
        main_config = realnode.default_containerd_config(release)
        node.write_file("/etc/containerd/config.toml", main_config)
        node.write_file("/etc/cni/net.d/10-gpuharden-lab.conflist", realnode.cni_conflist())
        node.write_file("/etc/kubernetes/manifests/.keep", "")  # kubeadm creates staticPodPath; the kubelet skips dot files
        if node.spec.real_nvidia_runtime == "operator":
            # The GPU Operator's toolkit container has run: its toolkit under /usr/local/nvidia/toolkit, its drop-in
            # (operatornode.py); no toolkit package on the host.
            for path, (content, mode) in operatornode.toolkit_files(main_config, realnode.container_toolkit_binaries()).items():
                node.write_file(path, content, mode)
        elif node.spec.fixture is not None:
            # The real NVIDIA container toolkit, where its package installs it: containerd's nvidia runtime names
            # /usr/bin/nvidia-container-runtime (BinaryName), which finds nvidia-cdi-hook beside it.
            for name, binary in realnode.container_toolkit_binaries().items():
                node.write_file("/usr/bin/" + name, binary.read_bytes(), 0o755)
    elif node.spec.fixture is not None:
        # Stand-in nodes: containerd is the stand-in too, so only the runtime's presence is checked.
        node.write_file("/usr/bin/nvidia-container-runtime", "#!/bin/sh\n# gpuharden lab stand-in for the NVIDIA container toolkit\nexec runc \"$@\"\n", 0o755)
    environment = ["GPUHARDEN_NODE_NAME=%s" % node.name]
    if validator is not None:
        environment.append("GPUHARDEN_KUBELET_VALIDATE=%s" % validator)
    # Services start with systemd's default environment, not the SSH session's.
    node.write_file("/etc/systemd/system.conf", "[Manager]\nDefaultEnvironment=%s\n" % " ".join(environment))


def _import_images(node: lab_node.Node, timeout: float = 30.0) -> None:
    """Give a real node's containerd the images a real node would have pulled (no registry is reachable here), before
    the kubelet asks for a pod: the sandbox image its config names and, on a GPU node, the device plugin image of each
    pinned release.  ctr waits for containerd's socket."""
    name = realnode.sandbox_image_name(node.upper_path("/etc/containerd/config.toml").read_text())
    images = [(name, realnode.sandbox_image_archive(name))]
    if node.spec.fixture is not None:
        images += [realnode.device_plugin_image_archive(release) for release in realnode.device_plugin_releases()]
    for index, (name, data) in enumerate(images):
        archive = node.directory / ("image-%d.tar" % index)
        archive.write_bytes(data)
        deadline = time.monotonic() + timeout
        while True:
            done = lab_node.run_in(node, ["ctr", "--namespace", "k8s.io", "images", "import", str(archive)], check=False)
            if done.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise LabError("node %s: ctr could not import the image %s: %s" % (node.name, name, done.stderr.strip()[-500:]))
            time.sleep(0.2)
        archive.unlink()


def _start_services(nodes: list[lab_node.Node]) -> dict[str, str]:
    """Start containerd and the kubelet in every node through its systemctl, as boot would.  The nodes boot side by
    side, as a fleet's do; each node's units start in its own order."""

    def boot(node: lab_node.Node) -> str:
        if node.spec.real_nvidia_runtime == "default":
            done = lab_node.run_in(node, list(realnode.NVIDIA_CTK_CONFIGURE), check=False)
            if done.returncode != 0:
                raise LabError("node %s: %s failed: %s" % (node.name, " ".join(realnode.NVIDIA_CTK_CONFIGURE), done.stderr.strip()[-500:]))
        if node.spec.real_nvidia_runtime == "operator":
            lab_node.run_in(node, ["sh", "-c", operatornode.DRIVER_ROOT_SCRIPT])  # the driver container's root (operatornode.py)
        for unit in ("containerd", node.spec.kubelet_unit):
            lab_node.run_in(node, ["systemctl", "enable", "--now", unit], check=False)
            if unit == "containerd" and node.spec.real_containerd is not None:
                _import_images(node)
        return lab_node.run_in(node, ["systemctl", "is-active", node.spec.kubelet_unit], check=False).stdout.strip()

    with concurrent.futures.ThreadPoolExecutor(max_workers=NODE_WORKERS) as pool:
        return dict(zip([node.name for node in nodes], pool.map(boot, nodes), strict=True))


def _seed_after_join(nodes: list[lab_node.Node]) -> None:
    """The seeds a real node gets once its Node joined (NodeSpec.seeded_after_join): the files, then a kubelet
    restart, whose outcome is the seed's (the real kubelet may refuse to start on them)."""
    for node in nodes:
        if not node.spec.seeded_after_join:
            continue
        for path, content in node.spec.seeded_after_join.items():
            node.write_live(path, content)
        done = lab_node.run_in(node, ["systemctl", "restart", node.spec.kubelet_unit], check=False)
        if done.returncode != 0:
            raise LabError("node %s: systemctl restart %s failed: %s" % (node.name, node.spec.kubelet_unit, done.stderr.strip()[-500:]))


def run_harden(inventory: str, extra_vars: dict, timeout: float = 1200, limit: str | None = None) -> subprocess.CompletedProcess:
    """The product's own harden playbook over a lab inventory, as an adopter runs it: under the tool's identity, over
    SSH, with this checkout's ansible.cfg, on the hosts of ``limit`` (``--limit``) or all.  Its output is the caller's
    to judge."""
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", inventory,
            str(REPO_ROOT / "playbooks" / "harden_gpu_nodes.yml"), "-e", json.dumps(extra_vars)]
    if limit:
        argv += ["--limit", limit]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False, timeout=timeout)


def _harden(inventory: str, extra_vars: dict) -> None:
    """Bring the fleet to the scenario's state the way an adopter does (run_harden).  A failed run fails `up`: the
    scenario's state was not reached."""
    try:
        done = run_harden(inventory, extra_vars)
    except subprocess.TimeoutExpired as expired:
        raise LabError("the harden run that brings the fleet to its scenario's state did not end within %.0f s" % expired.timeout) from None
    if done.returncode != 0:
        raise LabError("the harden run that brings the fleet to its scenario's state failed (rc %d):\n%s\n%s"
                       % (done.returncode, done.stdout[-6000:], done.stderr[-2000:]))


def write_inventory(scenario: Scenario, nodes: list[lab_node.Node], python: Path, kube: dict | None) -> Path:
    host_key = (layout.SSH_DIR / "host_ed25519.pub").read_text().split()
    known_hosts = "".join("%s %s %s\n" % (node.address, host_key[0], host_key[1]) for node in nodes)
    (layout.SSH_DIR / "known_hosts").write_text(known_hosts)
    hosts = {node.name: {"ansible_host": node.address} for node in nodes}
    for node in nodes:
        if node.upper_path(workloads.MEMORY_VIEW_ROOT).exists():
            hosts[node.name]["gpuharden_cgroup_root"] = workloads.MEMORY_VIEW_ROOT
    inventory = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(layout.SSH_DIR / "id_ed25519"),
                "ansible_ssh_common_args": "-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes"
                % (layout.SSH_DIR / "known_hosts"),
                "ansible_python_interpreter": str(python),
                "gpuharden_lab_scenario": scenario.name,
                # The lab's fleet opts into the static CPU Manager as an adopter's inventory does: the product
                # leaves CPU and Memory Manager policies alone unless asked (roles/kubelet_topology/defaults).
                "kubelet_topology_cpu_manager_policy": "static",
                "kubelet_topology_reserved_system_cpus": "0-1",
                **(
                    {"gpuharden_kubeconfig": kube["tool_kubeconfig"], "gpuharden_lab_admin_kubeconfig": kube["admin_kubeconfig"]}
                    if kube
                    else {}
                ),
            },
            "children": {"gpu_nodes": {"hosts": hosts}},
        }
    }
    if any(node.spec.real_containerd is not None and node.spec.fixture is not None for node in nodes):
        # No registry is reachable: the real nodes hold only the plugin images the lab imported (realnode.py), so the
        # fleet runs the pinned release, as an air-gapped adopter pins the one they mirrored.
        inventory["all"]["vars"]["device_plugin_version"] = realnode.versions()["NVIDIA_DEVICE_PLUGIN_VERSION"]
    layout.INVENTORY_DIR.mkdir(parents=True, exist_ok=True)
    target = layout.INVENTORY_FILE
    target.write_text(
        "# Generated by `gpuharden lab up --scenario %s`; removed by `gpuharden lab down`.\n" % scenario.name
        + yaml.safe_dump(inventory, sort_keys=False)
    )
    return target


def _save_state(state: dict) -> None:
    layout.STATE_FILE.write_text(json.dumps(state, indent=2, sort_keys=True))


def load_state() -> dict | None:
    try:
        return json.loads(layout.STATE_FILE.read_text())
    except FileNotFoundError:
        return None


def nodes_from_state(state: dict) -> list[lab_node.Node]:
    scenario = load(state["scenario"], node_count=state.get("node_count"), stand_ins=state.get("stand_ins", False))
    return [lab_node.Node(spec, index) for index, spec in enumerate(scenario.nodes)]


def up(scenario_name: str, node_count: int | None = None, *, with_cluster: bool = True, kwok_nodes: int = 0,
       harden: bool = True, stand_ins: bool = False) -> dict:
    """Bring the scenario's fleet up.  A scenario with `harden:` is reached by running the product's harden playbook
    on the fleet as installed; `harden=False` (or no cluster) leaves the fleet as installed.  `stand_ins` runs every
    node on the stand-in kubelet and containerd (scenario.load)."""
    require_root()
    if layout.STATE_FILE.exists() or layout.LAB_DIR.exists():
        raise LabError("a lab is already up (%s): run `gpuharden lab down` first" % layout.LAB_DIR)
    scenario = load(scenario_name, node_count=node_count, stand_ins=stand_ins)
    started = time.monotonic()
    timings: dict[str, float] = {}
    try:
        layout.LAB_DIR.mkdir(parents=True)
        state = {"scenario": scenario.name, "node_count": node_count, "stand_ins": stand_ins, "status": "starting", "nodes": {}}
        _save_state(state)
        phase = time.monotonic()
        python = ensure_node_python()
        library = ensure_nvml_double()
        timings["prerequisites"] = time.monotonic() - phase
        if any(spec.real_containerd is not None for spec in scenario.nodes):
            raise_inotify_limits()
        _ssh_keys()
        _bridge()
        layout.lab_cgroup().mkdir(parents=True, exist_ok=True)
        nodes = [lab_node.Node(spec, index) for index, spec in enumerate(scenario.nodes)]
        phase = time.monotonic()
        for node in nodes:
            lab_node.prepare(node)
            state["nodes"][node.name] = {"address": node.address, "netns": node.netns, "fixture": node.spec.fixture}
        timings["prepare_nodes"] = time.monotonic() - phase
        credentials = controlplane.prepare([node.name for node in nodes]) if with_cluster else None
        validator = Path(controlplane.binaries()) / "kubelet-validate" if with_cluster else None
        for node in nodes:
            _node_files(node, library, validator)
        if credentials:
            for node in nodes:
                if node.spec.real_containerd is not None:
                    kubeconfig = realnode.node_kubeconfig(node.name, controlplane.API_URL, node.directory / "pki")
                else:
                    kubeconfig = controlplane.node_kubeconfig(credentials, node.name)
                node.write_file("/etc/kubernetes/kubelet.conf", kubeconfig, 0o600)
        phase = time.monotonic()
        for node in nodes:
            lab_node.start(node)
        timings["start_nodes"] = time.monotonic() - phase
        kube = None
        if credentials:
            kube = controlplane.start(credentials, [node.netns for node in nodes])
            timings.update(kube.pop("timings"))
            api = cluster.api_client(kube["admin_kubeconfig"])
            rbac = REPO_ROOT / "deploy" / "rbac" / "gpuharden-rbac.yaml"
            if rbac.exists():
                token = cluster.install_tool_identity(api, rbac)
                Path(kube["tool_kubeconfig"]).write_text(controlplane.kubeconfig(token, "system:serviceaccount:gpuharden-system:gpuharden"))
                kube["tool_identity"] = "system:serviceaccount:gpuharden-system:gpuharden"
            fixtures = {node.name: load_fixture(node.spec.fixture)[1] for node in nodes}
            cluster.create_nodes(api, nodes, fixtures)
            names = [node.name for node in nodes if node.spec.real_containerd is None]
            real_nodes = [node for node in nodes if node.spec.real_containerd is not None]
            if kwok_nodes:
                phase = time.monotonic()
                names += cluster.create_kwok_only_nodes(api, kwok_nodes)
                timings["kwok_nodes"] = time.monotonic() - phase
                state["kwok_nodes"] = kwok_nodes
            timings["nodes_ready"] = cluster.wait_nodes_ready(api, names, timeout=60 + kwok_nodes / 20)
            phase = time.monotonic()
            state["services"] = _start_services(nodes)
            timings["services"] = time.monotonic() - phase
            if real_nodes:
                phase = time.monotonic()
                timings["real_nodes_ready"] = cluster.wait_nodes_ready(api, [node.name for node in real_nodes], timeout=120)
                cluster.label_registered_nodes(api, real_nodes)
                _seed_after_join(real_nodes)
            cluster.apply_objects(api, scenario.cluster.get("objects") or [])
            phase = time.monotonic()
            state["pods"] = [vars(pod) for pod in workloads.place(api, {node.name: node for node in nodes}, scenario.pods)]
            timings["pods"] = time.monotonic() - phase
            state["cluster"] = kube
        state["inventory"] = str(write_inventory(scenario, nodes, python, kube))
        if scenario.harden is not None and harden and kube:
            phase = time.monotonic()
            _harden(state["inventory"], scenario.harden)
            timings["harden"] = time.monotonic() - phase
        state["status"] = "up"
        timings["total"] = time.monotonic() - started
        state["timings"] = {key: round(value, 2) for key, value in timings.items()}
        _save_state(state)
        return state
    except BaseException:
        _log("up failed; removing what was created")
        down()
        raise


def _lab_pids() -> list[int]:
    """Processes left from a lab whose cgroup is gone: anything whose command line names the lab dir."""
    pids = []
    marker = (str(layout.LAB_DIR) + "/").encode()  # not the lock file beside it
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def leftovers() -> list[str]:
    """Everything with the lab's prefix that still exists on the host."""
    found = []
    netns = run(["ip", "netns", "list"], check=False).stdout
    found += ["netns " + line.split()[0] for line in netns.splitlines() if line.startswith(layout.PREFIX)]
    links = run(["ip", "-o", "link", "show"], check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(layout.PREFIX):
            found.append("link " + name)
    for cgroup in [layout.lab_cgroup()] + [layout.in_v1_hierarchy(layout.lab_cgroup(), hierarchy) for hierarchy in cgroup_v1_hierarchies()]:
        if cgroup.exists():
            found.append("cgroup " + str(cgroup))
    if layout.LAB_DIR.exists():
        found.append("directory " + str(layout.LAB_DIR))
    if layout.INVENTORY_FILE.exists():
        found.append("inventory " + str(layout.INVENTORY_FILE))
    found += ["process %d" % pid for pid in sorted(set(_lab_pids() + _pids_in_netns(_lab_netns_inodes())))]
    return found


def _lab_netns_inodes() -> set[int]:
    inodes = set()
    for entry in Path("/run/netns").glob(layout.PREFIX + "-*"):
        try:
            inodes.add(entry.stat().st_ino)
        except OSError:
            continue
    return inodes


def _pids_in_netns(inodes: set[int]) -> list[int]:
    """Processes living in one of the lab's network namespaces, whatever cgroup they are in."""
    pids = []
    if not inodes:
        return pids
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "ns" / "net").stat().st_ino in inodes:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def down() -> list[str]:
    """Remove everything the lab created, whatever state it is in (also after a crashed `up`)."""
    require_root()
    kill_cgroup_tree(layout.lab_cgroup())
    for hierarchy in cgroup_v1_hierarchies():  # the real nodes' pods (node.start)
        kill_cgroup_tree(layout.in_v1_hierarchy(layout.lab_cgroup(), hierarchy))
    for pid in _lab_pids() + _pids_in_netns(_lab_netns_inodes()):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    netns = run(["ip", "netns", "list"], check=False).stdout
    for line in netns.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(layout.PREFIX):
            run(["ip", "netns", "delete", name], check=False)
    links = run(["ip", "-o", "link", "show"], check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(layout.PREFIX):
            run(["ip", "link", "delete", name], check=False)
    shutil.rmtree(layout.LAB_DIR, ignore_errors=True)
    layout.INVENTORY_FILE.unlink(missing_ok=True)
    return leftovers()


def status() -> dict:
    require_root()
    state = load_state()
    if state is None:
        return {"status": "down", "leftovers": leftovers()}
    report = {"scenario": state["scenario"], "status": state["status"], "nodes": {}}
    for node in nodes_from_state(state):
        try:
            pid = node.holder_pid()
            alive = Path("/proc/%d" % pid).exists()
        except LabError:
            alive = False
        report["nodes"][node.name] = {"address": node.address, "sshd": "running" if alive else "stopped"}
    report["inventory"] = state.get("inventory")
    if state.get("cluster"):
        try:
            report["cluster"] = cluster.node_summary(cluster.api_client(state["cluster"]["admin_kubeconfig"]))
        except Exception as error:  # the status report must not die with the apiserver
            report["cluster"] = {"error": str(error)}
    report["timings"] = state.get("timings")
    return report


def ssh_argv(node_address: str) -> list[str]:
    return [
        "ssh", "-i", str(layout.SSH_DIR / "id_ed25519"), "-o", "UserKnownHostsFile=%s" % (layout.SSH_DIR / "known_hosts"),
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "root@%s" % node_address,
    ]


def ssh(node_address: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ssh_argv(node_address), command], capture_output=True, text=True, check=False)
