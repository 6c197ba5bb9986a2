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
  tmpfs on /var/lib/containerd (node.py); /opt is the host's, so it is a tmpfs in containerd's private mount namespace.
Pods do not run on these nodes (no image registry, no systemd for runc's cgroups): the kubelet admits pods and
reports them, containerd's CRI answers status, runtime handlers and config.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

from gpuharden_lab import REPO_ROOT, layout
from gpuharden_lab.system import LabError, run

CACHE = Path(os.environ.get("GPUHARDEN_CACHE", Path.home() / ".cache" / "gpuharden")) / "realcomponents"
VERSIONS_FILE = REPO_ROOT / "lab" / "realcomponents" / "versions.env"
CONTROLPLANE_BUILD = REPO_ROOT / "lab" / "controlplane" / "build.sh"
# containerd releases a scenario may ask for, by major line: the keys of versions.env that pin them.
CONTAINERD_RELEASES = {"2": "CONTAINERD_VERSION", "1.7": "CONTAINERD_1_VERSION"}
BUILD_TARGET = "make real-components"

# The kernel tunables the kubelet writes when they differ (pkg/kubelet/cm/container_manager_linux.go
# setupKernelTunables, values from k8s.io/component-helpers/node/util/sysctl): not namespaced, so the wrapper shows
# the kubelet files that already hold them instead of letting it change the host.
KUBELET_SYSCTLS = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10, "kernel/panic_on_oops": 1,
                   "kernel/keys/root_maxkeys": 1000000, "kernel/keys/root_maxbytes": 25000000}

# What a network add-on (flannel, calico, ...) leaves in /etc/cni/net.d: containerd's CRI reports the network ready
# once a config loads (pods never run here, so the plugins themselves are not needed).
CNI_CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "gpuharden-lab",
    "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}}, {"type": "portmap", "capabilities": {"portMappings": True}}],
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
    return {"containerd": _built(directory, "containerd"), "ctr": _built(directory, "ctr")}


def kubelet_binary() -> Path:
    return _built("kubelet-" + versions()["K8S_VERSION"], "kubelet")


def available() -> bool:
    """Whether every real binary a real node needs is built (tests skip otherwise, naming the make target)."""
    try:
        kubelet_binary()
        for release in CONTAINERD_RELEASES:
            containerd_binaries(release)
    except LabError:
        return False
    return True


def default_containerd_config(release: str) -> str:
    """``containerd config default`` of the pinned release: what the distribution package or install guide writes."""
    done = run([str(containerd_binaries(release)["containerd"]), "config", "default"])
    return "# containerd configuration: `containerd config default` of %s\n%s" % (containerd_version(release), done.stdout)


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
# the host's layout: each v1 hierarchy of /proc/cgroups (controllers sharing a hierarchy id mount together), cgroup2
# at /sys/fs/cgroup/unified
mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup
awk 'NR > 1 && $2 != 0 && $4 == 1 {print $2, $1}' /proc/cgroups | sort -n |
    awk '{joined[$1] = ($1 in joined) ? joined[$1] "," $2 : $2} END {for (id in joined) print joined[id]}' |
    while read -r controllers; do
        mkdir -p "/sys/fs/cgroup/$controllers"
        mount -t cgroup -o "$controllers" cgroup "/sys/fs/cgroup/$controllers"
    done
mkdir -p /sys/fs/cgroup/unified
mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
state=/run/gpuharden-lab/kubelet-sysctl
mkdir -p "$state"
for entry in %(sysctls)s; do
    name=${entry%%%%=*}
    file="$state/$(echo "$name" | tr / .)"
    echo "${entry#*=}" >"$file"
    mount --bind "$file" "/proc/sys/$name"
done
exec %(binary)s "$@" --fail-cgroupv1=false --cgroups-per-qos=false --enforce-node-allocatable= --node-ip=%(address)s
""" % {"version": versions()["K8S_VERSION"], "sysctls": sysctls, "binary": kubelet_binary(), "address": address}


def containerd_wrapper(release: str) -> str:
    return """#!/bin/sh
# gpuharden lab: the real containerd %(version)s (LAB-ONLY wrapper, not managed by gpuharden; see realnode.py).
# /opt is the host's (the node's launch script gives /var/lib/containerd a tmpfs for the overlayfs snapshotter).
set -eu
if [ "${GPUHARDEN_LAB_CONTAINERD_NS:-}" != 1 ]; then
    GPUHARDEN_LAB_CONTAINERD_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
mount -t tmpfs -o size=16m,mode=0755 tmpfs /opt
exec %(binary)s "$@"
""" % {"version": containerd_version(release), "binary": containerd_binaries(release)["containerd"]}


def ctr_wrapper(release: str) -> str:
    return "#!/bin/sh\n# gpuharden lab: the real ctr %s\nexec %s \"$@\"\n" % (containerd_version(release), containerd_binaries(release)["ctr"])


def node_client_certificate(name: str, directory: Path) -> tuple[bytes, bytes]:
    """A client certificate for ``system:node:<name>`` in ``system:nodes``, signed by the lab CA (as kubeadm join's
    TLS bootstrap ends up with)."""
    pki = layout.CONTROL_PLANE_DIR / "pki"
    directory.mkdir(parents=True, exist_ok=True)
    key, csr, crt = directory / "kubelet-client.key", directory / "kubelet-client.csr", directory / "kubelet-client.crt"
    run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", "/O=system:nodes/CN=system:node:%s" % name])
    (directory / "client.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
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
