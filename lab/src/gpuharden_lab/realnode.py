# SPDX-License-Identifier: GPL-3.0-or-later
"""Lab nodes that run the real containerd and the real kubelet (scenario key ``real``).

Such a node starts where a fresh install leaves it: containerd's own ``containerd config default`` of the pinned
release (no nvidia runtime: the NVIDIA container toolkit is not configured yet), the kubelet's defaults as kubeadm
writes them, and a CNI config as a network add-on writes one.  The node's systemctl starts the real binaries from
the node's unit files, so a config the real daemon rejects makes the unit fail, as on a real node; the kubelet
registers its Node itself, with its node identity (a client certificate ``system:node:<name>`` in
``system:nodes``, checked by the apiserver's Node authorizer and NodeRestriction admission).

What this machine needs and a real node would not is in the lab-only wrappers at ``/usr/local/bin/kubelet`` and
``/usr/local/bin/containerd``, apart from every file the product manages (docs/development.md, "Real nodes"):
- the kubelet: this host is hybrid cgroup v1 without systemd (real-components.md), so it gets
  ``--fail-cgroupv1=false --cgroups-per-qos=false --enforce-node-allocatable=`` and the host's v1 hierarchies in
  a private mount namespace (the lab node's own /sys/fs/cgroup is a cgroup2 mount for the BPF device programs);
  the vm.* and kernel.panic* sysctls it would set are not namespaced, so it sees files that already hold its
  values; ``--node-ip`` is the node's lab address.
- containerd: its overlayfs snapshotter cannot sit on the node's /var/lib (itself an overlay), so the node mounts a
  tmpfs on /var/lib/containerd (node.py); /opt is the host's, so it is a tmpfs in containerd's private mount namespace,
  with the CNI plugins bound at /opt/cni/bin; it gets the host's v1 hierarchies as the kubelet does, and its runc shim
  and the lab's runc wrapper first on PATH.

Pods run on these nodes, through the real kubelet, containerd, its runc shim and the host's runc (cgroupfs, which is
containerd's default, ``SystemdCgroup = false``; the kubelet takes the driver from the CRI):
- no registry is reachable, so the lab imports the sandbox image the node's containerd config names, built here from
  a static binary (lab/realcomponents/pause), as an air-gapped node gets its images;
- the network add-on's config is a bridge with host-local addresses, without ipMasq or portmap (no iptables here);
- this machine's bounding set lacks CAP_SYS_RESOURCE, so no process can lower its oom_score_adj: runc would fail
  every sandbox (the kubelet gives sandboxes -998).  The runc wrapper raises a negative ``oomScoreAdj`` to 0 in the
  bundle and changes nothing else;
- the node's cgroup namespace is rooted at the node's own cgroup in every v1 hierarchy too (node.start), so the pods'
  cgroups nest under the node's and ``lab down`` removes them.

The device plugin runs as a real pod too.  A GPU node has the real NVIDIA container toolkit (nvidia-container-runtime,
nvidia-cdi-hook, nvidia-ctk; build-container-toolkit.sh) at /usr/bin, as its package installs it, and the driver's
NVML as a real driver lays it out (``libnvidia-ml.so.<driver version>`` and the ``.so.1`` link, in the loader's
cache).  The lab imports an image of each pinned plugin release under the name the collection deploys
(device_plugin_image), built here from the real binary and the upstream Dockerfile's entrypoint and environment.  When
containerd runs the plugin's container through the nvidia runtime, the real toolkit (jit-cdi, its default on an NVML
platform) generates the CDI edits from the NVML double and mounts the library and device nodes itself; through any
other runtime the container has no NVML and the real plugin fails as on a real node.  What stands for the missing
driver's kernel side is in the runc wrapper (RUNC_WRAPPER): the driver's /proc/driver entries in every container's
procfs, and the double's state in a container the toolkit gave /dev/nvidiactl.
Any other image is absent: a pod that names one waits in ErrImagePull, as on an air-gapped node.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from pathlib import Path

from gpuharden_lab import REPO_ROOT, layout
from gpuharden_lab.controlplane import EC_KEY
from gpuharden_lab.system import LabError, run

CACHE = Path(os.environ.get("GPUHARDEN_CACHE", Path.home() / ".cache" / "gpuharden")) / "realcomponents"
VERSIONS_FILE = REPO_ROOT / "lab" / "realcomponents" / "versions.env"
CONTROLPLANE_BUILD = REPO_ROOT / "lab" / "controlplane" / "build.sh"
# containerd releases a scenario may ask for, by major line: the keys of versions.env that pin them.
CONTAINERD_RELEASES = {"2": "CONTAINERD_VERSION", "1.7": "CONTAINERD_1_VERSION"}
BUILD_TARGET = "make real-components"
SHIM = "containerd-shim-runc-v2"
# The CNI plugins real pods need (build-pod-support.sh): the network config's bridge and host-local, and loopback,
# which containerd's CRI runs for every pod's lo.
CNI_PLUGINS = ("bridge", "host-local", "loopback")
PAUSE_SOURCE = REPO_ROOT / "lab" / "realcomponents" / "pause" / "pause.c"
# Where a real node keeps the lab's runc wrapper (runc_wrapper), first on containerd's PATH.
LAB_BIN = "/usr/local/lib/gpuharden-lab/bin"
# The NVIDIA container toolkit's binaries a GPU node gets at /usr/bin (build-container-toolkit.sh).
CONTAINER_TOOLKIT = ("nvidia-container-runtime", "nvidia-cdi-hook", "nvidia-ctk")
# The device plugin's image as the collection names it by default (roles/device_plugin/defaults: registry nvcr.io/nvidia,
# repository k8s-device-plugin), tagged with each release versions.env pins; what an air-gapped site mirrors.
DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin"
DEVICE_PLUGIN_RELEASES = ("NVIDIA_DEVICE_PLUGIN_VERSION", "NVIDIA_DEVICE_PLUGIN_OLD_VERSION")
# The plugin image's config, as upstream sets it (deployments/container/Dockerfile in v0.18.2, Dockerfile.ubuntu in
# v0.15.0, the same there): ENTRYPOINT ["nvidia-device-plugin"] and the NVIDIA_* environment the toolkit reads; the
# base image gives PATH.
DEVICE_PLUGIN_IMAGE_CONFIG = {
    "Entrypoint": ["nvidia-device-plugin"],
    "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "NVIDIA_DISABLE_REQUIRE=true",
            "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
}

# A GPU node prepared as the plugin's README has an admin prepare it before its DaemonSet goes on
# (k8s-device-plugin v0.15.0 README.md, "Preparing your GPU Nodes": the toolkit's nvidia-container-runtime configured
# as containerd's default low-level runtime, `--set-as-default`), run with the real nvidia-ctk before containerd first
# starts (scenario key ``real: {nvidia_runtime: default}``).  What it writes where is the toolkit's own business.
NVIDIA_CTK_CONFIGURE = ("nvidia-ctk", "runtime", "configure", "--runtime=containerd", "--set-as-default")

# The kernel tunables the kubelet writes when they differ (pkg/kubelet/cm/container_manager_linux.go
# setupKernelTunables, values from k8s.io/component-helpers/node/util/sysctl): not namespaced, so the wrapper shows
# the kubelet files that already hold them instead of letting it change the host.
KUBELET_SYSCTLS = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10, "kernel/panic_on_oops": 1,
                   "kernel/keys/root_maxkeys": 1000000, "kernel/keys/root_maxbytes": 25000000}

# What a network add-on (flannel, calico, ...) leaves in /etc/cni/net.d: containerd's CRI reports the network ready
# once a config loads, and runs its plugins (build-pod-support.sh) for every pod sandbox.
CNI_CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "gpuharden-lab",
    # no ipMasq and no portmap: both need iptables, which this machine does not have, and lab pods reach nothing
    # outside their node
    "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}}],
}


def versions() -> dict[str, str]:
    values = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        match = re.match(r"^([A-Z0-9_]+)=(\S+)", line)
        if match:
            values[match.group(1)] = match.group(2)
    found = re.search(r"^K8S_VERSION=(v[0-9.]+)", CONTROLPLANE_BUILD.read_text(), re.M)
    if found is None:
        raise LabError("%s sets no K8S_VERSION" % CONTROLPLANE_BUILD)
    values["K8S_VERSION"] = found.group(1)
    return values


def containerd_version(release: str) -> str:
    if release not in CONTAINERD_RELEASES:
        raise LabError("real.containerd must be one of %s, got %r" % (sorted(CONTAINERD_RELEASES), release))
    return versions()[CONTAINERD_RELEASES[release]]


def _built(directory: str, name: str) -> Path:
    path = CACHE / directory / name
    if not os.access(path, os.X_OK):
        raise LabError("%s is not built: run `%s` (lab/realcomponents)" % (path, BUILD_TARGET))
    return path


def containerd_binaries(release: str) -> dict[str, Path]:
    directory = "containerd-" + containerd_version(release)
    return {name: _built(directory, name) for name in ("containerd", "ctr", SHIM)}


def cni_plugins_dir() -> Path:
    directory = "cni-plugins-" + versions()["CNI_PLUGINS_VERSION"]
    for plugin in CNI_PLUGINS:
        _built(directory, plugin)
    return CACHE / directory


def pause_binary() -> Path:
    digest = hashlib.sha256(PAUSE_SOURCE.read_bytes()).hexdigest()[:16]
    return _built("pause-" + digest, "pause")


def kubelet_binary() -> Path:
    return _built("kubelet-" + versions()["K8S_VERSION"], "kubelet")


def kubeadm_binary() -> Path:
    """kubeadm of the control plane's release (`make real-kubeadm`): not a node component, so available() does not ask
    for it; the tests of what `kubeadm upgrade node` does to a node skip without it, naming that target."""
    return _built("kubeadm-" + versions()["K8S_VERSION"], "kubeadm")


def container_toolkit_binaries() -> dict[str, Path]:
    directory = "nvidia-container-toolkit-" + versions()["NVIDIA_CONTAINER_TOOLKIT_VERSION"]
    return {name: _built(directory, name) for name in CONTAINER_TOOLKIT}


def device_plugin_releases() -> list[str]:
    pinned = versions()
    return [pinned[key] for key in DEVICE_PLUGIN_RELEASES]


def device_plugin_binary(release: str) -> Path:
    return _built("nvidia-device-plugin-" + release, "nvidia-device-plugin")


def available() -> bool:
    """Whether every real binary a real node needs is built (tests skip otherwise, naming the make target)."""
    try:
        kubelet_binary()
        for release in CONTAINERD_RELEASES:
            containerd_binaries(release)
        cni_plugins_dir()
        pause_binary()
        container_toolkit_binaries()
        for release in device_plugin_releases():
            device_plugin_binary(release)
    except LabError:
        return False
    return True


def default_containerd_config(release: str) -> str:
    """``containerd config default`` of the pinned release: what the distribution package or install guide writes."""
    done = run([str(containerd_binaries(release)["containerd"]), "config", "default"])
    return "# containerd configuration: `containerd config default` of %s\n%s" % (containerd_version(release), done.stdout)


# The host's cgroup layout in a wrapper's private mount namespace (the node's own /sys/fs/cgroup is a cgroup2 mount):
# each v1 hierarchy of /proc/cgroups (controllers sharing a hierarchy id mount together), cgroup2 at
# /sys/fs/cgroup/unified.  Inside the node's cgroup namespace each is rooted at the node's own cgroup (node.start).
V1_HIERARCHIES = r"""# the host's layout: each v1 hierarchy of /proc/cgroups, cgroup2 at /sys/fs/cgroup/unified
mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup
awk 'NR > 1 && $2 != 0 && $4 == 1 {print $2, $1}' /proc/cgroups | sort -n |
    awk '{if ($1 in joined) joined[$1] = joined[$1] "," $2; else joined[$1] = $2} END {for (id in joined) print joined[id]}' |
    while read -r controllers; do
        mkdir -p "/sys/fs/cgroup/$controllers"
        mount -t cgroup -o "$controllers" cgroup "/sys/fs/cgroup/$controllers"
    done
mkdir -p /sys/fs/cgroup/unified
mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
"""


def kubelet_wrapper(address: str) -> str:
    sysctls = " ".join("%s=%s" % item for item in KUBELET_SYSCTLS.items())
    return """#!/bin/sh
# gpuharden lab: the real kubelet %(version)s (LAB-ONLY wrapper, not managed by gpuharden; see realnode.py).
# This host is hybrid cgroup v1 without systemd: the flags below and the host's v1 hierarchies; the vm.* and
# kernel.panic* sysctls are not namespaced, so the kubelet sees files that already hold the values it wants.
set -eu
if [ "${GPUHARDEN_LAB_KUBELET_NS:-}" != 1 ]; then
    GPUHARDEN_LAB_KUBELET_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
%(v1_hierarchies)sstate=/run/gpuharden-lab/kubelet-sysctl
mkdir -p "$state"
for entry in %(sysctls)s; do
    name=${entry%%%%=*}
    file="$state/$(echo "$name" | tr / .)"
    echo "${entry#*=}" >"$file"
    mount --bind "$file" "/proc/sys/$name"
done
exec %(binary)s "$@" --fail-cgroupv1=false --cgroups-per-qos=false --enforce-node-allocatable= --node-ip=%(address)s
""" % {"version": versions()["K8S_VERSION"], "sysctls": sysctls, "binary": kubelet_binary(), "address": address,
       "v1_hierarchies": V1_HIERARCHIES}


def containerd_wrapper(release: str) -> str:
    binaries = containerd_binaries(release)
    return """#!/bin/sh
# gpuharden lab: the real containerd %(version)s (LAB-ONLY wrapper, not managed by gpuharden; see realnode.py).
# /opt is the host's (the node's launch script gives /var/lib/containerd a tmpfs for the overlayfs snapshotter), so
# it is a tmpfs here with the CNI plugins at /opt/cni/bin, where the default config looks for them.  runc creates
# the pods' cgroups: this host is hybrid cgroup v1, so it gets the host's hierarchies, as the kubelet does.  The
# shim and the lab's runc wrapper (the host's runc) come first on PATH.
set -eu
if [ "${GPUHARDEN_LAB_CONTAINERD_NS:-}" != 1 ]; then
    GPUHARDEN_LAB_CONTAINERD_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
mount -t tmpfs -o size=16m,mode=0755 tmpfs /opt
mkdir -p /opt/cni/bin
mount --bind -o ro %(cni)s /opt/cni/bin
%(v1_hierarchies)sexport PATH=%(lab_bin)s:%(shim_dir)s:$PATH
exec %(binary)s "$@"
""" % {"version": containerd_version(release), "binary": binaries["containerd"], "cni": cni_plugins_dir(),
       "v1_hierarchies": V1_HIERARCHIES, "lab_bin": LAB_BIN, "shim_dir": binaries[SHIM].parent}


# The runc wrapper's lab-only changes to a bundle, and nothing else:
# - oom_score_adj: the kubelet gives every sandbox -998 (pkg/kubelet/qos/policy.go PodInfraOOMAdj) and guaranteed
#   containers -997, and runc writes it before the process starts; lowering it needs CAP_SYS_RESOURCE, which this
#   machine's bounding set lacks (CapBnd 000001fffeffffff), so runc would fail every sandbox with `can't get final
#   child's PID from pipe`.  A negative value becomes 0.
# - the driver's procfs entries: on a real GPU node the kernel module's /proc/driver/nvidia* is in every procfs,
#   a container's included, and the toolkit's hooks and the plugin read it (disable-device-node-modification opens
#   proc/driver/nvidia/params; MIG device paths come from /proc/driver/nvidia-caps/mig-minors).  Here the node's
#   /proc/driver is a bind mount (node.py), so a container's fresh procfs lacks it.  runc refuses mounts inside
#   /proc in the spec, so a first createContainer hook binds the node's /proc/driver over the container's, before
#   the toolkit's hooks run, as the kernel would show it.
# - the NVML double's state: a real libnvidia-ml reaches the kernel driver through /dev/nvidiactl, and every
#   container the NVIDIA runtime gave that device sees the same driver state.  The double keeps that state in files
#   (its fixture and state.json), so a container whose spec holds /dev/nvidiactl (put there by the real
#   nvidia-container-runtime, never by the lab) gets the node's double directories bound at the same paths.
#   Without the device it gets nothing, and NVML in it fails with "Driver Not Loaded", as on a real node.
RUNC_WRAPPER = """#!/usr/bin/python3
# gpuharden lab: the host's runc for the real containerd's shim (LAB-ONLY, see realnode.py): a negative
# process.oomScoreAdj becomes 0 (this machine cannot lower it); every container sees the node's /proc/driver, as the
# kernel would show the driver's entries; a container the NVIDIA runtime gave /dev/nvidiactl reaches the NVML
# double's state (%(double_dirs_text)s).
import json, os, sys
args = sys.argv[1:]
if "create" in args and "--bundle" in args:
    bundle = args[args.index("--bundle") + 1]
    config = os.path.join(bundle, "config.json")
    with open(config) as handle:
        spec = json.load(handle)
    changed = False
    if spec.get("process", {}).get("oomScoreAdj", 0) < 0:
        spec["process"]["oomScoreAdj"] = 0
        changed = True
    if os.path.isdir("/proc/driver/nvidia"):
        rootfs = os.path.join(bundle, (spec.get("root") or {}).get("path") or "rootfs")
        hooks = spec.setdefault("hooks", {}).setdefault("createContainer", [])
        hooks.insert(0, {"path": "/bin/mount", "args": ["mount", "--rbind", "/proc/driver", os.path.join(rootfs, "proc/driver")]})
        changed = True
    if any(device.get("path") == "/dev/nvidiactl" for device in (spec.get("linux") or {}).get("devices") or []):
        taken = {mount.get("destination") for mount in spec.get("mounts") or []}
        for directory in %(double_dirs)r:
            if directory not in taken and os.path.isdir(directory):
                spec.setdefault("mounts", []).append({"destination": directory, "type": "bind", "source": directory,
                                                      "options": ["rbind", "nosuid", "nodev"]})
                changed = True
    if changed:
        with open(config + ".lab", "w") as handle:
            json.dump(spec, handle)
        os.replace(config + ".lab", config)
os.execv(%(runc)r, [%(runc)r] + args)
"""

# Where the NVML double keeps what a real driver keeps in the kernel (tests/fakes/nvml/nvml_double.c defaults).
NVML_DOUBLE_DIRS = ("/etc/nvml-double", "/var/lib/nvml-double")


def runc_wrapper() -> str:
    runc = shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if runc is None:
        raise LabError("runc is not installed: real pods need the host's runc (make system-deps)")
    return RUNC_WRAPPER % {"runc": runc, "double_dirs": NVML_DOUBLE_DIRS, "double_dirs_text": ", ".join(NVML_DOUBLE_DIRS)}


def ctr_wrapper(release: str) -> str:
    return "#!/bin/sh\n# gpuharden lab: the real ctr %s\nexec %s \"$@\"\n" % (containerd_version(release), containerd_binaries(release)["ctr"])


def node_client_certificate(name: str, directory: Path) -> tuple[bytes, bytes]:
    """A client certificate for ``system:node:<name>`` in ``system:nodes``, signed by the lab CA (as kubeadm join's
    TLS bootstrap ends up with)."""
    pki = layout.CONTROL_PLANE_DIR / "pki"
    directory.mkdir(parents=True, exist_ok=True)
    key, csr, crt = directory / "kubelet-client.key", directory / "kubelet-client.csr", directory / "kubelet-client.crt"
    run(["openssl", "req", *EC_KEY, "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", "/O=system:nodes/CN=system:node:%s" % name])
    (directory / "client.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n")
    run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
         "-CAcreateserial", "-out", str(crt), "-days", "30", "-extfile", str(directory / "client.ext")])
    return crt.read_bytes(), key.read_bytes()


def node_kubeconfig(name: str, server: str, directory: Path) -> str:
    crt, key = node_client_certificate(name, directory)
    ca = (layout.CONTROL_PLANE_DIR / "pki" / "ca.crt").read_bytes()
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca).decode()}}],
        "users": [{"name": "system:node:%s" % name, "user": {"client-certificate-data": base64.b64encode(crt).decode(),
                                                             "client-key-data": base64.b64encode(key).decode()}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "system:node:%s" % name}}],
        "current-context": "lab",
    }
    return json.dumps(config, indent=2) + "\n"


def cni_conflist() -> str:
    return json.dumps(CNI_CONFLIST, indent=2) + "\n"


def sandbox_image_name(config_text: str) -> str:
    """The sandbox image a containerd config names: ``sandbox`` under the images plugin's pinned_images (2.x) or
    ``sandbox_image`` in the CRI plugin (1.7)."""
    found = re.search(r"""^\s*(?:sandbox|sandbox_image)\s*=\s*['"]([^'"]+)['"]""", config_text, re.M)
    if found is None:
        raise LabError("the containerd config names no sandbox image (sandbox / sandbox_image)")
    return found.group(1)


def _tar(members: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, (data, mode) in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def image_archive(name: str, files: dict[str, tuple[bytes, int]], config: dict) -> bytes:
    """An OCI image layout archive (``ctr images import``) of ``name``: one layer holding ``files`` (path in the
    image -> content, mode) and the image config ``config`` (Entrypoint, Env)."""
    blobs = {}

    def blob(data: bytes, media_type: str) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs["blobs/sha256/" + digest[7:]] = (data, 0o644)
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer = _tar(files)
    image_config = {"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]}}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": blob(json.dumps(image_config).encode(), "application/vnd.oci.image.config.v1+json"),
                "layers": [blob(layer, "application/vnd.oci.image.layer.v1.tar")]}
    descriptor = blob(json.dumps(manifest).encode(), manifest["mediaType"])
    descriptor["platform"] = {"architecture": "amd64", "os": "linux"}
    descriptor["annotations"] = {"io.containerd.image.name": name}
    index = {"schemaVersion": 2, "manifests": [descriptor]}
    return _tar({"oci-layout": (b'{"imageLayoutVersion": "1.0.0"}', 0o644), "index.json": (json.dumps(index).encode(), 0o644), **blobs})


def sandbox_image_archive(name: str) -> bytes:
    """The sandbox image ``name``: the lab's static pause binary, its entrypoint.  No registry is reachable here, so
    the node gets the sandbox image as an air-gapped node would."""
    return image_archive(name, {"pause": (pause_binary().read_bytes(), 0o755)}, {"Entrypoint": ["/pause"]})


# The plugin binary is linked against glibc only (cgo; go-nvml dlopens NVML at run time): `ldd` lists libc.so.6 and
# the loader, which the image carries at the paths the binary names.
IMAGE_LIBC = ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")


@functools.cache
def device_plugin_image_archive(release: str) -> tuple[str, bytes]:
    """The device plugin image of ``release`` under the name the collection deploys: the real binary at
    /usr/bin/nvidia-device-plugin, the C library it links, and upstream's image config."""
    files = {"usr/bin/nvidia-device-plugin": (device_plugin_binary(release).read_bytes(), 0o755)}
    for library in IMAGE_LIBC:
        files[library.lstrip("/")] = (Path(library).read_bytes(), 0o755)
    name = "%s:%s" % (DEVICE_PLUGIN_IMAGE, release)
    return name, image_archive(name, files, DEVICE_PLUGIN_IMAGE_CONFIG)
