# SPDX-License-Identifier: GPL-3.0-or-later
"""The files a kubeadm or k3s GPU node has: kubelet config, flags and unit, containerd config.

Scenarios describe nodes by intent (``kubelet: {config: {topologyManagerPolicy: none}}``,
``containerd: {version: 3, nvidia: false}``); this renders the files a real node would have for it.
"""

from __future__ import annotations

import json

import yaml

from gpuharden_lab.system import LabError

KUBELET_BASE = {
    "apiVersion": "kubelet.config.k8s.io/v1beta1",
    "kind": "KubeletConfiguration",
    "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True}},
    "authorization": {"mode": "Webhook"},
    "cgroupDriver": "systemd",
    "clusterDNS": ["10.96.0.10"],
    "clusterDomain": "cluster.local",
    "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
    "healthzBindAddress": "127.0.0.1",
    "healthzPort": 10248,
    "rotateCertificates": True,
    "staticPodPath": "/etc/kubernetes/manifests",
    # Compliant GPU node settings; scenarios override them to seed failures.
    "cpuManagerPolicy": "static",
    "reservedSystemCPUs": "0-1",
    "topologyManagerPolicy": "single-numa-node",
    "topologyManagerScope": "container",
    "memoryThrottlingFactor": 0.9,
}

KUBELET_UNIT = """[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/local/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
"""

KUBEADM_DROP_IN = """# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user should use
# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. KUBELET_EXTRA_ARGS should be sourced from this file.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
"""

K3S_AGENT_UNIT = """[Unit]
Description=Lightweight Kubernetes
Documentation=https://k3s.io
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-/etc/sysconfig/%N
ExecStart=/usr/local/bin/kubelet --k3s-config /etc/rancher/k3s/config.yaml --kubeconfig=/etc/kubernetes/kubelet.conf \
    --config-dir=/var/lib/rancher/k3s/agent/etc/kubelet.conf.d
KillMode=process
Restart=always
RestartSec=5s

[Install]
WantedBy=multi-user.target
"""

CONTAINERD_UNIT = """[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target local-fs.target

[Service]
ExecStart=/usr/local/bin/containerd
Type=simple
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""

CPU_MANAGER_STATE = "/var/lib/kubelet/cpu_manager_state"

CRI_PLUGIN = {2: 'plugins."io.containerd.grpc.v1.cri"', 3: 'plugins."io.containerd.cri.v1.runtime"'}


def _runc_table(version: int, systemd_cgroup: bool = True) -> str:
    base = CRI_PLUGIN[version] + ".containerd.runtimes.runc"
    return '[%s]\n  runtime_type = "io.containerd.runc.v2"\n\n[%s.options]\n  SystemdCgroup = %s\n' % (base, base, str(systemd_cgroup).lower())


def _nvidia_table(version: int, systemd_cgroup: bool = True) -> str:
    base = CRI_PLUGIN[version] + ".containerd.runtimes.nvidia"
    return (
        '[%s]\n  runtime_type = "io.containerd.runc.v2"\n\n[%s.options]\n  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
        "  SystemdCgroup = %s\n" % (base, base, str(systemd_cgroup).lower())
    )


def containerd_files(spec: dict) -> dict[str, str]:
    version = int(spec.get("version", 2))
    if version not in CRI_PLUGIN:
        raise LabError("containerd.version must be 2 or 3, got %r" % version)
    layout = spec.get("layout", "single")
    nvidia = bool(spec.get("nvidia", True))
    # systemd_cgroup false on a real node: the real kubelet takes containerd's cgroup driver (the CRI's), and the lab has
    # no systemd as PID 1 to run pods under it.
    systemd_cgroup = bool(spec.get("systemd_cgroup", True))
    header = "# containerd configuration (generated for this node by its installer)\nversion = %d\n" % version
    if layout == "single":
        body = header + "\n" + _runc_table(version, systemd_cgroup) + ("\n" + _nvidia_table(version, systemd_cgroup) if nvidia else "")
        return {"/etc/containerd/config.toml": body}
    if layout == "conf.d":
        files = {"/etc/containerd/config.toml": header + 'imports = ["/etc/containerd/conf.d/*.toml"]\n\n' + _runc_table(version, systemd_cgroup)}
        if nvidia:
            files["/etc/containerd/conf.d/99-nvidia.toml"] = "version = %d\n\n%s" % (version, _nvidia_table(version, systemd_cgroup))
        return files
    raise LabError("containerd.layout must be single or conf.d, got %r" % layout)


def kubelet_files(spec: dict, *, reserved_default: str = "0-1") -> dict[str, str]:
    distribution = spec.get("distribution", "kubeadm")
    config = dict(KUBELET_BASE)
    config["reservedSystemCPUs"] = reserved_default
    for key, value in (spec.get("config") or {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    state_policy = spec.get("cpu_manager_state", config.get("cpuManagerPolicy", "none"))
    files = {
        "/etc/systemd/system/containerd.service": CONTAINERD_UNIT,
        "/var/lib/kubelet/device-plugins/.keep": "",
    }
    if state_policy:
        files[CPU_MANAGER_STATE] = json.dumps(
            {"policyName": state_policy, "defaultCpuSet": "" if state_policy == "none" else "2-127", "checksum": 0}
        )
    if distribution == "kubeadm":
        files["/var/lib/kubelet/config.yaml"] = yaml.safe_dump(config, sort_keys=False)
        files["/etc/systemd/system/kubelet.service"] = KUBELET_UNIT
        files["/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"] = KUBEADM_DROP_IN
        files["/var/lib/kubelet/kubeadm-flags.env"] = 'KUBELET_KUBEADM_ARGS="%s"\n' % spec.get(
            "kubeadm_flags", "--container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10"
        )
        if spec.get("extra_args") is not None:
            files["/etc/default/kubelet"] = "KUBELET_EXTRA_ARGS=%s\n" % spec["extra_args"]
        return files
    if distribution == "k3s":
        defaults = {key: config[key] for key in ("apiVersion", "kind", "cgroupDriver", "healthzBindAddress", "healthzPort")}
        files["/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf"] = yaml.safe_dump(defaults, sort_keys=False)
        rest = {key: value for key, value in config.items() if key not in defaults or key in ("apiVersion", "kind")}
        files["/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/10-site.conf"] = yaml.safe_dump(rest, sort_keys=False)
        k3s_config = {"node-label": ["gpuharden.io/distribution=k3s"], "kubelet-arg": list(spec.get("kubelet_args") or [])}
        files["/etc/rancher/k3s/config.yaml"] = "# k3s agent configuration\n" + yaml.safe_dump(k3s_config, sort_keys=False)
        files["/etc/systemd/system/k3s-agent.service"] = K3S_AGENT_UNIT
        return files
    raise LabError("kubelet.distribution must be kubeadm or k3s, got %r" % distribution)


def kubelet_unit(spec: dict) -> str:
    return "k3s-agent" if spec.get("distribution") == "k3s" else "kubelet"
