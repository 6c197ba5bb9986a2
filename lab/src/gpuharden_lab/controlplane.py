# SPDX-License-Identifier: GPL-3.0-or-later
"""The lab's real Kubernetes control plane: etcd, kube-apiserver (RBAC on), kube-controller-manager,
kube-scheduler and kwok, built from source by lab/controlplane/build.sh and bound to 127.0.0.1 only.

Identities (static token file): ``admin`` (system:masters) for the lab and tests; ``gpuharden``, the
tool's own identity, with no group and so only what RBAC grants it; ``system:node:<name>`` per node
for the kubelet stand-in (Node authorizer).
"""

from __future__ import annotations

import base64
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuharden_lab import REPO_ROOT, layout
from gpuharden_lab.system import LabError, run, spawn, wait_for_tcp

BUILD_SCRIPT = REPO_ROOT / "lab" / "controlplane" / "build.sh"
STAGES = REPO_ROOT / "lab" / "controlplane" / "stages.yaml"
ETCD_PORT, ETCD_PEER_PORT = layout.ETCD_PORT, layout.ETCD_PEER_PORT
API_PORT = layout.API_PORT
KCM_PORT, SCHEDULER_PORT = layout.KCM_PORT, layout.SCHEDULER_PORT
API_URL = "https://127.0.0.1:%d" % API_PORT
TOOL_USER = "gpuharden"
# The lab PKI's keys (CA, serving and client certificates, service-account signing): ECDSA P-256, as kubeadm's
# ClusterConfiguration encryptionAlgorithm ECDSA-P256 makes them; an RSA-2048 key costs openssl about 0.16 CPU-s here
# and a bring-up makes eleven.
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256")
NO_RBAC_USER = "lab-no-rbac"  # authenticated, bound to nothing: for tests of clear 403 messages


@dataclass
class Credentials:
    admin_token: str
    tool_token: str
    node_tokens: dict[str, str]


def binaries() -> Path:
    """The bin dir of the built control plane (the build is cached; a warm call takes a second)."""
    completed = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise LabError("building the control plane failed:\n%s" % completed.stderr[-3000:])
    return Path(completed.stdout.strip().splitlines()[-1])


def kubeconfig(token: str, user: str, server: str = API_URL) -> str:
    ca = base64.b64encode((layout.CONTROL_PLANE_DIR / "pki" / "ca.crt").read_bytes()).decode()
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gpuharden-lab", "cluster": {"server": server, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "gpuharden-lab", "context": {"cluster": "gpuharden-lab", "user": user}}],
            "current-context": "gpuharden-lab",
        },
        sort_keys=False,
    )


def _serving_certificate(pki: Path) -> None:
    """A lab CA and the apiserver's serving certificate for 127.0.0.1, so clients verify TLS for real."""
    pki.mkdir(parents=True, exist_ok=True)
    run(["openssl", "req", "-x509", *EC_KEY, "-nodes", "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
         "-days", "30", "-subj", "/CN=gpuharden-lab-ca"])
    run(["openssl", "req", *EC_KEY, "-nodes", "-keyout", str(pki / "apiserver.key"), "-out", str(pki / "apiserver.csr"),
         "-subj", "/CN=kube-apiserver"])
    (pki / "apiserver.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    run(["openssl", "x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
         "-CAcreateserial", "-out", str(pki / "apiserver.crt"), "-days", "30", "-extfile", str(pki / "apiserver.ext")])


def _credentials(directory: Path, node_names: list[str]) -> Credentials:
    credentials = Credentials(
        admin_token=secrets.token_hex(16),
        tool_token=secrets.token_hex(16),
        node_tokens={name: secrets.token_hex(16) for name in node_names},
    )
    rows = [
        '%s,admin,admin,"system:masters"' % credentials.admin_token,
        "%s,%s,%s" % (credentials.tool_token, NO_RBAC_USER, NO_RBAC_USER),
    ]
    rows += ['%s,system:node:%s,node-%s,"system:nodes"' % (token, name, name) for name, token in credentials.node_tokens.items()]
    (directory / "tokens.csv").write_text("\n".join(rows) + "\n")
    (directory / "tokens.csv").chmod(0o600)
    _serving_certificate(directory / "pki")
    run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(directory / "sa.key")])
    run(["openssl", "pkey", "-in", str(directory / "sa.key"), "-pubout", "-out", str(directory / "sa.pub")])
    for name, token, user in (("admin", credentials.admin_token, "admin"), ("no-rbac", credentials.tool_token, NO_RBAC_USER)):
        path = directory / ("%s.kubeconfig" % name)
        path.write_text(kubeconfig(token, user))
        path.chmod(0o600)
    return credentials


def _wait_http(url: str, token: str, timeout: float, what: str, log: Path) -> float:
    start = time.monotonic()
    while True:
        completed = subprocess.run(
            ["curl", "-s", "--cacert", str(layout.CONTROL_PLANE_DIR / "pki/ca.crt"), "--max-time", "2", "-o", "/dev/null", "-w", "%{http_code}",
             "-H", "Authorization: Bearer " + token, url],
            capture_output=True, text=True, check=False,
        )
        if completed.stdout == "200":
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
            raise LabError("%s not healthy within %.0fs (%s):\n%s" % (what, timeout, url, tail))
        time.sleep(0.2)


def prepare(node_names: list[str]) -> Credentials:
    """Keys, tokens and kubeconfigs, before anything runs (nodes need their kubeconfig at start)."""
    layout.CONTROL_PLANE_DIR.mkdir(parents=True, exist_ok=True)
    return _credentials(layout.CONTROL_PLANE_DIR, node_names)


def node_kubeconfig(credentials: Credentials, node_name: str) -> str:
    """The kubelet's kubeconfig inside a node: the forwarder puts the apiserver on the node's loopback."""
    return kubeconfig(credentials.node_tokens[node_name], "system:node:%s" % node_name)


def start(credentials: Credentials, netns_names: list[str]) -> dict:
    """Start everything; returns the paths and timings the lab records."""
    directory = layout.CONTROL_PLANE_DIR
    logs = directory / "logs"
    cgroup = layout.lab_cgroup() / "controlplane"
    timings = {}
    phase = time.monotonic()
    bin_dir = binaries()
    timings["build"] = time.monotonic() - phase
    admin = directory / "admin.kubeconfig"

    phase = time.monotonic()
    spawn(
        [
            str(bin_dir / "etcd"), "--name=lab", "--data-dir=%s" % (directory / "etcd"),
            "--listen-client-urls=http://127.0.0.1:%d" % ETCD_PORT, "--advertise-client-urls=http://127.0.0.1:%d" % ETCD_PORT,
            "--listen-peer-urls=http://127.0.0.1:%d" % ETCD_PEER_PORT,
            "--initial-advertise-peer-urls=http://127.0.0.1:%d" % ETCD_PEER_PORT,
            "--initial-cluster=lab=http://127.0.0.1:%d" % ETCD_PEER_PORT, "--unsafe-no-fsync", "--log-level=warn",
        ],
        log=logs / "etcd.log", cgroup=cgroup / "etcd",
    )
    wait_for_tcp("127.0.0.1", ETCD_PORT, 30, what="etcd", log=logs / "etcd.log")
    spawn(
        [
            str(bin_dir / "kube-apiserver"), "--etcd-servers=http://127.0.0.1:%d" % ETCD_PORT,
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=%d" % API_PORT,
            "--tls-cert-file=%s" % (directory / "pki/apiserver.crt"), "--tls-private-key-file=%s" % (directory / "pki/apiserver.key"),
            "--token-auth-file=%s" % (directory / "tokens.csv"),
            # real kubelets (realnode.py) authenticate with a client certificate, as after kubeadm's TLS bootstrap
            "--client-ca-file=%s" % (directory / "pki/ca.crt"),
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-account-key-file=%s" % (directory / "sa.pub"),
            "--service-account-signing-key-file=%s" % (directory / "sa.key"),
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none", "--allow-privileged=true",
        ],
        log=logs / "kube-apiserver.log", cgroup=cgroup / "kube-apiserver",
    )
    timings["apiserver_ready"] = _wait_http(
        API_URL + "/readyz", credentials.admin_token, 90, "kube-apiserver", logs / "kube-apiserver.log"
    )
    common = ["--kubeconfig=%s" % admin, "--leader-elect=false", "--bind-address=127.0.0.1"]
    spawn(
        [
            str(bin_dir / "kube-controller-manager"), *common, "--secure-port=%d" % KCM_PORT,
            "--service-account-private-key-file=%s" % (directory / "sa.key"), "--use-service-account-credentials=false",
        ],
        log=logs / "kube-controller-manager.log", cgroup=cgroup / "kube-controller-manager",
    )
    spawn(
        [str(bin_dir / "kube-scheduler"), *common, "--secure-port=%d" % SCHEDULER_PORT],
        log=logs / "kube-scheduler.log", cgroup=cgroup / "kube-scheduler",
    )
    spawn(
        [
            str(bin_dir / "kwok"), "--kubeconfig=%s" % admin, "--config=%s" % STAGES, "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--cidr=10.244.0.0/16",
            "--node-ip=10.0.0.1", "--node-lease-duration-seconds=40",
        ],
        log=logs / "kwok.log", cgroup=cgroup / "kwok",
    )
    if netns_names:
        spawn(
            [
                sys.executable, "-m", "gpuharden_lab.forwarder",
                "--target", "127.0.0.1:%d" % API_PORT, "--listen-port", str(API_PORT),
                *("/run/netns/%s" % name for name in netns_names),
            ],
            log=logs / "forwarder.log", cgroup=cgroup / "forwarder",
        )
    timings["control_plane"] = time.monotonic() - phase
    return {
        "bin_dir": str(bin_dir),
        "admin_kubeconfig": str(admin),
        "tool_kubeconfig": str(directory / ("%s.kubeconfig" % TOOL_USER)),
        "no_rbac_kubeconfig": str(directory / "no-rbac.kubeconfig"),
        "timings": timings,
    }
