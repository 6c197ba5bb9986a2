# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The NVIDIA device plugin install: version gate, per-version config, rendering and audit (pure functions).

- ``parse_version`` / ``gate`` refuse unparseable tags and releases below 0.15.0; ``features`` says what a
  release understands (0.16 ``nvidiaDevRoot`` and ``deviceDiscoveryStrategy``, 0.17 IMEX, 0.18 no more
  ``FAIL_ON_INIT_ERROR=false`` in the static manifests so ``failOnInitError`` is really ``true``, 0.20 the
  shared-device allocation policy).
- ``desired_objects`` renders the ConfigMap, the plugin DaemonSet and the optional gpu-feature-discovery
  DaemonSet from the Jinja2 templates below.  The templates live here, as Python strings, because a module's
  AnsiballZ payload carries only the ``.py`` files of module_utils: a template file next to them would not
  travel with the module.  Values enter the templates only through the ``j`` filter (JSON, which is YAML), so
  no value can change the document's structure.
- ``audit`` reads existing plugin DaemonSets, their config files and the Nodes, and reports the seeds'
  misconfigurations (ignored resource renames, ``deviceListStrategy: none``, releases below 0.15, competing
  DaemonSets on the same nodes, an initContainer gating on ``nvidia-smi`` without a readiness probe, plugins
  that land on CPU-only nodes, no NVIDIA runtime, MIG without the monitor devices) with a repair for each.
- ``installer_of`` tells which other installer owns a DaemonSet (the NVIDIA GPU Operator through its
  ClusterPolicy, a Helm release, another controller).  Such objects are never deleted or rewritten: their
  findings name the field to change in that installer (``fix``), and when that installer already serves nodes
  the managed plugin would serve, the managed objects are not applied at all (``plugin_managed_by_other_installer``):
  two plugins on one node register the same resource with the kubelet and fight over it.
- ``rollout`` judges a DaemonSet's status and names the nodes whose pod is not ready.
"""

from __future__ import annotations

import hashlib
import json
import re

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _device_plugin_config as _config
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster import _node_labels
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _safe_parse
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._defaults import RUNTIME_CLASS_NAME
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding

try:
    import jinja2

    HAS_JINJA2 = True
except ImportError:
    jinja2 = None
    HAS_JINJA2 = False

try:
    import yaml

    HAS_YAML = True
except ImportError:
    yaml = None
    HAS_YAML = False

MIN_VERSION = (0, 15, 0)
NEWEST_KNOWN = _config.NEWEST_KNOWN
MIG_STRATEGIES = _config.MIG_STRATEGIES
DEVICE_LIST_STRATEGIES = _config.DEVICE_LIST_STRATEGIES
DEVICE_ID_STRATEGIES = _config.DEVICE_ID_STRATEGIES
DISCOVERY_STRATEGIES = _config.DISCOVERY_STRATEGIES
ALLOCATION_POLICIES = _config.ALLOCATION_POLICIES
RESOURCE_DOMAIN = _config.RESOURCE_DOMAIN
PLUGIN_CONTAINER = "nvidia-device-plugin-ctr"
GFD_NAME = "gpu-feature-discovery"
CONFIG_DIR = "/etc/nvidia-device-plugin"
CONFIG_KEY = "config.yaml"
CHECKSUM_ANNOTATION = "gpuharden.io/config-sha256"
CONTAINER_DRIVER_ROOT = "/driver-root"  # flags.plugin.containerDriverRoot default (api/config/v1/flags.go)
MANAGED_BY = "app.kubernetes.io/managed-by"
# Installers whose objects the managed plugin may take over when the user opts in (adopt_installers).  The GPU
# Operator is not one: it recreates whatever is deleted or changed in the objects its ClusterPolicy owns.
ADOPTABLE_INSTALLERS = ("helm",)
APP_LABEL = "app.kubernetes.io/name"
# Taints the DaemonSet controller tolerates by itself on every daemon pod.
DAEMONSET_AUTO_TOLERATED = {
    ("node.kubernetes.io/not-ready", "NoExecute"), ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"), ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"), ("node.kubernetes.io/unschedulable", "NoSchedule"),
}
SAMPLE = 20  # node names listed in one finding; the count is always complete

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z][0-9A-Za-z.-]*))?$")
_PRERELEASE_RE = re.compile(r"^(rc|alpha|beta|pre|dev)[.\d]*", re.IGNORECASE)


# --------------------------------------------------------------------------------------------------------
# Versions


def parse_version(tag):
    """(major, minor, patch, prerelease or None) of a plugin tag such as ``v0.17.0``, ``v0.17.0-ubi9``; None if not one."""
    if not isinstance(tag, str):
        return None
    match = _VERSION_RE.match(tag.strip())
    if not match:
        return None
    suffix = match.group(4)
    prerelease = suffix if suffix and _PRERELEASE_RE.match(suffix) else None
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), prerelease


def image_tag(image):
    """The tag of an image reference (``registry:5000/repo:tag@sha256:...``); None when it has none."""
    if not isinstance(image, str) or not image:
        return None
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else None


def version_text(version):
    return "%d.%d.%d" % version[:3]


def below_minimum(parsed):
    """True for releases before 0.15.0, including 0.15.0's release candidates."""
    return parsed[:3] < MIN_VERSION or (parsed[:3] == MIN_VERSION and parsed[3] is not None)


def gate(tag, where="option version"):
    """The parsed release of ``tag``; GpuhardenError for an unparseable tag or a release below 0.15.0."""
    parsed = parse_version(tag)
    if parsed is None:
        raise GpuhardenError(
            "device_plugin: %s=%r is not a device plugin release tag such as v0.17.0; a tag that cannot be compared "
            "with the minimum %s (latest, a digest, a branch) is refused" % (where, tag, version_text(MIN_VERSION)))
    if below_minimum(parsed):
        raise GpuhardenError(
            "device_plugin: %s=%r is below %s, the oldest supported release (static manifests under "
            "deployments/static, gpu-feature-discovery in the same image, cdi-cri, MPS); use v%s or newer"
            % (where, tag, version_text(MIN_VERSION), version_text(NEWEST_KNOWN)))
    return parsed


def features(parsed):
    """What a release understands, and what its static manifests did."""
    v = parsed[:3]
    return {
        "nvidia_dev_root": v >= (0, 16, 0),
        "device_discovery_strategy": v >= (0, 16, 0),
        "volume_mounts_needs_sys_admin": v >= (0, 16, 0),
        "imex": v >= (0, 17, 0),
        # 0.15-0.17 static manifests set FAIL_ON_INIT_ERROR=false; from 0.18 the code default true applies.
        "fail_on_init_error_default": True,
        "static_manifest_fail_on_init_error": v >= (0, 18, 0),
        "shared_devices_allocation_policy": v >= (0, 20, 0),
        "newer_than_known": v > NEWEST_KNOWN,
    }


# --------------------------------------------------------------------------------------------------------
# Options -> plugin config


def _newer_option(params, name, feat, since, version):
    """The option's value (None: unset); set for a release older than ``since`` (``feat[name]`` false), an error."""
    value = params.get(name)
    if value is not None and not feat[name]:
        raise GpuhardenError("device_plugin: option %s=%r needs release %s or newer; version is %s" % (name, value, since, version))
    return value


def _list_strategies(value, where):
    values = value if isinstance(value, list) else [value]
    if not values:
        raise GpuhardenError("device_plugin: %s is empty; use one or more of %s" % (where, ", ".join(DEVICE_LIST_STRATEGIES)))
    out = []
    for item in values:
        for part in str(item).split(",") if isinstance(item, str) else [item]:
            if part == "none":
                raise GpuhardenError(
                    "device_plugin: %s=none is not a device list strategy: the plugin refuses to start with it "
                    "(invalid --device-list-strategy option); use one of %s (envvar is the default)"
                    % (where, ", ".join(DEVICE_LIST_STRATEGIES)))
            if part not in DEVICE_LIST_STRATEGIES:
                raise GpuhardenError("device_plugin: %s=%r is not one of %s" % (where, part, ", ".join(DEVICE_LIST_STRATEGIES)))
            if part not in out:
                out.append(part)
    return out


def _choice(params, option, choices):
    value = params.get(option)
    if value not in choices:
        raise GpuhardenError("device_plugin: option %s=%r is not one of %s" % (option, value, ", ".join(choices)))
    return value


def _abs_path(params, option):
    value = params.get(option)
    if not isinstance(value, str) or not value.startswith("/"):
        raise GpuhardenError("device_plugin: option %s=%r must be an absolute path on the node" % (option, value))
    return value


def qualify_resource(name):
    """The resource name the plugin advertises for a configured name (it prefixes names without a domain)."""
    return name if "/" in name else "%s/%s" % (RESOURCE_DOMAIN, name)


# Option time_slicing's keys in gpuharden's spelling and in the plugin's (api/config/v1/replicas.go
# ReplicatedResources), both honoured; ``replicas`` is gpuharden's, for every resource listed by name.
TIME_SLICING_KEYS = {"replicas": "replicas", "resources": "resources", "rename_by_default": "renameByDefault",
                     "renameByDefault": "renameByDefault", "fail_requests_greater_than_one": "failRequestsGreaterThanOne",
                     "failRequestsGreaterThanOne": "failRequestsGreaterThanOne"}
TIME_SLICING_RESOURCE_KEYS = ("name", "replicas")


def _unknown_key(where, key, known):
    near = _config.closest(key, known)
    return GpuhardenError("device_plugin: option %s: unknown key %r%s; the known keys are %s. Nothing is applied: a key left "
                          "out would silently change what is shared" % (where, key, " (did you mean %s?)" % near if near else "",
                                                                        ", ".join(known)))


def _replicas(value, where):
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise GpuhardenError("device_plugin: option %s=%r must be an integer of at least 2 (the plugin refuses fewer: "
                             "\"number of replicas must be >= 2\")" % (where, value))
    return value


def _time_slicing_resource(entry, index, replicas):
    """(qualified name, replicas) of one time_slicing.resources entry: a name, or the plugin's {name, replicas}."""
    where = "time_slicing.resources[%d]" % index
    if isinstance(entry, dict):
        for key in entry:
            if key in ("rename", "devices"):
                raise GpuhardenError("device_plugin: option %s.%s is not supported: the plugin ignores it (it shares every "
                                     "device under the resource's own name, or <name>.shared with renameByDefault)" % (where, key))
            if key not in TIME_SLICING_RESOURCE_KEYS:
                raise _unknown_key(where, key, TIME_SLICING_RESOURCE_KEYS)
        name, replicas = entry.get("name"), entry.get("replicas", replicas)
    elif isinstance(entry, str):
        name = entry
    else:
        raise GpuhardenError("device_plugin: option %s=%r must be a resource name or a mapping {name, replicas}" % (where, entry))
    problem = _config.resource_name_problem(name)
    if problem:
        raise GpuhardenError("device_plugin: option %s: %s, which the plugin refuses" % (where, problem))
    if replicas is None:
        raise GpuhardenError("device_plugin: option %s (%s) has no replicas: set time_slicing.replicas, or replicas in the entry"
                             % (where, name))
    return qualify_resource(name), _replicas(replicas, where + ".replicas")


def _time_slicing(value):
    """Option time_slicing as the plugin's sharing.timeSlicing.  Keys in either spelling (rename_by_default or
    renameByDefault, ...); ``resources`` lists names, each shared in ``replicas``, or the plugin's {name, replicas}.
    An unknown key is refused, naming the closest known one (a dropped renameByDefault once shared under the wrong name)."""
    if not value:
        return None
    if not isinstance(value, dict):
        raise GpuhardenError("device_plugin: option time_slicing must be a mapping, not %s" % type(value).__name__)
    given = {}
    for key, item in value.items():
        name = TIME_SLICING_KEYS.get(key)
        if name is None:
            raise _unknown_key("time_slicing", key, list(TIME_SLICING_KEYS))
        if name in given and given[name] != item:
            raise GpuhardenError("device_plugin: option time_slicing gives %s twice, with different values (%r and %r)"
                                 % (name, given[name], item))
        given[name] = item
    replicas = given.get("replicas")
    if replicas is not None:
        _replicas(replicas, "time_slicing.replicas")
    resources = given.get("resources") or ["nvidia.com/gpu"]
    if not isinstance(resources, list):
        raise GpuhardenError("device_plugin: option time_slicing.resources=%r must be a list" % (resources,))
    shared, flags = [], {}
    for index, entry in enumerate(resources):
        name, count = _time_slicing_resource(entry, index, replicas)
        shared.append({"name": name, "replicas": count})
    for key in ("renameByDefault", "failRequestsGreaterThanOne"):
        try:
            flags[key] = boolean(given.get(key, False), strict=True)
        except TypeError:
            raise GpuhardenError("device_plugin: option time_slicing.%s=%r is not a boolean" % (key, given.get(key))) from None
    return dict(flags, resources=shared)


def check_params(params):
    """Validate the options (pure); returns the settings ``desired_objects`` renders."""
    version = params.get("version")
    parsed = gate(version)
    feat = features(parsed)
    warnings = []
    if feat["newer_than_known"]:
        warnings.append("device_plugin: %s is newer than %s, the newest release whose config this module knows; "
                        "options are written as for %s" % (version, version_text(NEWEST_KNOWN), version_text(NEWEST_KNOWN)))
    namespace = _node_labels.check_dns_label(params.get("namespace"), "device_plugin: option namespace")
    name = _node_labels.check_dns_subdomain(params.get("name"), "device_plugin: option name")
    config_map = _node_labels.check_dns_subdomain(params.get("config_map_name"), "device_plugin: option config_map_name")
    selector_value = _node_labels.check_label_value("name", params.get("selector_value"), "device_plugin: option selector_value")
    if not selector_value:
        raise GpuhardenError("device_plugin: option selector_value is empty")
    node_selector = _node_labels.check_labels(params.get("node_selector"), "device_plugin: option node_selector")
    if not node_selector:
        raise GpuhardenError(
            "device_plugin: option node_selector is empty: without one the plugin lands on CPU-only nodes, where it "
            "crash-loops (failOnInitError is true since 0.18); select GPU nodes, e.g. nvidia.com/gpu.present: 'true'")
    tolerations = _node_labels.check_tolerations(params.get("tolerations"), "device_plugin: option tolerations")
    registry = (params.get("image_registry") or "").rstrip("/")
    repository = (params.get("image_repository") or "").strip("/")
    if not repository or any(ch.isspace() or ch in ":@" for ch in repository) or any(ch.isspace() or ch == "@" for ch in registry):
        raise GpuhardenError("device_plugin: options image_registry=%r / image_repository=%r do not form an image reference"
                             % (params.get("image_registry"), params.get("image_repository")))
    list_strategies = _list_strategies(params.get("device_list_strategy"), "option device_list_strategy")
    mig_strategy = _choice(params, "mig_strategy", MIG_STRATEGIES)
    id_strategy = _choice(params, "device_id_strategy", DEVICE_ID_STRATEGIES)
    driver_root = _abs_path(params, "nvidia_driver_root")
    dev_root = _newer_option(params, "nvidia_dev_root", feat, "0.16.0", version)
    if dev_root is not None:
        dev_root = _abs_path(params, "nvidia_dev_root")
    discovery = _newer_option(params, "device_discovery_strategy", feat, "0.16.0", version)
    if discovery is not None:
        _choice(params, "device_discovery_strategy", DISCOVERY_STRATEGIES)
    policy = _newer_option(params, "shared_devices_allocation_policy", feat, "0.20.0", version)
    if policy is not None:
        _choice(params, "shared_devices_allocation_policy", ALLOCATION_POLICIES)
    time_slicing = _time_slicing(params.get("time_slicing"))
    if time_slicing and mig_strategy == "single":
        warnings.append("device_plugin: time_slicing with mig_strategy single shares MIG devices advertised as nvidia.com/gpu")
    pull_secrets = params.get("image_pull_secrets") or []
    for secret in pull_secrets:
        _node_labels.check_dns_subdomain(secret, "device_plugin: option image_pull_secrets")
    if params.get("pull_policy") not in ("Always", "IfNotPresent", "Never"):
        raise GpuhardenError("device_plugin: option pull_policy=%r is not Always, IfNotPresent or Never" % (params.get("pull_policy"),))
    if params.get("priority_class_name"):
        _node_labels.check_dns_subdomain(params["priority_class_name"], "device_plugin: option priority_class_name")
    if "volume-mounts" in list_strategies and feat["volume_mounts_needs_sys_admin"]:
        warnings.append("device_plugin: deviceListStrategy volume-mounts needs CAP_SYS_ADMIN since 0.16; the container gets it")
    runtime_class = params.get("runtime_class_name")
    if runtime_class is None:
        raise GpuhardenError("device_plugin: option runtime_class_name is unset; name the RuntimeClass whose handler is "
                             "containerd's nvidia runtime (nvidia), or \"\" when nvidia is the default runtime on every GPU node")
    if runtime_class:
        _node_labels.check_dns_subdomain(runtime_class, "device_plugin: option runtime_class_name")
    else:
        # The plugin container gets libnvidia-ml.so.1 only from the NVIDIA container runtime
        # (NVIDIA/k8s-device-plugin README "Prerequisites", Helm value runtimeClassName).
        warnings.append("device_plugin: runtime_class_name is empty: the plugin loads NVML only where nvidia is containerd's "
                        "default runtime (default_runtime_name = \"nvidia\"); on any other GPU node it crash-loops")
    adopt = list(params.get("adopt_installers") or [])
    for installer in adopt:
        if installer == "gpu-operator":
            raise GpuhardenError("device_plugin: option adopt_installers: gpu-operator is never adopted: the operator recreates "
                                 "every object its ClusterPolicy owns; change the ClusterPolicy (spec.devicePlugin) instead, or "
                                 "disable its plugin (spec.devicePlugin.enabled: false) and let gpuharden install one")
        if installer not in ADOPTABLE_INSTALLERS:
            raise GpuhardenError("device_plugin: option adopt_installers: %r is not one of %s"
                                 % (installer, ", ".join(ADOPTABLE_INSTALLERS)))
    return {
        "name": name, "namespace": namespace, "config_map_name": config_map, "selector_value": selector_value,
        "version": version, "parsed": parsed, "features": feat,
        "image": "%s/%s:%s" % (registry, repository, version) if registry else "%s:%s" % (repository, version),
        "pull_policy": params.get("pull_policy"), "image_pull_secrets": list(pull_secrets),
        "node_selector": node_selector, "tolerations": tolerations,
        "priority_class_name": params.get("priority_class_name") or "",
        "mig_strategy": mig_strategy, "device_list_strategy": list_strategies, "device_id_strategy": id_strategy,
        "fail_on_init_error": bool(params.get("fail_on_init_error")), "nvidia_driver_root": driver_root,
        "nvidia_dev_root": dev_root, "device_discovery_strategy": discovery, "pass_device_specs": bool(params.get("pass_device_specs")),
        "shared_devices_allocation_policy": policy, "time_slicing": time_slicing,
        "gpu_feature_discovery": bool(params.get("gpu_feature_discovery")), "runtime_class_name": runtime_class,
        "adopt_installers": adopt, "warnings": warnings,
    }


def uses_cdi(strategies):
    return any(str(s).startswith("cdi-") for s in strategies)


def mounts_driver_root(settings):
    """The driver root is mounted at /driver-root: for another root than /, and always with a CDI strategy.

    The Helm chart mounts it whenever nvidiaDriverRoot is set, "required for CDI detection to work correctly"
    (NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/templates/daemonset-device-plugin.yml).
    """
    return settings["nvidia_driver_root"] != "/" or uses_cdi(settings["device_list_strategy"])


def needs_sys_admin(settings):
    """CAP_SYS_ADMIN as the Helm chart adds it (templates/_helpers.tpl requiresCapSysAdmin): a MIG strategy other
    than none, or deviceListStrategy volume-mounts from 0.16 on (#856)."""
    return settings["mig_strategy"] != "none" or (
        "volume-mounts" in settings["device_list_strategy"] and settings["features"]["volume_mounts_needs_sys_admin"])


def plugin_env(settings):
    """Environment of the plugin container: NVIDIA_MIG_MONITOR_DEVICES=all with a MIG strategy, so that the NVIDIA
    runtime gives it the MIG monitor capability (Helm chart _helpers.tpl addMigMonitorDevices; without it the
    plugin fails on MIG nodes with "Insufficient Permissions", k8s-device-plugin#399)."""
    return [{"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}] if settings["mig_strategy"] != "none" else []


def plugin_config(settings):
    """The plugin's config file (api/config/v1) for the release, as a dict."""
    feat = settings["features"]
    strategies = settings["device_list_strategy"]
    plugin = {
        "passDeviceSpecs": settings["pass_device_specs"],
        "deviceListStrategy": strategies[0] if len(strategies) == 1 else list(strategies),
        "deviceIDStrategy": settings["device_id_strategy"],
    }
    if mounts_driver_root(settings):
        plugin["containerDriverRoot"] = CONTAINER_DRIVER_ROOT
    if settings["shared_devices_allocation_policy"] and feat["shared_devices_allocation_policy"]:
        plugin["sharedDevicesAllocationPolicy"] = settings["shared_devices_allocation_policy"]
    flags = {
        "migStrategy": settings["mig_strategy"],
        "failOnInitError": settings["fail_on_init_error"],
        "nvidiaDriverRoot": settings["nvidia_driver_root"],
    }
    # Unset stays unset: the plugin then uses nvidiaDriverRoot (NVIDIA/k8s-device-plugin api/config/v1/config.go);
    # writing "/" would be wrong with the driver container (/run/nvidia/driver).
    if feat["nvidia_dev_root"] and settings["nvidia_dev_root"]:
        flags["nvidiaDevRoot"] = settings["nvidia_dev_root"]
    if settings["device_discovery_strategy"]:
        flags["deviceDiscoveryStrategy"] = settings["device_discovery_strategy"]
    flags["plugin"] = plugin
    config = {"version": "v1", "flags": flags}
    if settings["time_slicing"]:
        config["sharing"] = {"timeSlicing": settings["time_slicing"]}
    return config


# --------------------------------------------------------------------------------------------------------
# Templates

CONFIG_MAP_TEMPLATE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ config_map_name | j }}
  namespace: {{ namespace | j }}
  labels: {{ labels | j }}
data:
  {{ config_key | j }}: {{ config_text | j }}
"""

# Both DaemonSets (the plugin and gpu-feature-discovery) share everything down to their containers; the
# ds_* values say which one is rendered.
DAEMONSET_HEAD = """\
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: {{ ds_name | j }}
  namespace: {{ namespace | j }}
  labels: {{ ds_labels | j }}
spec:
  selector:
    matchLabels: {{ ds_selector | j }}
  updateStrategy:
    type: RollingUpdate
  template:
    metadata:
      labels: {{ ds_pod_labels | j }}
      annotations: {{ {checksum_annotation: config_checksum} | j }}
    spec:
      nodeSelector: {{ node_selector | j }}
      tolerations: {{ tolerations | j }}
{% if runtime_class_name %}
      runtimeClassName: {{ runtime_class_name | j }}
{% endif %}
{% if priority_class_name %}
      priorityClassName: {{ priority_class_name | j }}
{% endif %}
{% if image_pull_secrets %}
      imagePullSecrets: {{ image_pull_secrets | map('pull_secret') | list | j }}
{% endif %}
      containers:
"""

PLUGIN_TEMPLATE = DAEMONSET_HEAD + """\
        - name: {{ container_name | j }}
          image: {{ image | j }}
          imagePullPolicy: {{ pull_policy | j }}
          args: {{ ["--config-file=" ~ config_dir ~ "/" ~ config_key] | j }}
{% if env %}
          env: {{ env | j }}
{% endif %}
          securityContext:
            allowPrivilegeEscalation: false
            capabilities:
              drop: [ALL]
{% if sys_admin %}
              add: [SYS_ADMIN]
{% endif %}
          volumeMounts:
            - name: kubelet-device-plugins-dir
              mountPath: /var/lib/kubelet/device-plugins
            - name: config
              mountPath: {{ config_dir | j }}
              readOnly: true
{% if mount_driver_root %}
            - name: driver-root
              mountPath: {{ container_driver_root | j }}
              readOnly: true
{% endif %}
{% if cdi %}
            - name: cdi-root
              mountPath: /var/run/cdi
{% endif %}
      volumes:
        - name: kubelet-device-plugins-dir
          hostPath:
            path: /var/lib/kubelet/device-plugins
            type: Directory
        - name: config
          configMap:
            name: {{ config_map_name | j }}
{% if mount_driver_root %}
        - name: driver-root
          hostPath:
            path: {{ driver_root | j }}
            type: Directory
{% endif %}
{% if cdi %}
        - name: cdi-root
          hostPath:
            path: /var/run/cdi
            type: DirectoryOrCreate
{% endif %}
"""

GFD_TEMPLATE = DAEMONSET_HEAD + """\
        - name: gpu-feature-discovery-ctr
          image: {{ image | j }}
          imagePullPolicy: {{ pull_policy | j }}
          command: [/usr/bin/gpu-feature-discovery]
          args: {{ ["--config-file=" ~ config_dir ~ "/" ~ config_key] | j }}
          securityContext:
            privileged: true
          volumeMounts:
            - name: output-dir
              mountPath: /etc/kubernetes/node-feature-discovery/features.d
            - name: host-sys
              mountPath: /sys
              readOnly: true
            - name: config
              mountPath: {{ config_dir | j }}
              readOnly: true
      volumes:
        - name: output-dir
          hostPath:
            path: /etc/kubernetes/node-feature-discovery/features.d
            type: DirectoryOrCreate
        - name: host-sys
          hostPath:
            path: /sys
        - name: config
          configMap:
            name: {{ config_map_name | j }}
"""


def _render(template, values):
    if not HAS_JINJA2 or not HAS_YAML:
        raise GpuhardenError("device_plugin: rendering needs jinja2 and PyYAML on the controller (both come with ansible-core)")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False, trim_blocks=True, keep_trailing_newline=True)
    env.filters["j"] = lambda value: json.dumps(value, sort_keys=True)
    env.filters["pull_secret"] = lambda name: {"name": name}
    text = env.from_string(template).render(**values)
    return _safe_parse.safe_load(text, "the rendered device plugin objects", duplicate_keys=False)


def refusals_of(config, parsed):
    """What the plugin release ``parsed`` refuses (and ignores) in ``config``, the way the audit reads an installed one:
    (refusals, unknown keys)."""
    version = _config.schema_version(parsed)
    decoded = _config.decode(config, version, "the rendered config")
    return decoded.refusals + _config.settings_refusals(decoded.config, version, source="the rendered config"), decoded.unknown


def desired_objects(settings):
    """[ConfigMap, plugin DaemonSet, (gpu-feature-discovery DaemonSet)] as dicts, rendered from the templates.  A config
    the plugin would refuse (or whose keys it would ignore) is never rendered: the options are checked for that first,
    and this guard says where they missed."""
    config = plugin_config(settings)
    refused, ignored = refusals_of(config, settings["parsed"])
    if refused or ignored:
        raise GpuhardenError("device_plugin: internal error: the config rendered for %s would be refused or half ignored by the "
                             "plugin: %s" % (settings["version"], "; ".join([r["message"] for r in refused] + [u["where"] for u in ignored])))
    config_text = yaml.safe_dump(config, default_flow_style=False, sort_keys=False) if HAS_YAML else json.dumps(config)
    managed = {"app.kubernetes.io/managed-by": "gpuharden", "app.kubernetes.io/part-of": "gpuharden"}
    values = {
        "name": settings["name"], "namespace": settings["namespace"], "config_map_name": settings["config_map_name"],
        "labels": dict(managed, **{APP_LABEL: "nvidia-device-plugin"}),
        "selector": {"name": settings["selector_value"]},
        "pod_labels": {"name": settings["selector_value"], APP_LABEL: "nvidia-device-plugin"},
        "checksum_annotation": CHECKSUM_ANNOTATION,
        "config_checksum": hashlib.sha256(config_text.encode("utf-8")).hexdigest(),
        "config_key": CONFIG_KEY, "config_dir": CONFIG_DIR, "config_text": config_text,
        "node_selector": settings["node_selector"], "tolerations": settings["tolerations"],
        "priority_class_name": settings["priority_class_name"], "image_pull_secrets": settings["image_pull_secrets"],
        "container_name": PLUGIN_CONTAINER, "image": settings["image"], "pull_policy": settings["pull_policy"],
        "sys_admin": needs_sys_admin(settings), "env": plugin_env(settings),
        "driver_root": settings["nvidia_driver_root"], "mount_driver_root": mounts_driver_root(settings),
        "container_driver_root": CONTAINER_DRIVER_ROOT, "runtime_class_name": settings["runtime_class_name"],
        "cdi": uses_cdi(settings["device_list_strategy"]),
        "gfd_name": GFD_NAME, "gfd_labels": {APP_LABEL: GFD_NAME, "app.kubernetes.io/managed-by": "gpuharden"},
    }
    plugin = {"ds_name": values["name"], "ds_labels": values["labels"], "ds_selector": values["selector"],
              "ds_pod_labels": values["pod_labels"]}
    objects = [_render(CONFIG_MAP_TEMPLATE, values), _render(PLUGIN_TEMPLATE, dict(values, **plugin))]
    if settings["gpu_feature_discovery"]:
        gfd = {"ds_name": values["gfd_name"], "ds_labels": values["gfd_labels"], "ds_selector": values["gfd_labels"],
               "ds_pod_labels": values["gfd_labels"]}
        objects.append(_render(GFD_TEMPLATE, dict(values, **gfd)))
    return objects, config


def selector_immutable(live, desired):
    """A message when the live DaemonSet's selector differs (spec.selector is immutable): delete + create needed."""
    live_selector = ((live.get("spec") or {}).get("selector") or {})
    want = desired["spec"]["selector"]
    if live_selector and live_selector != want:
        return ("device_plugin: DaemonSet %s/%s has selector %s, the desired one is %s; spec.selector is immutable, so "
                "it must be deleted and created again: run with force=true to do that (its pods are replaced)"
                % (desired["metadata"]["namespace"], desired["metadata"]["name"], json.dumps(live_selector, sort_keys=True),
                   json.dumps(want, sort_keys=True)))
    return None


# --------------------------------------------------------------------------------------------------------
# Which nodes a pod template lands on


def _expression_matches(expression, labels, name):
    key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
    present = key in labels
    value = labels.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            return int(value) > int(values[0]) if operator == "Gt" else int(value) < int(values[0])
        except (TypeError, ValueError):
            return False
    return False


def _term_matches(term, labels, name):
    if not term.get("matchExpressions") and not term.get("matchFields"):
        return False  # an empty term matches nothing
    for expression in term.get("matchExpressions") or []:
        if not _expression_matches(expression, labels, name):
            return False
    for field in term.get("matchFields") or []:
        if field.get("key") != "metadata.name" or not _expression_matches(dict(field, key="n"), {"n": name}, name):
            return False
    return True


def _tolerates(tolerations, taint):
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if not toleration.get("key"):
            if toleration.get("operator") == "Exists":
                return True
            continue
        if toleration["key"] != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists" or (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def lands_on(pod_spec, node):
    """True when a DaemonSet pod with this spec is placed on the node (selector, required affinity, taints)."""
    meta = node.get("metadata") or {}
    labels, name = meta.get("labels") or {}, meta.get("name")
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if terms is not None and not any(_term_matches(term, labels, name) for term in terms):
        return False
    tolerations = pod_spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if (taint.get("key"), taint.get("effect")) in DAEMONSET_AUTO_TOLERATED:
            continue
        if not _tolerates(tolerations, taint):
            return False
    return True


def targets(pod_spec, nodes):
    return sorted((n.get("metadata") or {}).get("name") for n in nodes if lands_on(pod_spec, n))


# --------------------------------------------------------------------------------------------------------
# Audit of existing installs


def _words(container):
    return list(container.get("command") or []) + list(container.get("args") or [])


def _is_config_manager(container):
    return "config-manager" in " ".join(_words(container))


# Containers of the plugin's image that are not the plugin: gpu-feature-discovery, the config-manager (init and
# sidecar) and the MPS control daemon, which the Helm chart runs as its own DaemonSet with the same image
# (NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/templates/daemonset-mps-control-daemon.yml).
NOT_THE_PLUGIN = ("gpu-feature-discovery", "config-manager", "mps-control-daemon")


def plugin_container(pod_spec):
    """The device plugin container of a pod spec (not gpu-feature-discovery, the config manager or the MPS control
    daemon), or None."""
    for container in pod_spec.get("containers") or []:
        words = " ".join(_words(container) + [container.get("name") or ""])
        if any(word in words for word in NOT_THE_PLUGIN):
            continue
        if "k8s-device-plugin" in (container.get("image") or ""):
            return container
    return None


def is_plugin_daemonset(ds):
    template = (ds.get("spec") or {}).get("template") or {}
    return plugin_container(template.get("spec") or {}) is not None


def _env(container, name):
    for item in container.get("env") or []:
        if item.get("name") == name and "value" in item:
            return str(item["value"])
    return None


# Flags with another name too (NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go: driver-root and dev-root
# have the aliases nvidia-driver-root and nvidia-dev-root).
FLAG_ALIASES = {"nvidia-driver-root": ("driver-root",), "nvidia-dev-root": ("dev-root",)}


def _setting(container, flag, env):
    words, value, used = _words(container), None, flag
    names = (flag,) + FLAG_ALIASES.get(flag, ())
    for index, word in enumerate(words):
        for name in names:
            if word.startswith("--%s=" % name):
                value, used = word.split("=", 1)[1], name
            elif word == "--%s" % name and index + 1 < len(words):
                value, used = words[index + 1], name
    if value is not None:
        return value, "argument --%s" % used
    value = _env(container, env)
    if value is not None:
        return value, "environment variable %s" % env
    return None, None


def _mount_of(container, path, volumes):
    """(volume name, volume, path inside the volume) of the mount that holds ``path`` in the container, or None."""
    for mount in container.get("volumeMounts") or []:
        mount_path = (mount.get("mountPath") or "").rstrip("/")
        volume = volumes.get(mount.get("name"))
        if volume is None:
            continue
        if mount.get("subPath"):
            if path == mount_path:
                return mount.get("name"), volume, mount["subPath"]
        elif path.startswith(mount_path + "/"):
            return mount.get("name"), volume, path[len(mount_path) + 1:]
    return None


def _config_manager_source(spec, volume_name, volumes):
    """The ConfigMap a config-manager copies into the volume ``volume_name``, or None.

    The Helm chart and the GPU Operator run ``config-manager`` (init container and sidecar): it copies the config
    chosen per node (label nvidia.com/device-plugin.config, else DEFAULT_CONFIG) from the ConfigMap mounted at
    CONFIG_FILE_SRCDIR to CONFIG_FILE_DST in an emptyDir, which the plugin reads through CONFIG_FILE
    (NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/templates/daemonset-device-plugin.yml).
    """
    for manager in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if not _is_config_manager(manager):
            continue
        dst, srcdir = _env(manager, "CONFIG_FILE_DST"), _env(manager, "CONFIG_FILE_SRCDIR")
        target = _mount_of(manager, dst, volumes) if dst else None
        if not target or target[0] != volume_name or not srcdir:
            continue
        source = _mount_of(manager, srcdir.rstrip("/") + "/-", volumes)
        if source and source[1].get("configMap"):
            return source[1]["configMap"].get("name")
    return None


def config_sources(ds):
    """Where the plugin's config file comes from: [(namespace, ConfigMap name or None, key, path)], [] for no file.

    ``key`` is None when every key of the ConfigMap is a config the plugin may get (the config-manager picks one
    per node); a name of None means the file comes from nowhere this audit can see.
    """
    meta = ds.get("metadata") or {}
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    container = plugin_container(spec) or {}
    path, _where = _setting(container, "config-file", "CONFIG_FILE")
    if not path:
        return []
    namespace = meta.get("namespace")
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    mounted = _mount_of(container, path, volumes)
    if mounted:
        volume_name, volume, key_path = mounted
        if volume.get("configMap"):
            key = key_path
            for item in volume["configMap"].get("items") or []:
                if item.get("path") == key_path:
                    key = item.get("key")
            return [(namespace, volume["configMap"].get("name"), key, path)]
        if "emptyDir" in volume:
            name = _config_manager_source(spec, volume_name, volumes)
            if name:
                return [(namespace, name, None, path)]
    return [(namespace, None, None, path)]


def referenced_config_maps(daemonsets):
    """(namespace, name) of every ConfigMap a plugin DaemonSet reads its config file from."""
    refs = set()
    for ds in daemonsets:
        if is_plugin_daemonset(ds):
            for namespace, name, _key, _path in config_sources(ds):
                if name:
                    refs.add((namespace, name))
    return sorted(refs)


class Unreadable:
    """A referenced ConfigMap the identity may not read (403): reported, never fatal."""

    def __init__(self, reason):
        self.reason = reason


def _nodes_text(names):
    shown = ", ".join(names[:SAMPLE])
    return shown + (" and %d more" % (len(names) - SAMPLE) if len(names) > SAMPLE else "")


# --------------------------------------------------------------------------------------------------------
# Other installers


def _name_of(obj):
    return (obj.get("metadata") or {}).get("name")


def installer_of(obj, cluster_policies=()):
    """The other installer that manages this object, or None (a static manifest, kubectl, gpuharden itself).

    Returns ``{"installer": "gpu-operator" | "helm" | "argocd" | "flux" | "controller" | <managed-by value>,
    "name": the object to fix it in}``.
    """
    meta = obj.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    template_labels = ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {})
    managed_by = str(labels.get(MANAGED_BY) or template_labels.get(MANAGED_BY) or "")
    owners = meta.get("ownerReferences") or []
    # The GPU Operator sets a controller reference to its ClusterPolicy on every object it creates, and recreates
    # what is deleted or changed (NVIDIA/gpu-operator controllers/object_controls.go, SetControllerReference).
    for owner in owners:
        if owner.get("kind") == "ClusterPolicy" and str(owner.get("apiVersion") or "").startswith("nvidia.com/"):
            return {"installer": "gpu-operator", "name": "ClusterPolicy %s" % owner.get("name")}
    if managed_by == "gpu-operator":
        names = sorted(str(_name_of(policy)) for policy in cluster_policies)
        return {"installer": "gpu-operator", "name": "ClusterPolicy %s" % names[0] if len(names) == 1 else "the GPU Operator's ClusterPolicy"}
    # Helm 3 labels (managed-by Helm, helm.sh/chart: the chart's common labels, templates/_helpers.tpl) and
    # annotates (meta.helm.sh/release-name, -namespace) every object of a release.
    if managed_by.lower() == "helm" or "helm.sh/chart" in labels or "meta.helm.sh/release-name" in annotations:
        release = annotations.get("meta.helm.sh/release-name") or labels.get("app.kubernetes.io/instance") or "?"
        namespace = annotations.get("meta.helm.sh/release-namespace") or meta.get("namespace")
        chart = labels.get("helm.sh/chart")
        return {"installer": "helm", "name": "Helm release %s/%s%s" % (namespace, release, " (chart %s)" % chart if chart else "")}
    if owners:
        owner = next((o for o in owners if o.get("controller")), owners[0])
        return {"installer": "controller", "name": "%s %s" % (owner.get("kind"), owner.get("name"))}
    if "argocd.argoproj.io/tracking-id" in annotations:
        return {"installer": "argocd", "name": "Argo CD application %s" % annotations["argocd.argoproj.io/tracking-id"].split(":", 1)[0]}
    if "kustomize.toolkit.fluxcd.io/name" in labels:
        kustomization = "%s/%s" % (labels.get("kustomize.toolkit.fluxcd.io/namespace"), labels["kustomize.toolkit.fluxcd.io/name"])
        return {"installer": "flux", "name": "Flux Kustomization %s" % kustomization}
    if managed_by and managed_by != "gpuharden":
        return {"installer": managed_by, "name": "its installer (app.kubernetes.io/managed-by: %s)" % managed_by}
    return None


# Where each finding is fixed in the installer that owns the DaemonSet: ClusterPolicy fields of the GPU Operator
# (NVIDIA/gpu-operator api/nvidia/v1/clusterpolicy_types.go) and values of the nvidia-device-plugin Helm chart
# (NVIDIA/k8s-device-plugin deployments/helm/nvidia-device-plugin/values.yaml).
FIX_FIELDS = {
    "gpu-operator": {
        "plugin_no_nvidia_runtime": "spec.operator.runtimeClass",
        "plugin_mig_privileges_missing": "spec.mig.strategy",
        "plugin_mig_strategy_invalid": "spec.mig.strategy",
        "plugin_device_list_strategy_invalid": "spec.devicePlugin.env (DEVICE_LIST_STRATEGY)",
        "plugin_device_id_strategy_invalid": "spec.devicePlugin.env (DEVICE_ID_STRATEGY)",
        "plugin_mps_invalid": "spec.devicePlugin.config",
        "plugin_config_unknown_key": "spec.devicePlugin.config",
        "plugin_resource_rename_ignored": "spec.devicePlugin.config",
        "plugin_resource_name_invalid": "spec.devicePlugin.config",
        "plugin_config_missing": "spec.devicePlugin.config",
        "plugin_config_invalid": "spec.devicePlugin.config",
        "plugin_config_unreadable": "spec.devicePlugin.config",
        "plugin_dev_root_forced": "spec.devicePlugin.config",
        "plugin_cdi_driver_root_unmounted": "spec.cdi",
        "plugin_version_too_old": "spec.devicePlugin.version",
        "plugin_version_unparseable": "spec.devicePlugin.version",
        "plugin_on_cpu_nodes": "node label nvidia.com/gpu.deploy.device-plugin",
        "plugin_no_node_selector": "node label nvidia.com/gpu.deploy.device-plugin",
        "plugin_managed_by_other_installer": "spec.devicePlugin.enabled",
    },
    "helm": {
        "plugin_no_nvidia_runtime": "runtimeClassName",
        "plugin_mig_privileges_missing": "migStrategy",
        "plugin_mig_strategy_invalid": "migStrategy",
        "plugin_device_list_strategy_invalid": "deviceListStrategy",
        "plugin_device_id_strategy_invalid": "deviceIDStrategy",
        "plugin_mps_invalid": "config.map",
        "plugin_config_unknown_key": "config.map",
        "plugin_resource_rename_ignored": "config.map",
        "plugin_resource_name_invalid": "config.map",
        "plugin_config_missing": "config.name",
        "plugin_config_invalid": "config.map",
        "plugin_config_unreadable": "config.name",
        "plugin_dev_root_forced": "nvidiaDevRoot",
        "plugin_cdi_driver_root_unmounted": "nvidiaDriverRoot",
        "plugin_version_too_old": "image.tag",
        "plugin_version_unparseable": "image.tag",
        "plugin_on_cpu_nodes": "nodeSelector",
        "plugin_no_node_selector": "nodeSelector",
        "plugin_managed_by_other_installer": "devicePlugin.enabled",
    },
}
DEFAULT_FIX_FIELD = {"gpu-operator": "spec.devicePlugin", "helm": "the release's values"}


def fix_location(owner, ident):
    """Where a finding is fixed when another installer owns the object: {installer, object, field}."""
    fields = FIX_FIELDS.get(owner["installer"], {})
    field = fields.get(ident) or DEFAULT_FIX_FIELD.get(owner["installer"]) or "the source it applies from"
    return {"installer": owner["installer"], "object": owner["name"], "field": field}


def _fix_text(fix):
    kind = "value" if fix["installer"] == "helm" else "field" if fix["installer"] == "gpu-operator" else "in"
    reverts = "it reverts changes made to the DaemonSet" if fix["installer"] in ("gpu-operator", "argocd", "flux", "controller") \
        else "a change made to the DaemonSet is lost at its next upgrade"
    return "owned by %s (%s): fix it there, %s %s" % (fix["object"], reverts, kind, fix["field"])


# --------------------------------------------------------------------------------------------------------
# One plugin DaemonSet


def _load_configs(ds, config_maps, obj, findings, release):
    """[(where, config dict)] of the config files the plugin may read; findings for missing or broken ones."""
    configs = []
    for namespace, name, key, path in config_sources(ds):
        data = config_maps.get((namespace, name)) if name else None
        where = "ConfigMap %s/%s" % (namespace, name)
        if isinstance(data, Unreadable):
            findings.append(finding("plugin_config_unreadable", "warning",
                                    hint="%s reads its config file from %s, which this identity may not read: %s"
                                    % (obj, where, data.reason), expected="readable", found=None, subject=obj))
            continue
        keys = ([key] if key is not None else sorted(data or {})) if name else []
        if name is None or data is None or not keys or any(k not in data for k in keys):
            missing = ("%s key %s" % (where, key) if key is not None else "%s (no config in it)" % where) if name else "no ConfigMap"
            findings.append(finding("plugin_config_missing", "error",
                                    hint="%s reads its config file %s from %s, which does not exist: the plugin fails to start"
                                    % (obj, path, missing), expected="ConfigMap key present", found=None, subject=obj))
            continue
        for k in keys:
            label = "%s key %s" % (where, k)
            try:
                # Bounded (size, nesting, aliases expanded: a billion laughs ends here, before any request that changes
                # anything) and one line.  Duplicate keys pass: the plugin's sigs.k8s.io/yaml reads them, the last wins.
                config = _safe_parse.safe_load(data[k], label, duplicate_keys=False)
            except GpuhardenError as error:
                findings.append(finding("plugin_config_invalid", "error", hint="%s: %s. %s" % (
                                        obj, error.msg, _refused_text(release)), expected="YAML mapping", found=None, subject=obj))
                continue
            if config is not None and not isinstance(config, dict):
                findings.append(finding("plugin_config_invalid", "error", hint="%s: %s is not a mapping. %s" % (
                                        obj, label, _refused_text(release)), expected="YAML mapping", found=type(config).__name__,
                                        subject=obj))
                continue
            configs.append((label if key is None else where, config or {}))
    return configs or [("the defaults", {})]


def _refused_text(release):
    return "The plugin %s refuses to start with this (it exits 1): its pods crash-loop and no GPU is advertised" % release


def _flags(config):
    flags = config.get("flags") if isinstance(config.get("flags"), dict) else {}
    plugin = flags.get("plugin") if isinstance(flags.get("plugin"), dict) else {}
    return flags, plugin


def _override(container):
    """The container's override of a setting for _device_plugin_config: ``lookup(flag, envs)`` -> (text, where), the
    argument first, then the first of the environment variables that is set; (None, None) when none is."""
    def lookup(flag, envs):
        for env in envs:
            value, where = _setting(container, flag, env)
            if value is not None:
                return value, where
        return None, None
    return lookup


def _check_configs(obj, configs, version, override, findings):
    """Each config file as the release decodes it: a finding (error) for each thing the plugin refuses at start, and
    one (warning) for each key it ignores.  Returns [(source, decoded config)] for the checks that read settings."""
    release = _config.release_text(version)
    decoded_configs, seen = [], set()
    for source, raw in configs:
        label = "" if source == "the defaults" else source
        decoded = _config.decode(raw, version, label)
        for refusal in decoded.refusals + _config.settings_refusals(decoded.config, version, override, label):
            key = (refusal["ident"], refusal["message"])
            if key in seen:
                continue
            seen.add(key)
            findings.append(finding(refusal["ident"], "error", refusal.get("expected"), refusal["found"],
                                    "%s: %s. %s" % (obj, refusal["message"], _refused_text(release)), subject=obj))
        for entry in decoded.unknown:
            if ("unknown", entry["field"]) in seen:
                continue
            seen.add(("unknown", entry["field"]))
            findings.append(finding("plugin_config_unknown_key", "warning", entry["closest"], entry["field"],
                                    "%s: %s: the plugin %s %s" % (obj, entry["field"], release, _unknown_text(entry)), subject=obj))
        decoded_configs.append((source, decoded.config))
    return decoded_configs


def _unknown_text(entry):
    if entry["since"]:
        return "does not read this key (the plugin reads it from %s on): it is ignored" % _config.release_text(entry["since"])
    if entry["exact"] and entry["closest"] and entry["closest"].lower() == entry["key"].lower():
        return "matches the keys here exactly, case included: %s is ignored, write %s" % (entry["key"], entry["closest"])
    return "ignores this key without a word%s" % (": did you mean %s?" % entry["closest"] if entry["closest"] else "")


def _sys_admin(container):
    security = container.get("securityContext") or {}
    added = (security.get("capabilities") or {}).get("add") or []
    return bool(security.get("privileged")) or any(str(cap).upper() in ("SYS_ADMIN", "CAP_SYS_ADMIN", "ALL") for cap in added)


def _check_resources(obj, configs, expected_resources, findings):
    """resources.gpus / resources.mig renames: the plugin discards them with a warning and keeps its own names
    (DisableResourceNamingInConfig, called from NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin/main.go).  A name
    it refuses when it parses the config is _check_configs' finding; ``configs`` are decoded (valid entries only)."""
    for source, config in configs:
        resources = config.get("resources") or {}
        sharing = config.get("sharing") or {}
        shared = any((sharing.get(kind) or {}).get("renameByDefault") for kind in ("timeSlicing", "mps"))
        gpu_name = "%s/gpu%s" % (RESOURCE_DOMAIN, ".shared" if shared else "")
        for group in ("gpus", "mig"):
            for index, entry in enumerate(resources.get(group) or []):
                name, pattern = entry["name"], entry["pattern"]
                qualified = qualify_resource(name)
                field = "%s resources.%s[%d].name" % (source, group, index)
                if group == "gpus" and qualified not in expected_resources and qualified != gpu_name:
                    advertised = gpu_name
                elif group == "mig" and qualified != qualify_resource("mig-" + pattern):
                    advertised = "%s/mig-<profile> (migStrategy mixed) or %s/gpu (single)" % (RESOURCE_DOMAIN, RESOURCE_DOMAIN)
                else:
                    continue
                findings.append(finding("plugin_resource_rename_ignored", "warning",
                                        hint="%s: %s is %r: ignored by the plugin; it advertises %s (renames in resources.* are "
                                        "discarded with a warning), so pods requesting %s never schedule"
                                        % (obj, field, name, advertised, qualified),
                                        expected=gpu_name if group == "gpus" else "%s/mig-<profile>" % RESOURCE_DOMAIN, found=qualified, subject=obj))


def _loads_nvml_itself(container, parsed, configs, override):
    """True where the plugin reaches NVML without the NVIDIA runtime: a release from 0.16, privileged (the host's
    device nodes), with the driver root mounted at its containerDriverRoot (the library is loaded from there)."""
    if parsed is None or parsed[:3] < _config.V16 or not (container.get("securityContext") or {}).get("privileged"):
        return False
    mounts = {(m.get("mountPath") or "").rstrip("/") for m in container.get("volumeMounts") or []}
    flag, _where = override("container-driver-root", ("CONTAINER_DRIVER_ROOT", "DRIVER_ROOT_CTR_PATH"))
    roots = [flag or _flags(config)[1].get("containerDriverRoot") or CONTAINER_DRIVER_ROOT for _source, config in configs]
    return all(root.rstrip("/") in mounts for root in roots)


def inspect_daemonset(ds, config_maps, nodes, gpu_selector, expected_resources, runtime_class=RUNTIME_CLASS_NAME):
    """Findings about one plugin DaemonSet (its release, config, runtime, MIG access, init containers, placement)."""
    meta = ds.get("metadata") or {}
    obj = "DaemonSet %s/%s" % (meta.get("namespace"), meta.get("name"))
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    container = plugin_container(spec) or {}
    findings = []
    tag = image_tag(container.get("image"))
    parsed = parse_version(tag) if tag else None
    if parsed is None:
        findings.append(finding("plugin_version_unparseable", "error",
                                hint="%s runs image %s, whose tag cannot be checked against the minimum release %s"
                                % (obj, container.get("image"), version_text(MIN_VERSION)),
                                expected=">= v%s" % version_text(MIN_VERSION), found=container.get("image"), subject=obj))
    elif below_minimum(parsed):
        findings.append(finding("plugin_version_too_old", "error",
                                hint="%s runs %s, below the oldest supported release %s" % (obj, tag, version_text(MIN_VERSION)),
                                expected=">= v%s" % version_text(MIN_VERSION), found=tag, subject=obj))
    # The config file(s) as this release decodes them, then the flags and environment variables that override them.
    version = _config.schema_version(parsed)
    override = _override(container)
    configs = _check_configs(obj, _load_configs(ds, config_maps, obj, findings, _config.release_text(version)), version, override,
                             findings)
    mig_strategies, cdi = [], {}
    for source, config in configs:
        strategies, where = _config.effective(config, "flags.plugin.deviceListStrategy", override, version, source)
        for item in strategies or []:
            if str(item).startswith("cdi-") and not any((m.get("mountPath") or "").rstrip("/") == CONTAINER_DRIVER_ROOT
                                                        for m in container.get("volumeMounts") or []):
                cdi.setdefault((where, item), None)
        value, where = _config.effective(config, "flags.migStrategy", override, version, source)
        if value in ("single", "mixed"):
            mig_strategies.append((value, where))
    for where, item in cdi:
        findings.append(finding("plugin_cdi_driver_root_unmounted", "warning",
                                hint="%s: %s is %s, but the driver root is not mounted at %s: the Helm chart always mounts "
                                "it there, as CDI detection needs it" % (obj, where, item, CONTAINER_DRIVER_ROOT),
                                expected={"mountPath": CONTAINER_DRIVER_ROOT}, found=None, subject=obj))
    # MIG: CAP_SYS_ADMIN and the MIG monitor devices, as the Helm chart adds them for any strategy but none
    # (templates/_helpers.tpl requiresCapSysAdmin, addMigMonitorDevices); a privileged container has both.
    if mig_strategies:
        missing = []
        if not _sys_admin(container):
            missing.append("capability SYS_ADMIN")
        if _env(container, "NVIDIA_MIG_MONITOR_DEVICES") != "all" and not (container.get("securityContext") or {}).get("privileged"):
            missing.append("environment variable NVIDIA_MIG_MONITOR_DEVICES=all")
        if missing:
            findings.append(finding("plugin_mig_privileges_missing", "error",
                                    hint="%s runs migStrategy %s (%s) without %s: the plugin cannot read the MIG devices "
                                    "(\"Insufficient Permissions\") and fails on MIG nodes" % (
                                         obj, mig_strategies[0][0], mig_strategies[0][1], " and ".join(missing)),
                                    expected={"capabilities.add": ["SYS_ADMIN"], "env": {"NVIDIA_MIG_MONITOR_DEVICES": "all"}},
                                    found=missing, subject=obj))
    # nvidiaDevRoot forced to / while the driver lives elsewhere: unset, the plugin uses the driver root
    # (NVIDIA/k8s-device-plugin api/config/v1/config.go).
    driver_flag, _where = _setting(container, "nvidia-driver-root", "NVIDIA_DRIVER_ROOT")
    dev_flag, dev_where = _setting(container, "nvidia-dev-root", "NVIDIA_DEV_ROOT")
    forced = {}
    for source, config in configs:
        flags = _flags(config)[0]
        driver_root = driver_flag if driver_flag is not None else flags.get("nvidiaDriverRoot")
        dev_root, where = (dev_flag, dev_where) if dev_flag is not None else (flags.get("nvidiaDevRoot"), "%s flags.nvidiaDevRoot" % source)
        if driver_root not in (None, "", "/") and dev_root == "/":
            forced.setdefault(where, driver_root)
    for where, driver_root in forced.items():
        findings.append(finding("plugin_dev_root_forced", "warning",
                                hint="%s: %s is / while the driver root is %s: the device nodes are looked up on the host's / "
                                "instead of the driver's root; leave nvidiaDevRoot unset (it defaults to the driver root)"
                                % (obj, where, driver_root), expected=None, found="/", subject=obj))
    _check_resources(obj, configs, expected_resources, findings)
    # NVML: the plugin's image has no libnvidia-ml.so.1; the NVIDIA container runtime adds it (and the device nodes),
    # chosen by runtimeClassName or by nvidia being containerd's default runtime (NVIDIA/k8s-device-plugin README
    # "Prerequisites", Helm value runtimeClassName).  NVIDIA_VISIBLE_DEVICES is only a request to that runtime: the
    # image sets it (deployments/container/Dockerfile) and the Helm chart always writes it into the container
    # (templates/daemonset-device-plugin.yml, v0.15-v0.20), whatever the runtime, so it tells nothing.  The one way
    # without the runtime: from 0.16 the plugin loads the library from the driver root mounted at containerDriverRoot
    # (cmd/nvidia-device-plugin/root.go tryResolveLibrary), and a privileged container sees the host's device nodes.
    if not spec.get("runtimeClassName") and not _loads_nvml_itself(container, parsed, configs, override):
        visible = _env(container, "NVIDIA_VISIBLE_DEVICES")
        findings.append(finding("plugin_no_nvidia_runtime", "warning",
                                hint="%s sets no runtimeClassName: the plugin loads NVML (libnvidia-ml.so.1) only on nodes whose "
                                "containerd runs it with the nvidia runtime by default; elsewhere NVML does not load and, with "
                                "failOnInitError true, the plugin crash-loops%s" % (
                                    obj, "" if visible is None else " (its NVIDIA_VISIBLE_DEVICES=%s asks the nvidia runtime for "
                                    "the GPUs, but does nothing under another runtime)" % visible),
                                expected={"runtimeClassName": runtime_class or RUNTIME_CLASS_NAME}, found=None, subject=obj))
    # initContainers gating on nvidia-smi, without a readiness probe to show the plugin's own state.
    gates = [c.get("name") for c in spec.get("initContainers") or [] if "nvidia-smi" in " ".join(_words(c))]
    if gates and not container.get("readinessProbe"):
        findings.append(finding("plugin_init_gate_without_readiness", "warning",
                                hint="%s: initContainer %s waits for nvidia-smi, and the plugin container has no readinessProbe: "
                                "a node whose driver never comes up shows a pod stuck in Init with no signal about the plugin"
                                % (obj, ", ".join(gates)), expected="readinessProbe on %s" % container.get("name"),
                                found={"initContainers": gates, "readinessProbe": None}, subject=obj))
    # Placement: CPU-only nodes.
    landed = set(targets(spec, nodes))
    cpu_nodes = sorted(name for name in landed if not _matches_selector(nodes, name, gpu_selector))
    if not spec.get("nodeSelector") and not ((spec.get("affinity") or {}).get("nodeAffinity")):
        findings.append(finding("plugin_no_node_selector", "warning",
                                hint="%s has no nodeSelector or node affinity: it is scheduled on every node, GPU or not" % obj,
                                expected={"nodeSelector": gpu_selector}, found=None, subject=obj))
    if cpu_nodes:
        fail_hard = True  # the code default in every release; 0.15-0.17 static manifests set FAIL_ON_INIT_ERROR=false
        fail_setting, _where = _setting(container, "fail-on-init-error", "FAIL_ON_INIT_ERROR")
        if fail_setting is None:
            values = [str(_flags(config)[0]["failOnInitError"]) for _source, config in configs if "failOnInitError" in _flags(config)[0]]
            fail_setting = values[0] if values else None
        if fail_setting is not None:
            fail_hard = fail_setting.lower() != "false"
        findings.append(finding("plugin_on_cpu_nodes", "error" if fail_hard else "warning",
                                hint="%s runs on %d node(s) without %s: %s; %s" % (
                                     obj, len(cpu_nodes), ", ".join("%s=%s" % kv for kv in sorted(gpu_selector.items())),
                                     _nodes_text(cpu_nodes),
                                     "failOnInitError is true, so it crash-loops there" if fail_hard
                                     else "it idles there with failOnInitError false"),
                                expected="GPU nodes only", found=cpu_nodes[:SAMPLE], node_count=len(cpu_nodes), subject=obj))
    return findings, sorted(landed)


def _matches_selector(nodes, name, selector):
    for node in nodes:
        meta = node.get("metadata") or {}
        if meta.get("name") == name:
            labels = meta.get("labels") or {}
            return all(labels.get(key) == value for key, value in selector.items())
    return False


# --------------------------------------------------------------------------------------------------------
# Every plugin DaemonSet


OPERATOR_DEPLOY_LABEL = "nvidia.com/gpu.deploy.device-plugin"  # the GPU Operator's per-node gate for its plugin


def _managed_by_other(obj, owner, nodes, ours, ours_live):
    """The finding that another installer serves nodes the managed plugin would serve (or holds its name)."""
    names = sorted(nodes)
    where = ("on %d node(s) the managed plugin %s/%s would serve: %s" % (len(names), ours[0], ours[1], _nodes_text(names))
             if names else "under the managed plugin's name %s/%s" % ours)
    fix = fix_location(owner, "plugin_managed_by_other_installer")
    adopt = " or let gpuharden take the release over (adopt_installers: [helm])" if owner["installer"] in ADOPTABLE_INSTALLERS else ""
    also = (" The DaemonSet gpuharden applied earlier (%s/%s) runs there too: delete one of the two." % ours) if ours_live else ""
    return finding("plugin_managed_by_other_installer", "warning",
                   hint="%s is the device plugin of %s %s. gpuharden does not apply its own plugin (two plugins on one node "
                   "register the same resource with the kubelet and fight over it) and does not change or delete this "
                   "one: fix its findings in %s, disable its plugin there (%s)%s, or narrow the managed plugin's node "
                   "selector.%s" % (obj, owner["name"], where, owner["name"], fix["field"], adopt, also),
                   expected="one installer per node", found=names[:SAMPLE], node_count=len(names),
                   installer=owner["installer"], fix=fix, repair="manual", subject=obj)


def audit(daemonsets, config_maps, nodes, desired_plugin, expected_resources, cluster_policies=(), adopt_installers=()):
    """Findings about every existing plugin DaemonSet and the repair for each.

    ``desired_plugin`` is the rendered DaemonSet: its name is ours (a live one of that name is adopted and
    rewritten, unless another installer owns it), its pod template decides which nodes are ours.  An unowned
    plugin DaemonSet landing only on our nodes is deleted by the repair; one that also serves other nodes is left
    for a person, and said so.  A DaemonSet another installer owns (``installer_of``) is never repaired here: its
    findings carry ``fix`` (where to change it in that installer) and, when it serves our nodes, a
    ``plugin_managed_by_other_installer`` finding tells the caller not to apply the managed objects.  Installers
    listed in ``adopt_installers`` (Helm only) are treated as unowned.
    Returns (findings, repairs, our target nodes).
    """
    ours = (desired_plugin["metadata"]["namespace"], desired_plugin["metadata"]["name"])
    desired_spec = desired_plugin["spec"]["template"]["spec"]
    gpu_selector = desired_spec.get("nodeSelector") or {}
    runtime_class = desired_spec.get("runtimeClassName") or ""
    our_nodes = set(targets(desired_spec, nodes))
    ours_live = any((d.get("metadata") or {}).get("namespace") == ours[0] and _name_of(d) == ours[1]
                    and installer_of(d, cluster_policies) is None for d in daemonsets)
    findings, repairs, operator_reported = [], [], set()
    for ds in sorted(daemonsets, key=lambda d: ((d.get("metadata") or {}).get("namespace"), (d.get("metadata") or {}).get("name"))):
        if not is_plugin_daemonset(ds):
            continue
        meta = ds.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        obj = "DaemonSet %s/%s" % key
        owner = installer_of(ds, cluster_policies)
        adopted = owner if owner is not None and owner["installer"] in adopt_installers else None
        if adopted:
            owner = None
        found, landed = inspect_daemonset(ds, config_maps, nodes, gpu_selector, expected_resources, runtime_class)
        overlap = sorted(our_nodes.intersection(landed))
        if owner is not None:
            for entry in found:
                entry.update(repair="manual", installer=owner["installer"], fix=fix_location(owner, entry["id"]))
                entry["hint"] += "; %s" % _fix_text(entry["fix"])
            if overlap or key == ours:
                found.append(_managed_by_other(obj, owner, overlap, ours, ours_live and key != ours))
                if owner["installer"] == "gpu-operator":
                    operator_reported.add(owner["name"])
            findings.extend(found)
            if found:
                repairs.append({"action": "manual", "object": obj, "namespace": key[0], "name": key[1], "installer": owner["installer"],
                                "reason": "%s owns it: gpuharden neither changes nor deletes it; fix it there" % owner["name"]})
            continue
        adopted_text = (" (managed by %s; taken over as adopt_installers allows)" % adopted["name"]) if adopted else ""
        if key == ours:
            for entry in found:
                entry["repair"] = "replace"
            findings.extend(found)
            if found or adopted:
                repairs.append({"action": "replace", "object": obj, "reason": "it is the DaemonSet this module manages%s: the "
                                "desired one replaces it (%s)" % (adopted_text, ", ".join(sorted({f["id"] for f in found})) or "adopted")})
            continue
        only_theirs = sorted(set(landed) - our_nodes)
        action = "delete" if overlap and not only_theirs else "manual"
        if overlap:
            found.append(finding("plugin_competing", "error",
                                 hint="%s is a second device plugin on %d node(s) the managed plugin %s/%s serves: %s; both register "
                                 "the same resources with the kubelet and the last one wins" % (
                                      obj, len(overlap), ours[0], ours[1], _nodes_text(overlap)),
                                 expected="one plugin per node", found=overlap[:SAMPLE], node_count=len(overlap), subject=obj))
        for entry in found:
            entry["repair"] = action
        findings.extend(found)
        if overlap:
            reason = ("every node it lands on is served by %s/%s%s" % (ours[0], ours[1], adopted_text) if action == "delete" else
                      "it also serves %d node(s) the managed plugin does not select (%s): label them, then delete it"
                      % (len(only_theirs), _nodes_text(only_theirs)))
            repairs.append({"action": action, "object": obj, "namespace": key[0], "name": key[1], "reason": reason})
        elif found:
            repairs.append({"action": "manual", "object": obj, "namespace": key[0], "name": key[1],
                            "reason": "it serves nodes the managed plugin does not select: %s" % (_nodes_text(landed) or "none")})
    # A ClusterPolicy with its device plugin enabled (the default) claims the nodes the operator labelled for it,
    # before (or without) its DaemonSet being there.
    for policy in sorted(cluster_policies, key=lambda p: str(_name_of(p))):
        name = "ClusterPolicy %s" % _name_of(policy)
        if name in operator_reported or ((policy.get("spec") or {}).get("devicePlugin") or {}).get("enabled") is False:
            continue
        claimed = sorted(n["metadata"]["name"] for n in nodes if n["metadata"].get("name") in our_nodes
                         and ((n["metadata"].get("labels") or {}).get(OPERATOR_DEPLOY_LABEL) == "true"))
        if claimed:
            findings.append(_managed_by_other(name, {"installer": "gpu-operator", "name": name}, claimed, ours, ours_live))
    return findings, repairs, sorted(our_nodes)


def foreign_live_objects(decisions, objects, cluster_policies=(), adopt_installers=(), reported=()):
    """Findings for live objects under a managed name (the ConfigMap, the DaemonSets) that another installer owns:
    they are not adopted (the installer would revert it), so nothing is applied."""
    findings = []
    for index, desired in enumerate(objects):
        live = decisions[index].get("live")
        owner = installer_of(live, cluster_policies) if live else None
        obj = "%s %s/%s" % (desired["kind"], desired["metadata"].get("namespace"), desired["metadata"]["name"])
        if owner is None or owner["installer"] in adopt_installers or obj in reported:
            continue
        findings.append(_managed_by_other(obj, owner, [], (desired["metadata"].get("namespace"), desired["metadata"]["name"]), False))
    return findings


def blocking(findings, remove_competing=False):
    """The findings that stop the managed objects from being applied: another installer serves the managed plugin's
    nodes or owns a managed name, or an unowned plugin DaemonSet serves them and is not deleted in this run
    (``remove_competing`` off, or it also serves nodes the managed plugin does not select).  Two plugins on one node
    both register the same resource with the kubelet; whichever registered last is the one it uses."""
    return [f for f in findings if f["id"] == "plugin_managed_by_other_installer"
            or (f["id"] == "plugin_competing" and not (remove_competing and f.get("repair") == "delete"))]


def refusal(blocked):
    """{what, why, fix} of one blocking finding: what the module leaves undone and what lets it go on."""
    subject = blocked["subject"]
    if blocked["id"] == "plugin_competing":
        namespace, _slash, name = subject.split(" ", 1)[1].partition("/")
        delete = "kubectl -n %s delete daemonset %s" % (namespace, name)
        fix = ("let this run delete it: remove_competing: true (role variable device_plugin_remove_competing), or delete it "
               "yourself (%s)" % delete if blocked.get("repair") == "delete" else
               "it also serves nodes the managed plugin does not select, so gpuharden never deletes it: delete it (%s) or keep it "
               "off the managed plugin's nodes (its nodeSelector), or label those nodes for the managed plugin too" % delete)
    else:
        owner = blocked["fix"]
        fix = "disable the plugin of %s (%s)%s, or keep the managed plugin off its nodes (node_selector)" % (
            owner["object"], owner["field"], ", or adopt_installers: [helm] to take it over" if owner["installer"] in ADOPTABLE_INSTALLERS else "")
    return {"what": "apply the managed device plugin next to %s" % subject, "why": blocked["hint"], "fix": fix}


# --------------------------------------------------------------------------------------------------------
# Rollout


def _pod_ready(pod):
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def rollout(ds, pods=None, target_nodes=None):
    """The DaemonSet's rollout state; with its pods and target nodes, the nodes whose pod is not ready."""
    meta, status = ds.get("metadata") or {}, ds.get("status") or {}
    counts = {key: int(status.get(field) or 0) for key, field in (
        ("desired", "desiredNumberScheduled"), ("current", "currentNumberScheduled"), ("updated", "updatedNumberScheduled"),
        ("ready", "numberReady"), ("available", "numberAvailable"), ("misscheduled", "numberMisscheduled"))}
    observed = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0) and "observedGeneration" in status
    done = observed and counts["desired"] == counts["updated"] == counts["ready"] and counts["misscheduled"] == 0
    state = dict(counts, observed=observed, done=done, nodes_not_ready=[], nodes_not_updated=[])
    if pods is not None and target_nodes is not None:
        by_node = {}
        generation = str(meta.get("generation"))
        targets = set(target_nodes)
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            pod_meta = pod.get("metadata") or {}
            # The controller labels each pod with the template generation it was made from
            # (pkg/controller/daemon/util/daemonset_util.go CreatePodTemplate: pod-template-generation).
            template = (pod_meta.get("labels") or {}).get("pod-template-generation")
            if node in targets and template is not None and template != generation:
                state["nodes_not_updated"].append({"node": node, "pod": pod_meta.get("name"),
                                                   "terminating": bool(pod_meta.get("deletionTimestamp"))})
            if node and not pod_meta.get("deletionTimestamp"):
                by_node.setdefault(node, []).append(pod)
        for node in target_nodes:
            candidates = by_node.get(node) or []
            if any(_pod_ready(pod) for pod in candidates):
                continue
            if not candidates:
                state["nodes_not_ready"].append({"node": node, "pod": None, "phase": None, "reason": "no pod"})
                continue
            pod = candidates[0]
            waiting = [((cs.get("state") or {}).get("waiting") or {}).get("reason") for cs in
                       (pod.get("status") or {}).get("containerStatuses") or []]
            reason = next((r for r in waiting if r), None) or (pod.get("status") or {}).get("reason") or "not ready"
            state["nodes_not_ready"].append({"node": node, "pod": pod["metadata"]["name"],
                                             "phase": (pod.get("status") or {}).get("phase"), "reason": reason})
    return state


def rollout_message(obj, state, timeout):
    lines = ["; ".join("%s (%s)" % (entry["node"], "pod %s %s: %s" % (entry["pod"], entry["phase"], entry["reason"])
                                    if entry["pod"] else entry["reason"]) for entry in state["nodes_not_ready"][:SAMPLE])]
    more = len(state["nodes_not_ready"]) - SAMPLE
    message = ("device_plugin: rollout of %s not finished after %d s: desired %d, updated %d, ready %d; not ready on %d node(s): %s%s"
               % (obj, timeout, state["desired"], state["updated"], state["ready"], len(state["nodes_not_ready"]), lines[0],
                  " and %d more" % more if more > 0 else ""))
    outdated = state.get("nodes_not_updated") or []
    if outdated:
        # The rolling update replaces maxUnavailable pods at a time, each once its old pod is gone: a pod its node's
        # kubelet never ends (the kubelet is stopped, the Node NotReady) holds the update there for good.
        terminating = [entry["node"] for entry in outdated if entry["terminating"]]
        message += ("; still the previous template on %d node(s): %s%s" % (
            len(outdated), ", ".join(entry["node"] for entry in outdated[:SAMPLE]),
            " and %d more" % (len(outdated) - SAMPLE) if len(outdated) > SAMPLE else ""))
        if terminating:
            message += ("; the old pod is terminating on %s: the update waits until that node's kubelet ends it (is the "
                        "node NotReady? repair or remove it, then run again)" % ", ".join(terminating[:SAMPLE]))
    return message
