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
  misconfigurations (resource-name typos, ``deviceListStrategy: none``, releases below 0.15, competing
  DaemonSets on the same nodes, an initContainer gating on ``nvidia-smi`` without a readiness probe, plugins
  that land on CPU-only nodes) with a repair for each.
- ``rollout`` judges a DaemonSet's status and names the nodes whose pod is not ready.
"""

from __future__ import annotations

import hashlib
import json
import re

from ansible_collections.gpuharden.k8s.plugins.module_utils import _node_labels
from ansible_collections.gpuharden.k8s.plugins.module_utils._errors import GpuhardenError

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
NEWEST_KNOWN = (0, 20, 0)
MIG_STRATEGIES = ("none", "single", "mixed")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")
ALLOCATION_POLICIES = ("distributed", "packed")
RESOURCE_DOMAIN = "nvidia.com"
PLUGIN_CONTAINER = "nvidia-device-plugin-ctr"
GFD_NAME = "gpu-feature-discovery"
CONFIG_DIR = "/etc/nvidia-device-plugin"
CONFIG_KEY = "config.yaml"
CHECKSUM_ANNOTATION = "gpuharden.io/config-sha256"
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


def _time_slicing(value):
    if not value:
        return None
    if not isinstance(value, dict):
        raise GpuhardenError("device_plugin: option time_slicing must be a mapping, not %s" % type(value).__name__)
    replicas = value.get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 2:
        raise GpuhardenError("device_plugin: option time_slicing.replicas=%r must be an integer of at least 2" % (replicas,))
    resources = value.get("resources") or ["nvidia.com/gpu"]
    for name in resources:
        if not isinstance(name, str) or not qualify_resource(name).startswith(RESOURCE_DOMAIN + "/"):
            raise GpuhardenError("device_plugin: option time_slicing.resources: %r is not an nvidia.com/ resource" % (name,))
    return {
        "renameByDefault": bool(value.get("rename_by_default", False)),
        "failRequestsGreaterThanOne": bool(value.get("fail_requests_greater_than_one", False)),
        "resources": [{"name": qualify_resource(name), "replicas": replicas} for name in resources],
    }


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
    dev_root = params.get("nvidia_dev_root")
    if dev_root is not None:
        if not feat["nvidia_dev_root"]:
            raise GpuhardenError("device_plugin: option nvidia_dev_root=%r needs release 0.16.0 or newer; version is %s"
                                 % (dev_root, version))
        dev_root = _abs_path(params, "nvidia_dev_root")
    discovery = params.get("device_discovery_strategy")
    if discovery is not None:
        if not feat["device_discovery_strategy"]:
            raise GpuhardenError("device_plugin: option device_discovery_strategy=%r needs release 0.16.0 or newer; version is %s"
                                 % (discovery, version))
        _choice(params, "device_discovery_strategy", DISCOVERY_STRATEGIES)
    policy = params.get("shared_devices_allocation_policy")
    if policy is not None:
        if not feat["shared_devices_allocation_policy"]:
            raise GpuhardenError("device_plugin: option shared_devices_allocation_policy=%r needs release 0.20.0 or newer; "
                                 "version is %s" % (policy, version))
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
        "gpu_feature_discovery": bool(params.get("gpu_feature_discovery")), "warnings": warnings,
    }


def plugin_config(settings):
    """The plugin's config file (api/config/v1) for the release, as a dict."""
    feat = settings["features"]
    strategies = settings["device_list_strategy"]
    plugin = {
        "passDeviceSpecs": settings["pass_device_specs"],
        "deviceListStrategy": strategies[0] if len(strategies) == 1 else list(strategies),
        "deviceIDStrategy": settings["device_id_strategy"],
    }
    if settings["nvidia_driver_root"] != "/":
        plugin["containerDriverRoot"] = "/driver-root"
    if settings["shared_devices_allocation_policy"] and feat["shared_devices_allocation_policy"]:
        plugin["sharedDevicesAllocationPolicy"] = settings["shared_devices_allocation_policy"]
    flags = {
        "migStrategy": settings["mig_strategy"],
        "failOnInitError": settings["fail_on_init_error"],
        "nvidiaDriverRoot": settings["nvidia_driver_root"],
    }
    if feat["nvidia_dev_root"]:
        flags["nvidiaDevRoot"] = settings["nvidia_dev_root"] or "/"
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
{% if driver_root != "/" %}
            - name: driver-root
              mountPath: /driver-root
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
{% if driver_root != "/" %}
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
    return yaml.safe_load(text)


def desired_objects(settings):
    """[ConfigMap, plugin DaemonSet, (gpu-feature-discovery DaemonSet)] as dicts, rendered from the templates."""
    config = plugin_config(settings)
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
        "sys_admin": "volume-mounts" in settings["device_list_strategy"] and settings["features"]["volume_mounts_needs_sys_admin"],
        "driver_root": settings["nvidia_driver_root"],
        "cdi": any(s.startswith("cdi-") for s in settings["device_list_strategy"]),
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


def plugin_container(pod_spec):
    """The device plugin container of a pod spec (not gpu-feature-discovery, not the config manager), or None."""
    for container in pod_spec.get("containers") or []:
        words = " ".join(_words(container))
        if "gpu-feature-discovery" in words or "config-manager" in words:
            continue
        if "k8s-device-plugin" in (container.get("image") or ""):
            return container
    return None


def is_plugin_daemonset(ds):
    template = (ds.get("spec") or {}).get("template") or {}
    return plugin_container(template.get("spec") or {}) is not None


def _setting(container, flag, env):
    words, value = _words(container), None
    for index, word in enumerate(words):
        if word.startswith("--%s=" % flag):
            value = word.split("=", 1)[1]
        elif word == "--%s" % flag and index + 1 < len(words):
            value = words[index + 1]
    if value is not None:
        return value, "argument --%s" % flag
    for item in container.get("env") or []:
        if item.get("name") == env and "value" in item:
            return str(item["value"]), "environment variable %s" % env
    return None, None


def config_reference(ds):
    """(namespace, ConfigMap name, key, path) of the config file the plugin reads, or None."""
    meta = ds.get("metadata") or {}
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    container = plugin_container(spec) or {}
    path, _where = _setting(container, "config-file", "CONFIG_FILE")
    if not path:
        return None
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        mount_path = (mount.get("mountPath") or "").rstrip("/")
        config_map = (volumes.get(mount.get("name")) or {}).get("configMap")
        if not config_map:
            continue
        if mount.get("subPath"):
            if path != mount_path:
                continue
            key_path = mount["subPath"]
        elif path.startswith(mount_path + "/"):
            key_path = path[len(mount_path) + 1:]
        else:
            continue
        key = key_path
        for item in config_map.get("items") or []:
            if item.get("path") == key_path:
                key = item.get("key")
        return meta.get("namespace"), config_map.get("name"), key, path
    return meta.get("namespace"), None, None, path


def referenced_config_maps(daemonsets):
    """(namespace, name) of every ConfigMap a plugin DaemonSet reads its config file from."""
    refs = set()
    for ds in daemonsets:
        if is_plugin_daemonset(ds):
            ref = config_reference(ds)
            if ref and ref[1]:
                refs.add((ref[0], ref[1]))
    return sorted(refs)


class Unreadable:
    """A referenced ConfigMap the identity may not read (403): reported, never fatal."""

    def __init__(self, reason):
        self.reason = reason


def _finding(ident, severity, obj, message, expected=None, actual=None, **extra):
    entry = {"id": ident, "severity": severity, "object": obj, "message": message, "expected": expected, "actual": actual}
    entry.update(extra)
    return entry


def _nodes_text(names):
    shown = ", ".join(names[:SAMPLE])
    return shown + (" and %d more" % (len(names) - SAMPLE) if len(names) > SAMPLE else "")


def inspect_daemonset(ds, config_maps, nodes, gpu_selector, expected_resources):
    """Findings about one plugin DaemonSet (its release, config, init containers, placement)."""
    meta = ds.get("metadata") or {}
    obj = "DaemonSet %s/%s" % (meta.get("namespace"), meta.get("name"))
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    container = plugin_container(spec) or {}
    findings = []
    tag = image_tag(container.get("image"))
    parsed = parse_version(tag) if tag else None
    if parsed is None:
        findings.append(_finding("plugin_version_unparseable", "error", obj,
                                 "%s runs image %s, whose tag cannot be checked against the minimum release %s"
                                 % (obj, container.get("image"), version_text(MIN_VERSION)),
                                 expected=">= v%s" % version_text(MIN_VERSION), actual=container.get("image")))
    elif below_minimum(parsed):
        findings.append(_finding("plugin_version_too_old", "error", obj,
                                 "%s runs %s, below the oldest supported release %s" % (obj, tag, version_text(MIN_VERSION)),
                                 expected=">= v%s" % version_text(MIN_VERSION), actual=tag))
    # The config file, then the flags and environment variables that override it.
    config, ref = {}, config_reference(ds)
    if ref:
        namespace, name, key, path = ref
        data = config_maps.get((namespace, name)) if name else None
        if isinstance(data, Unreadable):
            findings.append(_finding("plugin_config_unreadable", "warning", obj,
                                     "%s reads its config file from ConfigMap %s/%s, which this identity may not read: %s"
                                     % (obj, namespace, name, data.reason), expected="readable", actual=None))
        elif name is None or data is None or key not in data:
            findings.append(_finding("plugin_config_missing", "error", obj,
                                     "%s reads its config file %s from %s, which does not exist: the plugin fails to start"
                                     % (obj, path, "ConfigMap %s/%s key %s" % (namespace, name, key) if name else "no ConfigMap"),
                                     expected="ConfigMap key present", actual=None))
        else:
            try:
                config = yaml.safe_load(data[key]) if HAS_YAML else json.loads(data[key])
            except Exception as error:  # yaml.YAMLError and friends: the user's file
                config = None
                findings.append(_finding("plugin_config_invalid", "error", obj, "%s: ConfigMap %s/%s key %s is not YAML: %s"
                                         % (obj, namespace, name, key, error), expected="YAML mapping", actual=None))
            if config is not None and not isinstance(config, dict):
                findings.append(_finding("plugin_config_invalid", "error", obj, "%s: ConfigMap %s/%s key %s is not a mapping"
                                         % (obj, namespace, name, key), expected="YAML mapping", actual=type(config).__name__))
                config = {}
            config = config or {}
    source = "ConfigMap %s/%s" % (ref[0], ref[1]) if ref and ref[1] else "the defaults"
    flags = config.get("flags") if isinstance(config.get("flags"), dict) else {}
    plugin = flags.get("plugin") if isinstance(flags.get("plugin"), dict) else {}
    list_strategy, where = _setting(container, "device-list-strategy", "DEVICE_LIST_STRATEGY")
    if list_strategy is None and "deviceListStrategy" in plugin:
        list_strategy, where = plugin["deviceListStrategy"], "%s flags.plugin.deviceListStrategy" % source
    for value in (list_strategy if isinstance(list_strategy, list) else str(list_strategy).split(",")) if list_strategy is not None else []:
        if value not in DEVICE_LIST_STRATEGIES:
            findings.append(_finding("plugin_device_list_strategy_invalid", "error", obj,
                                     "%s: %s is %r, not a device list strategy (%s): the plugin refuses to start and no GPU "
                                     "is advertised" % (obj, where, value, ", ".join(DEVICE_LIST_STRATEGIES)),
                                     expected=list(DEVICE_LIST_STRATEGIES), actual=value))
    mig, where = _setting(container, "mig-strategy", "MIG_STRATEGY")
    if mig is None and "migStrategy" in flags:
        mig, where = flags["migStrategy"], "%s flags.migStrategy" % source
    if mig is not None and mig not in MIG_STRATEGIES:
        findings.append(_finding("plugin_mig_strategy_invalid", "error", obj, "%s: %s is %r, not one of %s"
                                 % (obj, where, mig, ", ".join(MIG_STRATEGIES)), expected=list(MIG_STRATEGIES), actual=mig))
    resources = config.get("resources") if isinstance(config.get("resources"), dict) else {}
    for group, allowed in (("gpus", expected_resources), ("mig", None)):
        for index, entry in enumerate(resources.get(group) or []):
            name = str((entry or {}).get("name", "")) if isinstance(entry, dict) else ""
            qualified = qualify_resource(name) if name else ""
            domain = qualified.split("/", 1)[0]
            field = "%s resources.%s[%d].name" % (source, group, index)
            if domain != RESOURCE_DOMAIN:
                findings.append(_finding("plugin_resource_name_invalid", "error", obj,
                                         "%s: %s is %r; the plugin only advertises %s/ resources and refuses this config"
                                         % (obj, field, name, RESOURCE_DOMAIN), expected="%s/<name>" % RESOURCE_DOMAIN, actual=name))
            elif group == "gpus" and qualified not in allowed:
                findings.append(_finding("plugin_resource_name_typo", "error", obj,
                                         "%s: %s is %r, so the plugin advertises %s instead of %s: pods requesting %s never "
                                         "schedule on its nodes" % (obj, field, name, qualified, " or ".join(allowed), allowed[0]),
                                         expected=list(allowed), actual=qualified))
            elif group == "mig" and not qualified.startswith(RESOURCE_DOMAIN + "/mig-"):
                findings.append(_finding("plugin_resource_name_typo", "warning", obj,
                                         "%s: %s is %r, advertised as %s rather than an nvidia.com/mig-<profile> resource"
                                         % (obj, field, name, qualified), expected="nvidia.com/mig-<profile>", actual=qualified))
    # initContainers gating on nvidia-smi, without a readiness probe to show the plugin's own state.
    gates = [c.get("name") for c in spec.get("initContainers") or [] if "nvidia-smi" in " ".join(_words(c))]
    if gates and not container.get("readinessProbe"):
        findings.append(_finding("plugin_init_gate_without_readiness", "warning", obj,
                                 "%s: initContainer %s waits for nvidia-smi, and the plugin container has no readinessProbe: "
                                 "a node whose driver never comes up shows a pod stuck in Init with no signal about the plugin"
                                 % (obj, ", ".join(gates)), expected="readinessProbe on %s" % container.get("name"),
                                 actual={"initContainers": gates, "readinessProbe": None}))
    # Placement: CPU-only nodes.
    landed = set(targets(spec, nodes))
    cpu_nodes = sorted(name for name in landed if not _matches_selector(nodes, name, gpu_selector))
    if not spec.get("nodeSelector") and not ((spec.get("affinity") or {}).get("nodeAffinity")):
        findings.append(_finding("plugin_no_node_selector", "warning", obj,
                                 "%s has no nodeSelector or node affinity: it is scheduled on every node, GPU or not" % obj,
                                 expected={"nodeSelector": gpu_selector}, actual=None))
    if cpu_nodes:
        fail_hard = True  # the code default in every release; 0.15-0.17 static manifests set FAIL_ON_INIT_ERROR=false
        fail_setting, _where = _setting(container, "fail-on-init-error", "FAIL_ON_INIT_ERROR")
        if fail_setting is None and "failOnInitError" in flags:
            fail_setting = str(flags["failOnInitError"])
        if fail_setting is not None:
            fail_hard = fail_setting.lower() != "false"
        findings.append(_finding("plugin_on_cpu_nodes", "error" if fail_hard else "warning", obj,
                                 "%s runs on %d node(s) without %s: %s; %s" % (
                                     obj, len(cpu_nodes), ", ".join("%s=%s" % kv for kv in sorted(gpu_selector.items())),
                                     _nodes_text(cpu_nodes),
                                     "failOnInitError is true, so it crash-loops there" if fail_hard
                                     else "it idles there with failOnInitError false"),
                                 expected="GPU nodes only", actual=cpu_nodes[:SAMPLE], node_count=len(cpu_nodes)))
    return findings, sorted(landed)


def _matches_selector(nodes, name, selector):
    for node in nodes:
        meta = node.get("metadata") or {}
        if meta.get("name") == name:
            labels = meta.get("labels") or {}
            return all(labels.get(key) == value for key, value in selector.items())
    return False


def audit(daemonsets, config_maps, nodes, desired_plugin, expected_resources):
    """Findings about every existing plugin DaemonSet and the repair for each.

    ``desired_plugin`` is the rendered DaemonSet: its name is ours (a live one of that name is adopted and
    rewritten), its pod template decides which nodes are ours.  A plugin DaemonSet landing only on our nodes is
    deleted by the repair; one that also serves other nodes is left for a person, and said so.
    Returns (findings, repairs, our target nodes).
    """
    ours = (desired_plugin["metadata"]["namespace"], desired_plugin["metadata"]["name"])
    desired_spec = desired_plugin["spec"]["template"]["spec"]
    gpu_selector = desired_spec.get("nodeSelector") or {}
    our_nodes = set(targets(desired_spec, nodes))
    findings, repairs = [], []
    for ds in sorted(daemonsets, key=lambda d: ((d.get("metadata") or {}).get("namespace"), (d.get("metadata") or {}).get("name"))):
        if not is_plugin_daemonset(ds):
            continue
        meta = ds.get("metadata") or {}
        key = (meta.get("namespace"), meta.get("name"))
        obj = "DaemonSet %s/%s" % key
        found, landed = inspect_daemonset(ds, config_maps, nodes, gpu_selector, expected_resources)
        if key == ours:
            for entry in found:
                entry["repair"] = "replace"
            findings.extend(found)
            if found:
                repairs.append({"action": "replace", "object": obj, "reason": "it is the DaemonSet this module manages: the "
                                "desired one replaces it (%s)" % ", ".join(sorted({f["id"] for f in found}))})
            continue
        overlap = sorted(our_nodes.intersection(landed))
        only_theirs = sorted(set(landed) - our_nodes)
        action = "delete" if overlap and not only_theirs else "manual"
        if overlap:
            found.append(_finding("plugin_competing", "error", obj,
                                  "%s is a second device plugin on %d node(s) the managed plugin %s/%s serves: %s; both register "
                                  "the same resources with the kubelet and the last one wins" % (
                                      obj, len(overlap), ours[0], ours[1], _nodes_text(overlap)),
                                  expected="one plugin per node", actual=overlap[:SAMPLE], node_count=len(overlap)))
        for entry in found:
            entry["repair"] = action
        findings.extend(found)
        if overlap:
            reason = ("every node it lands on is served by %s/%s" % ours if action == "delete" else
                      "it also serves %d node(s) the managed plugin does not select (%s): label them, then delete it"
                      % (len(only_theirs), _nodes_text(only_theirs)))
            repairs.append({"action": action, "object": obj, "namespace": key[0], "name": key[1], "reason": reason})
        elif found:
            repairs.append({"action": "manual", "object": obj, "namespace": key[0], "name": key[1],
                            "reason": "it serves nodes the managed plugin does not select: %s" % (_nodes_text(landed) or "none")})
    return findings, repairs, sorted(our_nodes)


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
    state = dict(counts, observed=observed, done=done, nodes_not_ready=[])
    if pods is not None and target_nodes is not None:
        by_node = {}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not (pod.get("metadata") or {}).get("deletionTimestamp"):
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
    return ("device_plugin: rollout of %s not finished after %d s: desired %d, updated %d, ready %d; not ready on %d node(s): %s%s"
            % (obj, timeout, state["desired"], state["updated"], state["ready"], len(state["nodes_not_ready"]), lines[0],
               " and %d more" % more if more > 0 else ""))
