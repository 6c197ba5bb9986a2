# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Where the kubelet really reads its settings, and the plan that makes them what we want.

The kubelet's effective configuration is: defaults < ``--config`` file < ``--config-dir`` drop-ins
(``*.conf``, lexical order, JSON merge patch) < command-line flags.  The flags come from the service
unit (ExecStart after systemd's ``$VAR`` expansion, Environment=, EnvironmentFile=, where an
EnvironmentFile beats Environment=), or, on k3s/rke2, from the ``kubelet-arg`` lists of the
distribution's config files.  ``discover`` reads all of that (read-only, each file once);
``plan`` returns the file changes that make every managed field effective, fixing flags where
they live instead of writing file values a flag would silently override, and verifies the result
by discovering again over the planned files.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import struct
import subprocess
from fractions import Fraction

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _host, _safe_parse
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._defaults import ENFORCE_NODE_ALLOCATABLE
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._host import host_path

try:
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    HAS_RUAMEL = True
    RUAMEL_IMPORT_ERROR = None
except ImportError as _error:  # pragma: no cover - the module reports missing_required_lib
    HAS_RUAMEL = False
    RUAMEL_IMPORT_ERROR = _error
    CommentedMap = dict

API_VERSION = "kubelet.config.k8s.io/v1beta1"
KIND = "KubeletConfiguration"
FLAVORS = ("kubeadm", "k3s", "rke2")
SERVICES = {"kubeadm": ("kubelet",), "k3s": ("k3s-agent", "k3s"), "rke2": ("rke2-agent", "rke2-server")}
UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
             "/lib/systemd/system", "/usr/lib/systemd/system")
RANCHER = {
    "k3s": {"config": "/etc/rancher/k3s/config.yaml", "config_env": "K3S_CONFIG_FILE",
            "config_dir": "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"},
    "rke2": {"config": "/etc/rancher/rke2/config.yaml", "config_env": "RKE2_CONFIG_FILE",
             "config_dir": "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d"},
}
DEFAULT_ROOT_DIR = "/var/lib/kubelet"
CPU_STATE = "cpu_manager_state"
MEMORY_STATE = "memory_manager_state"

TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_SCOPES = ("container", "pod")
# The topologyManagerPolicyOptions the kubelet v1.36.3 knows (pkg/kubelet/cm/topologymanager/policy_options.go): both
# are stable there, so no TopologyManagerPolicyAlphaOptions/BetaOptions gate applies (its alpha and beta sets are
# empty).  max-allowable-numa-nodes came as beta in v1.31 (KEP-4622): an older kubelet refuses it as unknown.
TOPOLOGY_OPTIONS = ("prefer-closest-numa-nodes", "max-allowable-numa-nodes")
# defaultMaxAllowableNUMANodes (topology_manager.go): the limit without the option, and the least value it accepts.
DEFAULT_MAX_NUMA_NODES = 8
# Go's strconv.ParseBool, which reads prefer-closest-numa-nodes; the value is written in its canonical form.
GO_BOOLS = {"1": "true", "t": "true", "T": "true", "TRUE": "true", "true": "true", "True": "true",
            "0": "false", "f": "false", "F": "false", "FALSE": "false", "false": "false", "False": "false"}
# Go's strconv.Atoi, which reads max-allowable-numa-nodes: an optional sign and ASCII digits, within int64.
GO_INT_RE = re.compile(r"^[+-]?[0-9]+$")
# Where a Topology Manager policy would meet more NUMA nodes than the kubelet allows: raise max-allowable-numa-nodes to
# the node's count, or keep the node's policy (both reported).
NUMA_OVER_LIMIT = ("raise", "keep_policy")
# Where cadvisor (v0.56.2, the kubelet v1.36.3's) reads the NUMA topology: utils/sysfs/sysfs.go nodeDir, cpusPath.
NUMA_NODE_DIR = "/sys/devices/system/node"
CPU_DIR = "/sys/devices/system/cpu"
NUMA_NODE_NAME_RE = re.compile(r"^node([0-9]+)$")
CPU_NAME_RE = re.compile(r"^cpu[0-9]+$")
# The Topology Manager's NUMA masks are 64 bits (pkg/kubelet/cm/topologymanager/bitmask/bitmask.go: "bit number must be
# in range 0-63").
NUMA_MASK_BITS = 64
OPTIONS_FIELD = "topologyManagerPolicyOptions"
CPU_POLICIES = ("none", "static")
MEMORY_POLICIES = ("None", "Static")
ENFORCE_VALUES = ENFORCE_NODE_ALLOCATABLE
DEFAULTS = {"cpuManagerPolicy": "none", "memoryManagerPolicy": "None", "topologyManagerPolicy": "none",
            "topologyManagerScope": "container"}

# kubelet flags that take no value (pflag bools); every other flag takes one.
BOOL_FLAGS = frozenset((
    "help", "h", "version", "fail-swap-on", "register-node", "register-schedulable", "exit-on-lock-contention",
    "enable-server", "enable-debugging-handlers", "enable-load-reader", "cgroups-per-qos", "protect-kernel-defaults",
    "rotate-certificates", "rotate-server-certificates", "serialize-image-pulls", "make-iptables-util-chains",
    "fail-cgroupv1", "keep-terminated-pod-volumes", "seccomp-default", "alsologtostderr", "logtostderr",
    "one-output", "skip-headers", "skip-log-headers", "local-storage-capacity-isolation",
    "enable-controller-attach-detach", "reregister-node",
))
# KubeletConfiguration fields whose flag is not the kebab-case of the field name
# (kubernetes/kubernetes cmd/kubelet/app/options/options.go, AddKubeletConfigFlags).
FIELD_FLAGS = {
    "contentType": "kube-api-content-type",
    "registryPullQPS": "registry-qps",
    "eventRecordQPS": "event-qps",
    "makeIPTablesUtilChains": "make-iptables-util-chains",
    "serverTLSBootstrap": "rotate-server-certificates",
    "enableContentionProfiling": "contention-profiling",
    "imageMinimumGCAge": "minimum-image-ttl-duration",
    "resolverConfig": "resolv-conf",
    "staticPodURLHeader": "manifest-url-header",
    "reservedSystemCPUs": "reserved-cpus",
    "staticPodPath": "pod-manifest-path",
    "staticPodURL": "manifest-url",
    "podPidsLimit": "pod-max-pids",
    "imageGCHighThresholdPercent": "image-gc-high-threshold",
    "imageGCLowThresholdPercent": "image-gc-low-threshold",
    "kubeAPIQPS": "kube-api-qps",
    "kubeAPIBurst": "kube-api-burst",
    "cgroupsPerQOS": "cgroups-per-qos",
    "clusterDNS": "cluster-dns",
    "tlsCipherSuites": "tls-cipher-suites",
    "tlsMinVersion": "tls-min-version",
}
# Map-valued flags that the kubelet merges key by key over the file (all others replace the value).
MERGED_MAP_FIELDS = ("featureGates",)
# Map-valued flags (cliflag.MapStringString and friends in options.go): the first occurrence replaces the file's
# map, later occurrences add to it.  ``--eviction-hard``/``--eviction-soft`` write ``signal<quantity``
# (cliflag.NewLangleSeparatedMapStringString); the policy-option maps take one ``key=value`` per occurrence and do
# not split on commas (cliflag.NewMapStringStringNoSplit).
MAP_FLAG_FIELDS = ("featureGates", "kubeReserved", "systemReserved", "evictionHard", "evictionSoft",
                   "evictionSoftGracePeriod", "evictionMinimumReclaim", "qosReserved", "cpuManagerPolicyOptions",
                   "topologyManagerPolicyOptions")
LANGLE_MAP_FIELDS = ("evictionHard", "evictionSoft")
NOSPLIT_MAP_FIELDS = ("cpuManagerPolicyOptions", "topologyManagerPolicyOptions")
# Fields the kubelet reads only from a configuration file: no command-line flag sets them.
FLAGLESS_FIELDS = ("memoryThrottlingFactor", "memoryReservationPolicy", "shutdownGracePeriod",
                   "shutdownGracePeriodCriticalPods", "shutdownGracePeriodByPodPriority", "memorySwap")
# What kubeadm owns on a node (kubernetes v1.36.3, cmd/kubeadm/app): `kubeadm upgrade node` (its kubelet-config phase,
# cmd/phases/upgrade/kubeletconfig.go -> phases/upgrade/postupgrade.go WriteKubeletConfigFiles -> phases/kubelet/
# config.go WriteConfigToDisk) rewrites config.yaml whole, from the kube-system/kubelet-config ConfigMap, its --patches
# and instance-config.yaml (a patch holding containerRuntimeEndpoint, written once when missing).  kubeadm-flags.env is
# written by `kubeadm init`/`join` (phases/kubelet/flags.go WriteKubeletDynamicEnvFile); an upgrade rewrites it only
# from its own content (postupgrade.go: moving --container-runtime-endpoint into instance-config.yaml, and
# RemoveKubeletArgsFromFile with the flags a release retires, none in v1.36), so a flag removed there stays removed
# ("kubeadm-flags.env ... isn't modified during upgrades", util/config/cluster.go GetNodeRegistration).  kubeadm never
# reads or writes a --config-dir drop-in directory nor /etc/default/kubelet or /etc/sysconfig/kubelet (its systemd
# drop-in only names them, for KUBELET_EXTRA_ARGS).
KUBEADM_CONFIG = "/var/lib/kubelet/config.yaml"
KUBEADM_FLAGS_ENV = "/var/lib/kubelet/kubeadm-flags.env"
# The durable route on a kubeadm node without --config-dir: this directory, enabled by --config-dir in the variable
# kubeadm's systemd drop-in leaves to the admin (KUBELET_EXTRA_ARGS, from /etc/default/kubelet on deb or
# /etc/sysconfig/kubelet on rpm).  The directory is the one the kubelet's documentation uses (KEP-3983).
KUBEADM_CONFIG_DIR = "/etc/kubernetes/kubelet.conf.d"
KUBEADM_EXTRA_ARGS = "KUBELET_EXTRA_ARGS"
# k3s (and rke2, which embeds the same agent) read kubelet drop-ins correctly only from v1.32 on: the kubelet
# merged drop-ins through its internal types before kubernetes/kubernetes#127421 (k3s-io/docs#433, k3s-io/k3s#2116).
RANCHER_DROPIN_SINCE = (1, 32)
# The same rule for a kubeadm node's own kubelet: --config-dir exists from v1.28 (alpha, behind an environment
# variable) and v1.30 (beta), but gpuharden adds it only from v1.32, where drop-ins merge as versioned JSON (#127421).
CONFIG_DIR_SINCE = RANCHER_DROPIN_SINCE
# kubelet flags k3s/rke2 pass themselves before the kubelet-arg entries (a kubelet-arg of the same name replaces
# them): k3s-io/k3s pkg/daemons/agent/agent_linux.go.  Only those that matter to a check here.
RANCHER_BUILTIN_FLAGS = ("--eviction-hard=imagefs.available<5%,nodefs.available<5%",)
# kubelet default for evictionHard memory.available (kubernetes/kubernetes pkg/kubelet/eviction/defaults_linux.go,
# applied in cmd/kubelet/app/server.go loadConfigFile when the file sets no evictionHard).
DEFAULT_EVICTION_MEMORY = "100Mi"
VERSION_RE = re.compile(r"(?:\b(k3s|rke2) version|Kubernetes) v(\d+)\.(\d+)\.(\d+)\S*")
QUANTITY_PARTS_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m))?$")
QUANTITY_SUFFIX = {None: 1, "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15, "E": 10 ** 18,
                   "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
                   "m": Fraction(1, 1000)}
DROPIN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\.conf$")
FIELD_RE = re.compile(r"^[a-z][A-Za-z0-9]*$")
CPULIST_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?([eE][0-9]+|[KMGTPE]i?|m|k)?$")


def flag_for_field(field):
    if field in FIELD_FLAGS:
        return FIELD_FLAGS[field]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", field).lower()


def _plain(value):
    """ruamel's round-trip types as plain Python values (for comparison and return values)."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def _show(value):
    return json.dumps(_plain(value), sort_keys=True)


def _same(left, right):
    left, right = _plain(left), _plain(right)
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right
    return left == right


# --------------------------------------------------------------------------------------------
# reading the node


class NodeReader:
    """Read-only access to the node's files below ``root``, each file read once.

    Every path the planner follows, also those found in the unit (--config, EnvironmentFile=, --config-dir), is
    resolved inside ``root`` as the node sees it (``_files.resolve_in_root``: absolute and relative links and ``..``
    never leave the root), and only regular files are read (a FIFO, device or directory is a one-line refusal).
    """

    def __init__(self, root="/", overlay=None):
        self.root = root
        self._cache = {}
        self.overlay = overlay or {}

    def path(self, node_path):
        return host_path(self.root, node_path)

    def resolved(self, node_path):
        """Where ``node_path`` really is on this machine, every link resolved inside the root."""
        return _files.host_path_in_root(self.root, self.path(node_path))

    def read(self, node_path):
        if node_path in self.overlay:
            return self.overlay[node_path]
        if node_path not in self._cache:
            self._cache[node_path] = _files.read_text(self.path(node_path), root=self.root)
        return self._cache[node_path]

    def isdir(self, node_path):
        return os.path.isdir(self.resolved(node_path))

    def files_below(self, node_path):
        """Relative paths of the entries below a directory that are not directories (recursively, links to
        directories included: reading one is refused), sorted; overlay included.

        As the kubelet v1.36.3 walks --config-dir (cmd/kubelet/app/server.go mergeKubeletConfigurations,
        filepath.WalkDir): subdirectories are descended, not followed through links; every other entry is a file to
        the caller, so a FIFO or a link to a directory named ``*.conf`` reaches ``read`` and is refused there, where
        the kubelet would hang or fail on it."""
        found = set()
        top = self.resolved(node_path)
        for dirpath, dirs, names in os.walk(top):
            linked = [name for name in dirs if os.path.islink(os.path.join(dirpath, name))]
            for name in names + linked:
                found.add(os.path.relpath(os.path.join(dirpath, name), top))
        prefix = node_path.rstrip("/") + "/"
        for path, text in self.overlay.items():
            if path.startswith(prefix):
                if text is None:
                    found.discard(path[len(prefix):])
                else:
                    found.add(path[len(prefix):])
        return sorted(found)

    def read_present(self, node_path):
        """``read``, except that an entry that is there but names no file inside the root (a dangling link, or one that
        leaves the root) is a refusal naming it instead of "missing"."""
        text = self.read(node_path)
        if text is None and node_path not in self.overlay and os.path.lexists(self.path(node_path)):
            raise GpuhardenError("%s: a link to %s, which is no file inside the node root: refusing to read it"
                                 % (self.path(node_path), os.readlink(self.path(node_path))),
                                 fix="replace the link with the file it should be")
        return text

    def dropin_dir_entries(self, node_path):
        """Names in a unit's drop-in directory; a non-directory where the directory should be is refused."""
        here = self.resolved(node_path)
        if os.path.lexists(here) and not os.path.isdir(here):
            raise GpuhardenError("%s: is not a directory, so systemd reads no drop-in from it" % self.path(node_path),
                                 fix="remove it or make it the drop-in directory")
        return [rel for rel in self.files_below(node_path) if "/" not in rel] + \
            sorted(name for name in (os.listdir(here) if os.path.isdir(here) else ()) if os.path.isdir(os.path.join(here, name)))

    def with_overlay(self, overlay):
        reader = NodeReader(self.root, dict(self.overlay, **overlay))
        reader._cache = self._cache
        return reader


class Origin:
    """Where a flag comes from."""

    def __init__(self, kind, path=None, variable=None, index=None):
        self.kind = kind  # envfile, unit-env, exec, rancher-config, default
        self.path = path
        self.variable = variable
        self.index = index

    def describe(self):
        if self.kind == "envfile":
            return "%s in %s" % (self.variable, self.path)
        if self.kind == "unit-env":
            return "Environment=%s in %s" % (self.variable, self.path)
        if self.kind == "exec":
            return "ExecStart= in %s" % self.path
        if self.kind == "rancher-config":
            return "%s[%d] in %s" % (self.variable, self.index, self.path)
        return "built-in default of the distribution"

    def as_dict(self):
        pairs = (("kind", self.kind), ("path", self.path), ("variable", self.variable), ("index", self.index))
        return {key: value for key, value in pairs if value is not None}


class Flag:
    def __init__(self, name, value, origin):
        self.name = name
        self.value = value
        self.origin = origin

    def text(self):
        return "--%s" % self.name if self.value is None else "--%s=%s" % (self.name, self.value)


def parse_unit_text(text, path):
    """[(section, key, value)] of a unit file or drop-in, continuation lines joined."""
    entries = []
    section = None
    pending = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if "=" not in line:
            raise GpuhardenError("%s: line %d is not Key=Value: %r" % (path, lineno, line))
        key, value = line.split("=", 1)
        entries.append((section, key.strip(), value.strip()))
    return entries


def _unit_specifiers(value, unit_name):
    base = unit_name.rsplit(".", 1)[0]
    return re.sub(r"%([nN%])", lambda m: {"n": unit_name, "N": base, "%": "%"}[m.group(1)], value)


def find_unit(reader, service):
    name = service if "." in service else service + ".service"
    for directory in UNIT_DIRS:
        path = "%s/%s" % (directory, name)
        if reader.read_present(path) is not None:
            return name, path
    return name, None


def load_unit(reader, service):
    """The service's [Service] settings after its drop-ins, as systemd merges them."""
    name, main = find_unit(reader, service)
    if main is None:
        raise GpuhardenError("service %s: no unit file %s in %s" % (service, name, ", ".join(UNIT_DIRS)))
    dropins = {}
    for directory in reversed(UNIT_DIRS):  # same-named drop-ins in earlier dirs mask later ones
        dropin_dir = "%s/%s.d" % (directory, name)
        for rel in reader.dropin_dir_entries(dropin_dir):
            if rel.endswith(".conf"):  # a directory named *.conf reaches read, which refuses it
                dropins[rel] = "%s/%s" % (dropin_dir, rel)
    fragments = [main] + [dropins[key] for key in sorted(dropins)]
    unit = {"name": name, "path": main, "fragments": fragments, "exec_start": None, "environment": [],
            "environment_files": []}
    for path in fragments:
        for section, key, value in parse_unit_text(reader.read_present(path), path):
            if section != "Service":
                continue
            if key == "ExecStart":
                unit["exec_start"] = (value, path) if value else None
            elif key == "Environment":
                if not value:
                    unit["environment"] = []
                    continue
                try:
                    items = shlex.split(value)
                except ValueError as error:
                    raise GpuhardenError("%s: Environment=%s: %s" % (path, value, error)) from None
                for item in items:
                    var, _sep, val = item.partition("=")
                    unit["environment"].append((var, val, path))
            elif key == "EnvironmentFile":
                if not value:
                    unit["environment_files"] = []
                    continue
                optional = value.startswith("-")
                unit["environment_files"].append((_unit_specifiers(value.lstrip("-"), name), optional, path))
    if unit["exec_start"] is None:
        raise GpuhardenError("service %s: %s and its drop-ins set no ExecStart=" % (service, main))
    return unit


class EnvFile:
    """An EnvironmentFile= (KEY=VALUE lines) that can be rewritten one variable at a time."""

    LINE_RE = re.compile(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")

    def __init__(self, path, text):
        self.path = path
        self.text = text
        self.lines = text.split("\n")
        self.values = {}
        self.where = {}
        index = 0
        while index < len(self.lines):
            line = self.lines[index]
            start = index
            index += 1
            stripped = line.strip()
            if not stripped or stripped[0] in "#;":
                continue
            while line.endswith("\\") and index < len(self.lines):
                line = line[:-1] + self.lines[index]
                index += 1
            match = self.LINE_RE.match(line)
            if not match:
                raise GpuhardenError("%s: line %d is not KEY=VALUE: %r" % (path, start + 1, stripped))
            raw = match.group(3)
            quote = ""
            if raw[:1] in ("'", '"'):
                quote = raw[0]
                if len(raw) < 2 or not raw.endswith(quote):
                    raise GpuhardenError("%s: line %d: unterminated %s quote in %s=%s"
                                         % (path, start + 1, quote, match.group(2), raw))
                raw = raw[1:-1]
                if quote == '"':
                    raw = re.sub(r'\\(["\\$`])', r"\1", raw)
            self.values[match.group(2)] = raw
            self.where[match.group(2)] = (start, index, match.group(1), quote)

    def set(self, variable, value):
        start, end, prefix, quote = self.where[variable]
        if end - start > 1:
            raise GpuhardenError("%s: %s spans continuation lines; edit it by hand" % (self.path, variable))
        written = value.replace("\\", "\\\\").replace('"', '\\"') if quote == '"' else value
        self.lines[start] = "%s%s=%s%s%s" % (prefix, variable, quote, written, quote)
        self.values[variable] = value

    def add(self, variable, value):
        """A new ``VARIABLE=value`` line at the end (the file's last newline kept)."""
        at = len(self.lines) - 1 if self.lines and self.lines[-1] == "" else len(self.lines)
        self.lines.insert(at, "%s=%s" % (variable, value))
        self.values[variable] = value
        self.where[variable] = (at, at + 1, "", "")

    def render(self):
        return "\n".join(self.lines)


def unit_environment(reader, unit):
    """{NAME: (value, Origin)} and the parsed env files; EnvironmentFile= beats Environment=."""
    values = {}
    for var, val, path in unit["environment"]:
        values[var] = (val, Origin("unit-env", path, var))
    env_files = {}
    for path, optional, unit_path in unit["environment_files"]:
        text = reader.read(path)
        if text is None:
            if optional:
                continue
            raise GpuhardenError("%s: EnvironmentFile=%s does not exist, so %s cannot start"
                                 % (unit_path, path, unit["name"]))
        env_file = EnvFile(path, text)
        env_files[path] = env_file
        for var, val in env_file.values.items():
            values[var] = (val, Origin("envfile", path, var))
    return values, env_files


def exec_tokens(unit, env):
    """ExecStart= as (word, Origin) after systemd's variable expansion."""
    line, path = unit["exec_start"]
    line = line.lstrip("-@+!:")
    try:
        words = shlex.split(line)
    except ValueError as error:
        raise GpuhardenError("%s: ExecStart=%s: %s" % (path, line, error)) from None
    exec_origin = Origin("exec", path)
    tokens = []
    for word in words:
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", word)
        if whole:
            value, origin = env.get(whole.group(1) or whole.group(2), ("", None))
            parts = value.split() if whole.group(1) else ([value] if value else [])
            tokens.extend((part, origin or exec_origin) for part in parts)
            continue
        expanded = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ("", None))[0], word)
        tokens.append((expanded, exec_origin))
    return tokens


def parse_flags(tokens):
    """pflag-like: [(word, origin)] -> [Flag], names normalised (``_`` -> ``-``)."""
    flags = []
    index = 0
    while index < len(tokens):
        word, origin = tokens[index]
        index += 1
        if word == "--":
            break
        if not word.startswith("-") or word == "-":
            continue
        body = word.lstrip("-")
        if "=" in body:
            name, value = body.split("=", 1)
        elif body.replace("_", "-") in BOOL_FLAGS or index >= len(tokens):
            name, value = body, None
        else:
            name, value = body, tokens[index][0]
            index += 1
        flags.append(Flag(name.replace("_", "-"), value, origin))
    return flags


def last_flag(flags, name):
    found = [flag for flag in flags if flag.name == name]
    return found[-1] if found else None


# --------------------------------------------------------------------------------------------
# YAML documents


def _yaml():
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def _sequence_indent(text):
    """(sequence, offset) for ruamel from the first block sequence under a key in ``text``."""
    lines = text.splitlines()
    for number, line in enumerate(lines[1:], 1):
        stripped = line.lstrip()
        if stripped.startswith("- ") or stripped == "-":
            parent = lines[number - 1]
            if parent.rstrip().endswith(":"):
                offset = max(0, len(line) - len(stripped) - (len(parent) - len(parent.lstrip())))
                return offset + 2, offset
            break
    return 2, 0


def _kind_in_words(value):
    """What a decoded value is, in the words of a config file (never a Python type name)."""
    value = _plain(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean (%s)" % json.dumps(value)
    if isinstance(value, (int, float)):
        return "a number (%s)" % json.dumps(value)
    if isinstance(value, str):
        return "a string (%s)" % json.dumps(value[:80])
    if isinstance(value, list):
        return "a list (%s)" % _short(value)
    return "a mapping (%s)" % _short(value)


def _short(value, limit=80):
    text = json.dumps(_plain(value), ensure_ascii=False)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# The kubelet's decoder takes a document whose first non-space byte is "{" as JSON, anything else as YAML
# (k8s.io/apimachinery v0.36.3 pkg/runtime/serializer/json/json.go Serializer.RecognizesData ->
# pkg/util/yaml/decoder.go IsJSONBuffer: bytes.TrimLeftFunc(unicode.IsSpace) then the prefix "{").  Such a file is
# parsed, checked and written back as JSON; a YAML flow mapping that starts with "{" and is not JSON is refused by
# the kubelet already ("couldn't get version/kind; json parse error"), so it is refused here too.


def looks_like_json(text):
    return (text or "").lstrip().startswith("{")


def load_json(text, path):
    """The JSON document ``text`` (object order kept), bounded as _safe_parse bounds every config; errors in one line."""
    return _safe_parse.json_load(text, path, what="kubelet config",
                                 not_json="the file starts with \"{\", so the kubelet reads it as JSON",
                                 not_json_fix="write the file as JSON, or as YAML that does not start with \"{\"")


def _json_style(text):
    """How ``text`` lays out its JSON: (indent or None, item separator, key separator, final newline)."""
    key_sep = re.search(r'"\s*:(\s?)', text)
    key_separator = ": " if key_sep is None or key_sep.group(1) else ":"
    body = text.strip()
    if "\n" not in body:
        item_sep = re.search(r",(\s?)", _safe_parse.JSON_STRING.sub('""', body))
        return None, ", " if item_sep is None or item_sep.group(1) else ",", key_separator, text.endswith("\n")
    inner = body.split("\n")[1]
    indent = inner[:len(inner) - len(inner.lstrip())] or "  "
    return (indent if indent.strip(" ") else len(indent)), ",", key_separator, text.endswith("\n")


class YamlFile:
    """A YAML (or JSON) file loaded once for a round-trip edit (comments, order and, for JSON, layout kept).

    ``json_first``: the file's reader takes a document that starts with "{" as JSON (the kubelet's decoder does),
    so such a file is parsed as JSON and written back as JSON."""

    json_first = False

    def __init__(self, path, text, what):
        self.path = path
        self.text = text
        self.modified = False
        self.is_json = False
        if text is None:
            self.doc = None
            return
        if self.json_first and looks_like_json(text):
            self.is_json = True
            doc = load_json(text, path)
        else:
            doc = _safe_parse.round_trip_load(_yaml(), text, path)
        if doc is None:
            doc = CommentedMap()
        if not isinstance(doc, dict):
            raise GpuhardenError("%s: the %s must be a mapping of fields, found %s" % (path, what, _kind_in_words(doc)),
                                 fix="write the file as a mapping (field: value lines)")
        self.doc = doc

    def render(self):
        if not self.modified:
            return self.text
        if self.is_json:
            indent, item_sep, key_sep, newline = _json_style(self.text)
            rendered = json.dumps(_plain(self.doc), indent=indent, separators=(item_sep, key_sep), ensure_ascii=False)
            return rendered + ("\n" if newline else "")
        yaml = _yaml()
        sequence, offset = _sequence_indent(self.text or "")
        yaml.indent(mapping=2, sequence=sequence, offset=offset)
        if self.json_first and getattr(self.doc, "fa", None) is not None and self.doc.fa.flow_style():
            # a flow mapping at the top would start the file with "{": its reader would then take it as JSON
            self.doc.fa.set_block_style()
        stream = io.StringIO()
        yaml.dump(self.doc, stream)
        return stream.getvalue()


class KubeletConfigFile(YamlFile):
    json_first = True

    def __init__(self, path, text, dropin):
        super().__init__(path, text, "kubelet drop-in" if dropin else "KubeletConfiguration file")
        self.dropin = dropin
        if self.doc is None:
            return
        # The kubelet refuses an empty --config file ("kubelet config file ... was empty") and decodes it with the
        # universal decoder, which needs apiVersion and kind (kubernetes/kubernetes
        # pkg/kubelet/kubeletconfig/configfiles/configfiles.go, .../util/codec/codec.go); a drop-in without them, or
        # with another group/version/kind than kubelet.config.k8s.io/v1beta1 KubeletConfiguration, is refused in
        # cmd/kubelet/app/server.go mergeKubeletConfigurations.  KubeletConfiguration exists only in v1beta1.
        what = "kubelet drop-in" if dropin else "kubelet config file"
        if not (text or "").strip():
            raise GpuhardenError("%s: the %s is empty; the kubelet refuses it (it needs at least apiVersion: %s and "
                                 "kind: %s)" % (path, what, API_VERSION, KIND))
        missing = [field for field in ("apiVersion", "kind") if self.doc.get(field) is None]
        if missing:
            raise GpuhardenError("%s: %s without %s (the kubelet refuses it; expected apiVersion: %s, kind: %s)"
                                 % (path, what, " and ".join(missing), API_VERSION, KIND))
        for field, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
            value = self.doc.get(field)
            if value != expected:
                raise GpuhardenError("%s: %s is %r, expected %r (the kubelet refuses it)" % (path, field, _plain(value), expected))
        # The types as the kubelet's decoder sees them: JSON as it is; YAML as sigs.k8s.io/yaml's YAML 1.1 reading
        # turns it into JSON (yes/on are booleans there), which PyYAML's safe loader shares and ruamel's 1.2 does not.
        check_field_types(self.doc if self.is_json else _safe_parse.safe_load(text, path) or {}, path, self.is_json)

    def lookup(self, path):
        """(state, value): state 'absent' (says nothing), 'unset' (null / replaced by a non-map), 'set'."""
        if self.doc is None:
            return "absent", None
        node = self.doc
        for depth, key in enumerate(path):
            if not isinstance(node, dict):
                return "unset", None
            if key not in node:
                return "absent", None
            node = node[key]
            if node is None:
                return "unset", None
            if depth < len(path) - 1 and not isinstance(node, dict):
                return "unset", None
        return "set", node

    def assign(self, path, value):
        """Set one field path; True when the file changes."""
        node = self.doc
        for key in path[:-1]:
            child = node.get(key)
            if child is None:
                child = CommentedMap()
                node[key] = child
            elif not isinstance(child, dict):
                raise GpuhardenError("%s: field %s is %s, expected a mapping" % (self.path, key, _show(child)))
            node = child
        if path[-1] in node and _same(node[path[-1]], value):
            return False
        node[path[-1]] = value
        self.modified = True
        return True

    def remove_override(self, path):
        """Remove what this file says about ``path`` (the leaf, or the null / non-map above it)."""
        node = self.doc
        for depth, key in enumerate(path):
            if not isinstance(node, dict) or key not in node:
                return
            child = node[key]
            if depth == len(path) - 1 or child is None or not isinstance(child, dict):
                del node[key]
                self.modified = True
                return
            node = child


def new_dropin_text(path):
    return ("# Managed by gpuharden.k8s.kubelet_config: settings the kubelet must have on this node.\n"
            "apiVersion: %s\nkind: %s\n" % (API_VERSION, KIND))


# --------------------------------------------------------------------------------------------
# the JSON type of every KubeletConfiguration field


# The JSON type of each top-level field of KubeletConfiguration v1beta1 (k8s.io/kubelet v0.36.3
# config/v1beta1/types.go): Go's string and named string types, metav1.Duration (a string time.ParseDuration reads),
# bool, int32/int64 (and pointers to them), *float64, maps, lists and structs ("mapping", checked only as a mapping).
# The kubelet decodes its config into that struct (pkg/kubelet/kubeletconfig/util/codec/codec.go
# DecodeKubeletConfiguration; a drop-in through the same decoder, cmd/kubelet/app/server.go
# loadDropinConfigFileIntoJSON): a value of another JSON type is an unmarshal error, not a strict-decoding one, so the
# lenient fallback does not save it and the kubelet does not start.  gpuharden refuses such a file before any write,
# fields it does not manage included, instead of carrying the value into a file it rewrites.  null is accepted
# everywhere (JSON null leaves a Go value as it is); unknown fields are the lenient decoder's business (it accepts
# them with a warning).  tests/unit/test_kubelet_types.py pins every kind against the real decoder (kubelet-validate).
FIELD_TYPES = {
    "string": (
        "address", "cgroupDriver", "cgroupRoot", "clusterDomain", "configMapAndSecretChangeDetectionStrategy",
        "containerLogMaxSize", "containerRuntimeEndpoint", "contentType", "cpuManagerPolicy", "hairpinMode",
        "healthzBindAddress", "imagePullCredentialsVerificationPolicy", "imageServiceEndpoint", "kubeReservedCgroup",
        "kubeletCgroups", "memoryManagerPolicy", "memoryReservationPolicy", "podCIDR", "podLogsDir", "providerID",
        "reservedSystemCPUs", "resolvConf", "showHiddenMetricsForVersion", "staticPodPath", "staticPodURL",
        "systemCgroups", "systemReservedCgroup", "tlsCertFile", "tlsMinVersion", "tlsPrivateKeyFile",
        "topologyManagerPolicy", "topologyManagerScope", "volumePluginDir"),
    "duration": (
        "containerLogMonitorInterval", "cpuCFSQuotaPeriod", "cpuManagerReconcilePeriod",
        "evictionPressureTransitionPeriod", "fileCheckFrequency", "httpCheckFrequency", "imageMaximumGCAge",
        "imageMinimumGCAge", "nodeStatusReportFrequency", "nodeStatusUpdateFrequency", "runtimeRequestTimeout",
        "shutdownGracePeriod", "shutdownGracePeriodCriticalPods", "streamingConnectionIdleTimeout", "syncFrequency",
        "volumeStatsAggPeriod"),
    "bool": (
        "cgroupsPerQOS", "cpuCFSQuota", "enableContentionProfiling", "enableControllerAttachDetach",
        "enableDebugFlagsHandler", "enableDebuggingHandlers", "enableProfilingHandler", "enableServer",
        "enableSystemLogHandler", "enableSystemLogQuery", "failCgroupV1", "failSwapOn", "kernelMemcgNotification",
        "localStorageCapacityIsolation", "makeIPTablesUtilChains", "mergeDefaultEvictionSettings",
        "protectKernelDefaults", "registerNode", "rotateCertificates", "runOnce", "seccompDefault",
        "serializeImagePulls", "serverTLSBootstrap", "singleProcessOOMKill"),
    "int32": (
        "containerLogMaxFiles", "containerLogMaxWorkers", "eventBurst", "eventRecordQPS",
        "evictionMaxPodGracePeriod", "healthzPort", "imageGCHighThresholdPercent", "imageGCLowThresholdPercent",
        "iptablesDropBit", "iptablesMasqueradeBit", "kubeAPIBurst", "kubeAPIQPS", "maxParallelImagePulls", "maxPods",
        "nodeLeaseDurationSeconds", "nodeStatusMaxImages", "oomScoreAdj", "podsPerCore", "port", "readOnlyPort",
        "registryBurst", "registryPullQPS"),
    "int64": (
        "maxOpenFiles", "podPidsLimit"),
    "number": (
        "memoryThrottlingFactor",),
    "map of strings": (
        "cpuManagerPolicyOptions", "evictionHard", "evictionMinimumReclaim", "evictionSoft",
        "evictionSoftGracePeriod", "kubeReserved", "qosReserved", "systemReserved", "topologyManagerPolicyOptions"),
    "map of booleans": (
        "featureGates",),
    "map of string lists": (
        "staticPodURLHeader",),
    "list of strings": (
        "allowedUnsafeSysctls", "clusterDNS", "enforceNodeAllocatable",
        "preloadedImagesVerificationAllowlist", "tlsCipherSuites"),
    "list of int32": (
        "tlsCurvePreferences",),
    "list of mappings": (
        "registerWithTaints", "reservedMemory", "shutdownGracePeriodByPodPriority"),
    "mapping": (
        "authentication", "authorization", "crashLoopBackOff", "logging", "memorySwap", "tracing",
        "userNamespaces"),
}
KIND_WORDS = {"string": "a string", "duration": "a duration string such as \"10s\" or \"1m30s\"", "bool": "true or false",
              "int32": "a whole number", "int64": "a whole number", "number": "a number", "map of strings": "a mapping of strings",
              "map of booleans": "a mapping of true/false values", "map of string lists": "a mapping of string lists",
              "list of strings": "a list of strings", "list of int32": "a list of whole numbers",
              "list of mappings": "a list of mappings", "mapping": "a mapping"}
FIELD_KIND = {field: kind for kind, fields in FIELD_TYPES.items() for field in fields}
# Go's time.ParseDuration: an optional sign, then one or more decimal numbers with a unit, or a bare 0.
GO_DURATION_RE = re.compile(r"^[-+]?(?:0|(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)$")
INT_RANGES = {"int32": (-2 ** 31, 2 ** 31 - 1), "int64": (-2 ** 63, 2 ** 63 - 1)}


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar_fits(kind, value, json_source):
    if value is None:
        return True
    if kind == "string":
        return isinstance(value, str)
    if kind == "duration":
        return isinstance(value, str) and bool(GO_DURATION_RE.match(value))
    if kind == "bool":
        return isinstance(value, bool)
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        # YAML 1.0 reaches the decoder as JSON 1 (sigs.k8s.io/yaml), a JSON 1.0 as itself, which Go refuses for an int
        whole = isinstance(value, float) and not json_source and value.is_integer()
        return (whole or (isinstance(value, int) and not isinstance(value, bool))) and low <= value <= high
    if kind == "number":
        return _is_number(value)
    return True


def _value_fits(kind, value, json_source):
    if value is None:
        return True
    if kind.startswith("map of "):
        inner = {"map of strings": "string", "map of booleans": "bool", "map of string lists": "list of strings"}[kind]
        return isinstance(value, dict) and all(_value_fits(inner, item, json_source) for item in value.values())
    if kind.startswith("list of "):
        inner = {"list of strings": "string", "list of int32": "int32", "list of mappings": "mapping"}[kind]
        return isinstance(value, list) and all(_value_fits(inner, item, json_source) for item in value)
    if kind == "mapping":
        return isinstance(value, dict)
    return _scalar_fits(kind, value, json_source)


def check_field_types(doc, path, json_source=False):
    """Refuse the first known field whose value the kubelet's decoder cannot take (one line: file, field, value)."""
    for field, value in doc.items():
        kind = FIELD_KIND.get(field)
        if kind is not None and not _value_fits(kind, value, json_source):
            raise GpuhardenError("%s: field %s is %s; the kubelet needs %s there and refuses the file"
                                 % (path, field, _kind_in_words(value), KIND_WORDS[kind]),
                                 fix="correct %s in %s (the kubelet does not start with it as it is)" % (field, path))


# --------------------------------------------------------------------------------------------
# discovery


def detect_service(reader, service, flavor):
    if service != "auto":
        return service
    candidates = SERVICES[flavor] if flavor != "auto" else tuple(name for names in SERVICES.values() for name in names)
    found = [name for name in candidates if find_unit(reader, name)[1] is not None]
    if not found:
        raise GpuhardenError("no kubelet service found: none of %s has a unit file in %s; set option service"
                             % (", ".join(candidates), ", ".join(UNIT_DIRS)))
    if len(found) > 1:
        raise GpuhardenError("more than one kubelet service unit found (%s); set option service to the one that runs"
                             % ", ".join(found))
    return found[0]


def detect_flavor(flavor, service, unit):
    if flavor != "auto":
        return flavor
    words = unit["exec_start"][0].lstrip("-@+!:").split()
    binary = os.path.basename(words[0]) if words else ""
    for name in ("k3s", "rke2"):
        if service.startswith(name) or binary == name:
            return name
    return "kubeadm"


def _default_run_command(argv):
    """(rc, stdout, stderr) of a command, C locale; the module passes AnsibleModule.run_command instead."""
    env = dict(os.environ, LANG="C", LC_ALL="C")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return 127, "", str(error)
    return done.returncode, done.stdout, done.stderr


class DistributionVersion:
    """The k3s/rke2 version, or a kubeadm node's kubelet version: option distribution_version, else
    ``<ExecStart binary> --version`` (read once)."""

    def __init__(self, root="/", given=None, run_command=None):
        self.root = root
        self.given = given
        self.run_command = run_command or _default_run_command
        self.found = None

    def parse(self, text, source):
        match = VERSION_RE.search(text or "")
        if not match:
            return None
        return {"version": match.group(0).split()[-1], "minor": (int(match.group(2)), int(match.group(3))),
                "source": source}

    def require(self, flavor, binary):
        found, why = self.ask(binary, "option distribution_version=%r: not a version such as v1.31.4+" + flavor + "1")
        if found is not None:
            return found
        # Never guessed: before v1.32 the kubelet drop-in directory must not be written (RANCHER_DROPIN_SINCE).
        raise GpuhardenError("%s: cannot tell the %s version (%s); %s before v1.32 reads no kubelet drop-in "
                             "directory, so the place to write depends on it. Set option distribution_version (the "
                             "node's status.nodeInfo.kubeletVersion, e.g. v1.31.4+%s1)" % (flavor, flavor, why, flavor, flavor))

    def kubelet(self, binary):
        """(version or None, why not): a kubeadm node's kubelet, from option distribution_version or
        ``<ExecStart program> --version`` ("Kubernetes v1.36.3").  Not knowing it is no error (the caller keeps to the
        --config file); a malformed option is."""
        return self.ask(binary, "option distribution_version=%r: not a kubelet version such as v1.36.3")

    def ask(self, binary, bad_option):
        """(version, None) or (None, why): the given option first, else the program's own answer (read once)."""
        if self.found is not None:
            return self.found, None
        if self.given:
            found = self.parse("Kubernetes v" + self.given.strip().lstrip("v"), "option distribution_version")
            if found is None:
                raise GpuhardenError(bad_option % self.given)
            self.found = found
            return found, None
        why = "the unit's ExecStart= names no program"
        if binary:
            path = host_path(self.root, binary)
            if not os.path.isfile(path) or not os.access(path, os.X_OK):
                why = "%s is not an executable file" % path
            else:
                rc, out, err = self.run_command([path, "--version"])
                found = self.parse(out, "%s --version" % binary) if rc == 0 else None
                if found is not None:
                    self.found = found
                    return found, None
                why = "%s --version answered rc=%s: %s" % (binary, rc, (out or err or "").strip()[:200] or "nothing")
        return None, why


def _arg_name(entry):
    return str(entry).lstrip("-").split("=", 1)[0].replace("_", "-")


def rancher_kubelet_args(reader, flavor, tokens, env, dropins=True):
    """kubelet flags of a k3s/rke2 node: the distribution's own (its --config-dir from v1.32 on), then kubelet-arg.

    Also returns the loaded config files and where a new kubelet-arg entry goes: the last file whose list the
    distribution uses (``kubelet-arg`` replaces the lists before it, ``kubelet-arg+`` appends)."""
    settings = RANCHER[flavor]
    config = env.get(settings["config_env"], (settings["config"], None))[0] or settings["config"]
    exec_args = []
    index = 1
    while index < len(tokens):
        word, origin = tokens[index]
        index += 1
        for option in ("--config", "-c", "--kubelet-arg"):
            if word == option and index < len(tokens):
                value = tokens[index][0]
                index += 1
            elif word.startswith(option + "="):
                value = word[len(option) + 1:]
            else:
                continue
            if option == "--kubelet-arg":
                exec_args.append(("--" + value.lstrip("-"), origin))
            else:
                config = value
            break
    yaml_files = {}
    files = [config]
    config_d = config + ".d"
    if reader.isdir(config_d):
        files += ["%s/%s" % (config_d, rel) for rel in reader.files_below(config_d)
                  if "/" not in rel and rel.endswith((".yaml", ".yml"))]
    yaml_args = []
    arg_target = None
    for path in files:
        loaded = YamlFile(path, reader.read(path), "%s config file" % flavor)
        if loaded.doc is None:
            continue
        yaml_files[path] = loaded
        for key in ("kubelet-arg", "kubelet-arg+"):
            if key not in loaded.doc:
                continue
            value = loaded.doc[key]
            if isinstance(value, str):
                raise GpuhardenError("%s: %s is a string (%r); gpuharden needs the list form to edit it"
                                     % (path, key, value))
            if value is not None and (not isinstance(value, list) or not all(isinstance(item, str) for item in value)):
                raise GpuhardenError("%s: %s must be a list of strings, found %s" % (path, key, _show(value)))
            entries = [("--" + item.lstrip("-"), Origin("rancher-config", path, key, number))
                       for number, item in enumerate(value or [])]
            yaml_args = entries if key == "kubelet-arg" else yaml_args + entries
            if value is not None:
                arg_target = (path, key)
    user_args = exec_args if exec_args else yaml_args
    user_names = {_arg_name(word) for word, _origin in user_args}
    if dropins:
        default = [("--config-dir=" + settings["config_dir"], Origin("default"))]
    else:
        # Before v1.32 the distribution passes its defaults as flags; a kubelet-arg of the same name replaces one.
        default = [(word, Origin("default")) for word in RANCHER_BUILTIN_FLAGS if _arg_name(word) not in user_names]
    arg_info = {"exec": bool(exec_args), "target": arg_target or (config, "kubelet-arg")}
    return parse_flags([("kubelet", None)] + default + user_args), yaml_files, arg_info


def _exec_binary(unit):
    words = unit["exec_start"][0].lstrip("-@+!:").split()
    return words[0] if words else None


def discover(reader, service="auto", flavor="auto", versions=None):
    """Everything the kubelet reads, parsed: unit, env files, flags, config file and drop-ins."""
    service = detect_service(reader, service, flavor)
    unit = load_unit(reader, service)
    flavor = detect_flavor(flavor, service, unit)
    env, env_files = unit_environment(reader, unit)
    tokens = exec_tokens(unit, env)
    rancher_files = {}
    arg_info = None
    version = None
    legacy = False
    if flavor == "kubeadm":
        flags = parse_flags(tokens[1:])
    else:
        version = (versions or DistributionVersion(reader.root)).require(flavor, _exec_binary(unit))
        legacy = version["minor"] < RANCHER_DROPIN_SINCE
        flags, rancher_files, arg_info = rancher_kubelet_args(reader, flavor, tokens, env, dropins=not legacy)
    config_flag = last_flag(flags, "config")
    dir_flag = last_flag(flags, "config-dir")
    config_path = config_flag.value if config_flag else None
    config_dir = dir_flag.value.rstrip("/") if dir_flag and dir_flag.value else None
    if not config_path and not config_dir and not legacy:
        raise GpuhardenError("service %s: the kubelet is started without --config or --config-dir (%s), so it reads "
                             "no configuration file; add --config first" % (service, ", ".join(unit["fragments"])))
    layers = []
    if config_path:
        text = reader.read(config_path)
        if text is None:
            raise GpuhardenError("%s: the kubelet's --config file does not exist (from %s)"
                                 % (config_path, config_flag.origin.describe()))
        layers.append(KubeletConfigFile(config_path, text, dropin=False))
    dropin_names = []
    if config_dir:
        for rel in reader.files_below(config_dir):
            if rel.endswith(".conf"):
                path = "%s/%s" % (config_dir, rel)
                text = reader.read(path)
                if text is None:
                    # a link to nothing: the kubelet lists it and then fails to read it (k8s.io/kubernetes v1.36.3
                    # cmd/kubelet/app/server.go mergeKubeletConfigurations: WalkDir, then os.ReadFile)
                    raise GpuhardenError("%s: names no file on the node (a link to nothing); the kubelet refuses to "
                                         "start on its --config-dir %s" % (reader.path(path), config_dir),
                                         fix="remove the link or point it at a drop-in file inside the node")
                dropin_names.append(rel)
                layers.append(KubeletConfigFile(path, text, dropin=True))
    root_flag = last_flag(flags, "root-dir")
    return {
        "service": service, "flavor": flavor, "unit": unit, "env_files": env_files, "flags": flags,
        "rancher_files": rancher_files, "config": config_path, "config_dir": config_dir, "layers": layers,
        "dropin_names": dropin_names, "root_dir": root_flag.value if root_flag and root_flag.value else DEFAULT_ROOT_DIR,
        "version": version, "kubelet_args_only": legacy, "kubelet_arg": arg_info,
    }


# --------------------------------------------------------------------------------------------
# effective values


def parse_map_flag(value, field=None):
    """One occurrence of a map flag as {key: value} (``<`` for the eviction thresholds, one pair for NoSplit maps)."""
    separator = "<" if field in LANGLE_MAP_FIELDS else "="
    items = [value or ""] if field in NOSPLIT_MAP_FIELDS else (value or "").split(",")
    result = {}
    for item in items:
        if item.strip():
            key, _sep, val = item.partition(separator)
            result[key.strip()] = val.strip()
    return result


def flag_map(found, field):
    """All occurrences of a map flag: the first replaces the file's map, the next ones add to it."""
    result = {}
    for flag in found:
        result.update(parse_map_flag(flag.value, field))
    return result


def parse_reserved_memory(values):
    """--reserved-memory occurrences ("0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi") as reservedMemory."""
    result = []
    for value in values:
        for part in (value or "").split(";"):
            if not part.strip():
                continue
            numa, _sep, limits = part.partition(":")
            try:
                numa_node = int(numa)
            except ValueError:
                numa_node = numa
            result.append({"numaNode": numa_node, "limits": parse_map_flag(limits)})
    return result


def flag_setting(flags, path, desired):
    """(Flag or None, value as the kubelet would read it) for a field path set by a flag."""
    field = path[0]
    name = flag_for_field(field)
    found = [flag for flag in flags if flag.name == name]
    if not found:
        return None, None
    if field in MERGED_MAP_FIELDS:
        if len(path) < 2:
            return found[-1], {key: val for flag in found for key, val in parse_map_flag(flag.value).items()}
        setter = None
        for flag in found:
            if path[1] in parse_map_flag(flag.value):
                setter = flag
        return (setter, parse_map_flag(setter.value)[path[1]]) if setter else (None, None)
    if field == "reservedMemory":
        return found[-1], parse_reserved_memory([flag.value for flag in found])
    if field in MAP_FLAG_FIELDS:
        merged = flag_map(found, field)
        return found[-1], (merged.get(path[1]) if len(path) > 1 else merged)
    value = found[-1].value
    if value is None and name in BOOL_FLAGS:
        value = "true"  # pflag: a bool flag without a value means true
    if len(path) > 1:
        return found[-1], parse_map_flag(value).get(path[1])
    if isinstance(desired, list):
        return found[-1], [item.strip() for item in (value or "").split(",") if item.strip()]
    return found[-1], value


def flag_agrees(flag_value, desired):
    if flag_value is None:
        return desired is None
    if isinstance(desired, bool):
        return str(flag_value).lower() == str(desired).lower()
    if isinstance(desired, (int, float)):
        try:
            return float(flag_value) == float(desired)
        except (TypeError, ValueError):
            return False
    if isinstance(desired, list) and desired and isinstance(desired[0], dict):
        return _plain(flag_value) == _plain(desired)
    if isinstance(desired, dict):
        return {str(k): str(v) for k, v in (flag_value or {}).items()} == {str(k): str(v) for k, v in desired.items()}
    return _plain(flag_value) == _plain(desired)


def effective(view, path, desired=None):
    """{value, source} of one field path: the last file layer that sets it, unless a flag does."""
    value, source = DEFAULTS.get(path[0]) if len(path) == 1 else None, {"kind": "default"}
    for layer in view["layers"]:
        state, found = layer.lookup(path)
        if state == "absent":
            continue
        kind = "dropin" if layer.dropin else "file"
        value, source = (_plain(found), {"kind": kind, "path": layer.path}) if state == "set" else (None, {
            "kind": kind, "path": layer.path, "unset": True})
    flag, flag_value = flag_setting(view["flags"], path, desired)
    if flag is not None:
        value = flag_value
        source = dict(flag.origin.as_dict(), kind="flag", flag=flag.text(), where=flag.origin.kind)
    return {"value": value, "source": source, "flag": flag}


def effective_matches(entry, desired):
    if entry["flag"] is not None:
        return flag_agrees(entry["value"], desired)
    return _same(entry["value"], desired)


# --------------------------------------------------------------------------------------------
# desired state from the module's options


def _fail_option(option, value, why):
    raise GpuhardenError("option %s=%s: %s" % (option, _show(value), why))


ONLINE_CPUS = "/sys/devices/system/cpu/online"


def cpu_set(text):
    """The CPUs of a Linux CPU list such as ``0-3,8`` (the format of sysfs and of reservedSystemCPUs)."""
    cpus = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, _sep, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def format_cpu_set(cpus):
    return ",".join(str(cpu) for cpu in sorted(cpus))


def _check_cpulist(option, value):
    if not isinstance(value, str) or not CPULIST_RE.match(value.replace(" ", "")):
        _fail_option(option, value, "not a CPU list such as 0-1 or 0,64")
    for part in value.replace(" ", "").split(","):
        low, _sep, high = part.partition("-")
        if high and int(high) < int(low):
            _fail_option(option, value, "range %s runs backwards" % part)
    return value.replace(" ", "")


def _check_quantities(option, value):
    if not isinstance(value, dict) or not value:
        _fail_option(option, value, "expected a non-empty mapping of resource name to quantity")
    result = {}
    for key, quantity in value.items():
        if isinstance(quantity, bool) or not isinstance(quantity, (str, int)):
            _fail_option(option, value, "%s must be a quantity such as 1Gi, found %s" % (key, _show(quantity)))
        if not QUANTITY_RE.match(str(quantity)):
            _fail_option(option, value, "%s=%s is not a Kubernetes quantity" % (key, quantity))
        result[str(key)] = str(quantity)
    return result


def _check_reserved_memory(option, value):
    if not isinstance(value, list) or not value:
        _fail_option(option, value, "expected a non-empty list of {numaNode, limits}")
    result = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != {"numaNode", "limits"}:
            _fail_option(option, value, "each entry needs exactly numaNode and limits, found %s" % _show(entry))
        numa = entry["numaNode"]
        if isinstance(numa, bool) or not isinstance(numa, int) or numa < 0:
            _fail_option(option, value, "numaNode must be a NUMA node number >= 0, found %s" % _show(numa))
        result.append({"numaNode": numa, "limits": _check_quantities("%s[numaNode=%d].limits" % (option, numa),
                                                                     entry["limits"])})
    return result


def _check_choice(option, value, choices):
    if value not in choices:
        _fail_option(option, value, "unknown value, expected one of %s" % ", ".join(choices))
    return value


def topology_option_value(name, value):
    """(the text the kubelet reads, None) for a topologyManagerPolicyOptions entry the kubelet v1.36.3 accepts, else
    (None, why): kubernetes v1.36.3 pkg/kubelet/cm/topologymanager/policy_options.go NewPolicyOptions (an unknown
    name, a value strconv.ParseBool or strconv.Atoi refuses, max-allowable-numa-nodes below 8: the kubelet exits)."""
    if name not in TOPOLOGY_OPTIONS:
        return None, "unknown topology manager policy option %r, expected one of %s" % (name, ", ".join(TOPOLOGY_OPTIONS))
    if name == "prefer-closest-numa-nodes":
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        if text not in GO_BOOLS:
            return None, "%s must be true or false (what Go's strconv.ParseBool reads), found %s" % (name, _show(value))
        return GO_BOOLS[text], None
    text = str(value)
    if isinstance(value, bool) or not GO_INT_RE.match(text) or not -2 ** 63 <= int(text) < 2 ** 63:
        return None, "%s must be an integer, found %s" % (name, _show(value))
    if int(text) < DEFAULT_MAX_NUMA_NODES:
        return None, ("%s=%s: the kubelet refuses a value below %d and does not start (kubernetes v1.36.3 "
                      "pkg/kubelet/cm/topologymanager/policy_options.go)" % (name, text, DEFAULT_MAX_NUMA_NODES))
    return str(int(text)), None


def _check_topology_options(option, value):
    if not isinstance(value, dict):
        _fail_option(option, value, "expected a mapping of policy option to value")
    result = {}
    for key, item in value.items():
        text, why = topology_option_value(key, item)
        if why:
            _fail_option(option, value, why)
        result[key] = text
    return result


SETTING_CHECKS = {
    "topologyManagerPolicy": lambda o, v: _check_choice(o, v, TOPOLOGY_POLICIES),
    "topologyManagerScope": lambda o, v: _check_choice(o, v, TOPOLOGY_SCOPES),
    "topologyManagerPolicyOptions": _check_topology_options,
    "cpuManagerPolicy": lambda o, v: _check_choice(o, v, CPU_POLICIES),
    "memoryManagerPolicy": lambda o, v: _check_choice(o, v, MEMORY_POLICIES),
    "reservedSystemCPUs": _check_cpulist,
    "reservedMemory": _check_reserved_memory,
    "kubeReserved": _check_quantities,
    "systemReserved": _check_quantities,
}


def _check_setting(option, field, value):
    if field in SETTING_CHECKS:
        return SETTING_CHECKS[field](option, value)
    if field == "featureGates":
        if not isinstance(value, dict) or not all(isinstance(item, bool) for item in value.values()):
            _fail_option(option, value, "expected a mapping of feature gate name to true/false")
        return dict(value)
    if field == "memoryThrottlingFactor":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            _fail_option(option, value, "expected a number greater than 0 and at most 1 (kubelet default 0.9)")
        return float(value)
    if field == "enforceNodeAllocatable":
        if not isinstance(value, list) or not all(isinstance(item, str) and item in ENFORCE_VALUES for item in value):
            _fail_option(option, value, "expected a list drawn from %s" % ", ".join(ENFORCE_VALUES))
        return list(value)
    if field == "memoryReservationPolicy":
        return _check_choice(option, value, ("None", "TieredReservation"))
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            _fail_option(option, value, "keys must be strings")
        return {key: _check_setting("%s.%s" % (option, key), key, item) for key, item in value.items()}
    return value


def desired_config(params):
    """The managed KubeletConfiguration fields (nested dict) from the module's options."""
    desired = {}
    settings = params.get("settings") or {}
    if not isinstance(settings, dict):
        _fail_option("settings", settings, "expected a mapping of KubeletConfiguration fields")
    for field, value in settings.items():
        if not isinstance(field, str) or not FIELD_RE.match(field):
            _fail_option("settings", {str(field): value}, "%r is not a KubeletConfiguration field name" % field)
        if field in ("apiVersion", "kind"):
            _fail_option("settings.%s" % field, value, "is fixed (%s)" % (API_VERSION if field == "apiVersion" else KIND))
        if value is None:
            _fail_option("settings.%s" % field, value, "null is not a value; leave the field out to not manage it")
        desired[field] = _check_setting("settings.%s" % field, field, value)
    options = (
        ("topology_manager_policy", "topologyManagerPolicy"),
        ("topology_manager_scope", "topologyManagerScope"),
        ("topology_manager_policy_options", "topologyManagerPolicyOptions"),
        ("cpu_manager_policy", "cpuManagerPolicy"),
        ("reserved_system_cpus", "reservedSystemCPUs"),
        ("memory_manager_policy", "memoryManagerPolicy"),
        ("reserved_memory", "reservedMemory"),
    )
    for option, field in options:
        value = params.get(option)
        if value is None:
            continue
        value = _check_setting(option, field, value)
        if field in desired and not _same(desired[field], value):
            _fail_option("settings.%s" % field, desired[field], "conflicts with option %s=%s" % (option, _show(value)))
        desired[field] = value
    return desired


def leaves(desired, prefix=()):
    """[(path, value)]: dicts are merged key by key, everything else is one value."""
    result = []
    for key, value in desired.items():
        if isinstance(value, dict) and value and key != "reservedMemory":
            result.extend(leaves(value, prefix + (key,)))
        else:
            result.append((prefix + (key,), value))
    return result


# --------------------------------------------------------------------------------------------
# NUMA: the Topology Manager's limit on the node's NUMA nodes


def _entries(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def numa_topology(reader):
    """The NUMA nodes the kubelet's Topology Manager counts, as its cadvisor finds them, or None where sysfs shows none.

    cadvisor v0.56.2 (the kubelet v1.36.3's) utils/sysinfo/sysinfo.go GetNodesInfo: every ``node*[0-9]`` directory
    of /sys/devices/system/node is a node, CPU-less ones included (it only warns "Found node without any CPU"), so
    the memory-only nodes of a Grace Hopper or Grace Blackwell system's GPU memory count; it does not read
    ``online`` or ``possible`` (the kernel makes a directory per online node).  Without any, one node per physical
    package of the CPUs (getCPUTopology), without distances.  {nodes, cpu_less, without_distance: [ids], source}."""
    top = reader.path(NUMA_NODE_DIR)
    ids = sorted(int(match.group(1)) for match in map(NUMA_NODE_NAME_RE.match, _entries(top)) if match)
    if ids:
        listed = {node: _entries(os.path.join(top, "node%d" % node)) for node in ids}
        return {"nodes": ids, "cpu_less": [node for node in ids if not any(CPU_NAME_RE.match(name) for name in listed[node])],
                "without_distance": [node for node in ids if "distance" not in listed[node]],
                "source": NUMA_NODE_DIR + "/node*"}
    packages = set()
    for name in _entries(reader.path(CPU_DIR)):
        text = reader.read("%s/%s/topology/physical_package_id" % (CPU_DIR, name)) if CPU_NAME_RE.match(name) else None
        if text is not None and GO_INT_RE.match(text.strip()):
            packages.add(int(text.strip()))
    if packages:
        return {"nodes": sorted(packages), "cpu_less": [], "without_distance": sorted(packages),
                "source": CPU_DIR + "/cpu*/topology/physical_package_id"}
    return None


def _source_text(source):
    if source.get("kind") == "flag":
        return "flag %s, %s" % (source.get("flag"), source.get("path") or source.get("where"))
    return source.get("path") or "the kubelet's default"


def _numa_limit(options):
    """max-allowable-numa-nodes as the kubelet reads it from the options (the default without it)."""
    text = options.get("max-allowable-numa-nodes")
    return DEFAULT_MAX_NUMA_NODES if text is None else int(topology_option_value("max-allowable-numa-nodes", text)[0])


def numa_raise_blocker(topology, memory_policy):
    """Why raising max-allowable-numa-nodes to the node's count is not safe here, or None."""
    if memory_policy == "Static":
        # pkg/kubelet/cm/memorymanager/policy_static.go calculateHints iterates every subset of all NUMA nodes
        # (bitmask.IterateBitMasks) at each admission; the CPU Manager iterates only CPU-bearing nodes and, in v1.36.3,
        # the Device Manager only the nodes its devices are on (devicemanager/topology_hints.go).
        return ("memoryManagerPolicy Static computes its hints over every subset of all %d NUMA nodes at each pod "
                "admission (pkg/kubelet/cm/memorymanager/policy_static.go), the state explosion the limit of %d guards "
                "against" % (len(topology["nodes"]), DEFAULT_MAX_NUMA_NODES))
    if topology["nodes"][-1] >= NUMA_MASK_BITS:
        return ("NUMA node %d: the Topology Manager's NUMA masks hold node ids 0-%d only "
                "(pkg/kubelet/cm/topologymanager/bitmask/bitmask.go)" % (topology["nodes"][-1], NUMA_MASK_BITS - 1))
    return None


def refuse_locked_options_gate(desired):
    """The TopologyManagerPolicyOptions feature gate is GA and locked to true from v1.32 (pkg/features/kube_features.go;
    the alpha and beta option gates guard no option at v1.36): the kubelet refuses to be given false ("cannot set feature
    gate ... feature is locked to true", component-base featuregate/feature_gate.go) and does not start."""
    if (desired.get("featureGates") or {}).get("TopologyManagerPolicyOptions") is False:
        raise GpuhardenError("option settings.featureGates.TopologyManagerPolicyOptions=false: the feature gate is locked to "
                             "true since kubelet v1.32 and the kubelet does not start when it is set to false; leave it out")


def refuse_node_options(view, options, wanted):
    """Options the node's files or flags already hold, which the kubelet would refuse once a policy reads them."""
    for name, text in sorted(options.items()):
        why = topology_option_value(name, text)[1] if name not in wanted else None
        if why:
            raise GpuhardenError("%s.%s=%s (%s): %s; set it with option topology_manager_policy_options, or set "
                                 "topology_manager_policy none; nothing written"
                                 % (OPTIONS_FIELD, name, _show(text), _source_text(effective(view, (OPTIONS_FIELD, name))["source"]), why))


def refuse_missing_distances(options, topology):
    """prefer-closest-numa-nodes needs every node's distances: pkg/kubelet/cm/topologymanager/numa_info.go NewNUMAInfo
    fails with "error getting NUMA distances from cadvisor", and the kubelet exits."""
    if GO_BOOLS.get(str(options.get("prefer-closest-numa-nodes"))) == "true" and topology["without_distance"]:
        raise GpuhardenError("%s.prefer-closest-numa-nodes=true: NUMA node(s) %s have no distance file under %s, and the "
                             "kubelet does not start without their distances (pkg/kubelet/cm/topologymanager/numa_info.go); "
                             "nothing written" % (OPTIONS_FIELD, format_cpu_set(topology["without_distance"]), NUMA_NODE_DIR))


def _numa_nodes_text(topology):
    return "%d NUMA nodes (%d of them without CPUs, such as GPU memory)" % (len(topology["nodes"]), len(topology["cpu_less"]))


def numa_refusal(topology, policy, limit, blocker, memory_policy, current_policy):
    """The refused entry of a Topology Manager policy kept over the NUMA limit: what, why and the fix."""
    count = len(topology["nodes"])
    if blocker is None:
        fix = "set numa_over_limit=raise (max-allowable-numa-nodes becomes %d) or topology_manager_policy none" % count
    elif memory_policy == "Static":
        fix = ("set topology_manager_policy none on this node, or give topology_manager_policy_options "
               "max-allowable-numa-nodes=%d yourself if its admission cost is acceptable" % count)
    else:
        fix = "set topology_manager_policy none on this node"
    return {"what": "topologyManagerPolicy %s on %s" % (policy, _numa_nodes_text(topology)),
            "why": "the kubelet does not start with a policy other than none on more than max-allowable-numa-nodes=%d NUMA "
                   "nodes (pkg/kubelet/cm/topologymanager/topology_manager.go) and the limit is not raised: %s; the node "
                   "keeps its Topology Manager policy (%s)" % (limit, blocker or "option numa_over_limit=keep_policy", current_policy),
            "fix": fix}


# --------------------------------------------------------------------------------------------
# the plan


def _fix_token_flags(tokens, field, leaf_keys):
    """Rewrite a flag list (words) so it no longer sets ``field`` (or, for merged maps, the given keys)."""
    name = flag_for_field(field)
    out = []
    index = 0
    removed = []
    while index < len(tokens):
        word = tokens[index]
        index += 1
        body = word.lstrip("-") if word.startswith("-") and word != "-" else None
        if body is None:
            out.append(word)
            continue
        flag_name, has_value, value = body.partition("=")
        if flag_name.replace("_", "-") != name:
            out.append(word)
            if not has_value and flag_name.replace("_", "-") not in BOOL_FLAGS and index < len(tokens) \
                    and not tokens[index].startswith("--"):
                out.append(tokens[index])
                index += 1
            continue
        if not has_value and index < len(tokens):
            value = tokens[index]
            index += 1
        if field in MERGED_MAP_FIELDS and leaf_keys:
            kept = {key: val for key, val in parse_map_flag(value).items() if key not in leaf_keys}
            removed.append("--%s=%s" % (name, value))
            if kept:
                out.append("--%s=%s" % (name, ",".join("%s=%s" % item for item in kept.items())))
            continue
        removed.append("--%s=%s" % (name, value))
    return out, removed


class Planner:
    def __init__(self, reader, params, cgroup_version=None, run_command=None):
        self.reader = reader
        self.params = params
        self.cgroup_version = cgroup_version
        self.versions = DistributionVersion(reader.root, params.get("distribution_version"), run_command)
        self.envfile_edits = {}
        self.yaml_edits = {}
        self.reasons = {}
        self.refused = []
        # the durable route on kubeadm (route_through_config_dir): what it did, or why it was not taken
        self.route = None
        self.route_skipped = None

    def reason(self, path, text):
        self.reasons.setdefault(path, [])
        if text not in self.reasons[path]:
            self.reasons[path].append(text)

    def conflict(self, what, where, fix_possible=True):
        if self.params.get("on_flag_conflict", "fix") != "fix":
            raise GpuhardenError("%s in %s overrides the configuration file; with on_flag_conflict=fix it is removed "
                                 "there, or remove it yourself" % (what, where))
        if not fix_possible:
            raise GpuhardenError("%s in %s overrides the configuration file and cannot be fixed automatically; "
                                 "remove it from the unit and run again" % (what, where))

    def fix_flag(self, view, flag, field, leaf_keys, desired_text):
        origin = flag.origin
        what = "flag %s" % flag.text()
        if origin.kind == "envfile":
            self.conflict(what, origin.describe())
            env_file = self.envfile_edits.get(origin.path) or view["env_files"][origin.path]
            self.envfile_edits[origin.path] = env_file
            words, removed = _fix_token_flags(env_file.values[origin.variable].split(), field, leaf_keys)
            if not removed:
                return
            env_file.set(origin.variable, " ".join(words))
            self.reason(origin.path, "removed %s from %s: it overrode %s (now %s from the config file)"
                        % (", ".join(removed), origin.variable, field, desired_text))
        elif origin.kind == "rancher-config":
            self.conflict(what, origin.describe())
            loaded = self.yaml_edits.get(origin.path) or view["rancher_files"][origin.path]
            self.yaml_edits[origin.path] = loaded
            entries = loaded.doc[origin.variable]
            if entries[origin.index] is None:
                return
            words, removed = _fix_token_flags(["--" + str(entries[origin.index]).lstrip("-")], field, leaf_keys)
            if words:
                entries[origin.index] = words[0][2:]
            else:
                entries[origin.index] = None  # removed below, once all indexes are known
            loaded.modified = True
            self.reason(origin.path, "removed %s from %s: it overrode %s (now %s from the kubelet drop-in)"
                        % (", ".join(removed), origin.variable, field, desired_text))
        else:
            self.conflict(what, origin.describe(), fix_possible=False)

    def run(self):
        params = self.params
        desired = desired_config(params)
        if not desired:
            raise GpuhardenError("nothing to manage: set at least one of topology_manager_policy, topology_manager_scope, "
                                 "topology_manager_policy_options, cpu_manager_policy, reserved_system_cpus, "
                                 "memory_manager_policy, reserved_memory or settings")
        dropin_name = params.get("dropin_name") or "50-gpuharden.conf"
        if not DROPIN_RE.match(dropin_name) or dropin_name.startswith("00-"):
            _fail_option("dropin_name", dropin_name, "must be a file name ending in .conf that does not start with 00-")
        desired, self.refused = without_memory_qos_on_cgroup_v1(desired, self.cgroup_version)
        view = discover(self.reader, params.get("service") or "auto", params.get("flavor") or "auto", self.versions)
        self.numa_limit = self.plan_numa_limit(view, desired)
        managed = leaves(desired)
        before = {path: effective(view, path, value) for path, value in managed}
        self.reserved_cpus_before = effective(view, ("reservedSystemCPUs",))["value"]
        # what the configuration sets (None: the kubelet's default), read before the edits
        self.policies_set = {field: effective(view, (field,))["value"] for field in DEFAULTS}
        self.policies_before = {field: self.policies_set[field] or DEFAULTS[field] for field in DEFAULTS}

        if view["kubelet_args_only"]:
            # k3s/rke2 before v1.32: the values become kubelet-arg entries (no drop-in is read correctly there)
            self.plan_kubelet_args(view, desired)
            return self.finish(view, None, desired, managed, before)
        view = self.route_through_config_dir(view, managed, dropin_name)
        # 1. where the values go: the drop-in when the kubelet reads a drop-in directory, else the --config file
        if view["config_dir"]:
            target_path = "%s/%s" % (view["config_dir"], dropin_name)
            existing = [layer for layer in view["layers"] if layer.path == target_path]
            target = existing[0] if existing else KubeletConfigFile(target_path, new_dropin_text(target_path), True)
            target.created = not existing
        else:
            target = view["layers"][0]
            target.created = False
        assigned = [".".join(path) for path, value in managed if target.assign(path, value)]
        if assigned:
            self.reason(target.path, "sets %s" % ", ".join(assigned))
        # 2. later drop-ins that would override the target
        if target.dropin:
            target_rel = target.path[len(view["config_dir"]) + 1:]
            for layer in view["layers"]:
                if not layer.dropin or layer.path == target.path:
                    continue
                if layer.path[len(view["config_dir"]) + 1:] < target_rel:
                    continue
                for path, value in managed:
                    state, found = layer.lookup(path)
                    if state != "absent" and not (state == "set" and _same(found, value)):
                        self.conflict("%s: %s" % (".".join(path), _show(found)), "drop-in %s (sorts after %s)"
                                      % (layer.path, target_rel))
                        layer.remove_override(path)
                        self.yaml_edits[layer.path] = layer
                        self.reason(layer.path, "removed %s (%s): it overrode %s"
                                    % (".".join(path), _show(found), target.path))
        # 3. flags that override the file: fixed where they live (each flag once)
        conflicting = {}
        for path, value in managed:
            flag = before[path]["flag"]
            if flag is not None and not flag_agrees(before[path]["value"], value):
                conflicting.setdefault(path[0], set()).update(path[1:2])
        for field, keys in conflicting.items():
            merged = field in MERGED_MAP_FIELDS
            for each in [flag for flag in view["flags"] if flag.name == flag_for_field(field)]:
                if merged and not keys & set(parse_map_flag(each.value)):
                    continue
                self.fix_flag(view, each, field, keys if merged else None, _show(desired[field]))
        return self.finish(view, target, desired, managed, before)

    def plan_numa_limit(self, view, desired):
        """Where a Topology Manager policy other than none meets more NUMA nodes than max-allowable-numa-nodes, the
        kubelet v1.36.3 does not start (pkg/kubelet/cm/topologymanager/topology_manager.go NewManager: "unsupported on
        machines with more than %v NUMA Nodes").  Decided before anything is written, from the policy and options the
        kubelet would read after this plan: with option numa_over_limit=raise the option becomes the node's count
        (the kubelet then logs a warning, said in ``warning``), else, or where raising is not safe, the node keeps its
        Topology Manager policy and ``refused`` says why.  Options the kubelet would refuse are refused here."""
        refuse_locked_options_gate(desired)
        policy = desired.get("topologyManagerPolicy") or effective(view, ("topologyManagerPolicy",))["value"] or "none"
        wanted = desired.get(OPTIONS_FIELD) or {}
        options = dict(effective_map(view, OPTIONS_FIELD), **wanted)
        report = {"policy": policy, "nodes": None, "cpu_less_nodes": None, "source": None, "action": "policy_none",
                  "limit_before": None, "limit_after": None, "warning": None}
        if policy == "none":  # NewManager returns before it reads the options or counts
            return report
        refuse_node_options(view, options, wanted)
        limit = _numa_limit(options)
        report.update(limit_before=limit, limit_after=limit, action="within_limit")
        topology = numa_topology(self.reader)
        if topology is None:
            report.update(action="unknown", warning=(
                "could not count this node's NUMA nodes (no %s/node* directories, no CPU package ids under %s): the "
                "kubelet does not start with topologyManagerPolicy %s on more than %d" % (NUMA_NODE_DIR, CPU_DIR, policy, limit)))
            return report
        count = len(topology["nodes"])
        report.update(nodes=count, cpu_less_nodes=len(topology["cpu_less"]), source=topology["source"])
        refuse_missing_distances(options, topology)
        if count <= limit:
            return report
        if "max-allowable-numa-nodes" in wanted:
            raise GpuhardenError(
                "option topology_manager_policy_options: max-allowable-numa-nodes=%s is below this node's %d NUMA nodes "
                "(%s): the kubelet would not start with topologyManagerPolicy %s (pkg/kubelet/cm/topologymanager/"
                "topology_manager.go); give at least %d, or leave it out to let numa_over_limit decide; nothing written"
                % (wanted["max-allowable-numa-nodes"], count, topology["source"], policy, count))
        memory_policy = desired.get("memoryManagerPolicy") or effective(view, ("memoryManagerPolicy",))["value"]
        blocker = numa_raise_blocker(topology, memory_policy)
        if self.params.get("numa_over_limit", "raise") == "raise" and blocker is None:
            desired[OPTIONS_FIELD] = dict(wanted, **{"max-allowable-numa-nodes": str(count)})
            report.update(action="raised", limit_after=count, warning=(
                "this node has %s, more than max-allowable-numa-nodes=%d: topologyManagerPolicyOptions."
                "max-allowable-numa-nodes is set to %d, without which the kubelet does not start with topologyManagerPolicy "
                "%s; the kubelet logs a warning for any value above %d (pkg/kubelet/cm/topologymanager/policy_options.go), "
                "and kubelets before v1.31 do not know the option"
                % (_numa_nodes_text(topology), limit, count, policy, DEFAULT_MAX_NUMA_NODES)))
            return report
        desired.pop("topologyManagerPolicy", None)
        report["action"] = "kept"
        self.refused.append(numa_refusal(topology, policy, limit, blocker, memory_policy,
                                         effective(view, ("topologyManagerPolicy",))["value"]))
        return report

    def route_through_config_dir(self, view, managed, dropin_name):
        """kubeadm without --config-dir: the view with ``--config-dir=<kubeadm_config_dir>`` added to KUBELET_EXTRA_ARGS
        in the environment file that sets it (or the unit's last one besides kubeadm-flags.env), so that the values go
        to a drop-in kubeadm never rewrites (KUBEADM_CONFIG).  Taken only where the kubelet is v1.32 or later
        (CONFIG_DIR_SINCE; an older or unknown kubelet might not know the flag, and an unknown flag stops it), where
        the directory holds no drop-in the kubelet would start reading with it, and where discovering again shows the
        kubelet reading that directory.  Otherwise the view is unchanged and ``route_skipped`` says why."""
        directory = self.params.get("kubeadm_config_dir", KUBEADM_CONFIG_DIR)
        if directory and not directory.startswith("/"):
            _fail_option("kubeadm_config_dir", directory, "must be an absolute directory, or empty for never")
        if view["flavor"] != "kubeadm" or view["config_dir"] or not managed:
            return view
        if not directory:
            self.route_skipped = "option kubeadm_config_dir is empty"
            return view
        why = self.config_dir_obstacle(view, directory, dropin_name)
        if why is None:
            edited, why = self.add_config_dir_flag(view, directory)
            if edited is not None:
                routed = discover(self.reader.with_overlay({edited.path: edited.render()}), view["service"], view["flavor"],
                                  self.versions)
                if routed["config_dir"] == directory.rstrip("/"):
                    self.envfile_edits[edited.path] = edited
                    self.route = {"config_dir": routed["config_dir"], "file": edited.path, "variable": KUBEADM_EXTRA_ARGS,
                                  "kubelet_version": self.versions.found["version"]}
                    self.reason(edited.path, "adds --config-dir=%s to %s: the kubelet then reads gpuharden's drop-in "
                                "there, which kubeadm never rewrites" % (routed["config_dir"], KUBEADM_EXTRA_ARGS))
                    return routed
                why = ("--config-dir=%s in %s of %s would not reach the kubelet (ExecStart= in %s does not expand $%s, or "
                       "a later flag overrides it)" % (directory, KUBEADM_EXTRA_ARGS, edited.path, view["unit"]["path"],
                                                       KUBEADM_EXTRA_ARGS))
        self.route_skipped = why
        return view

    def config_dir_obstacle(self, view, directory, dropin_name):
        """Why the kubelet must not be given --config-dir=<directory> here, or None."""
        version, why = self.versions.kubelet(_exec_binary(view["unit"]))
        if version is None:
            return "cannot tell the kubelet's version (%s; option distribution_version gives it)" % why
        if version["minor"] < CONFIG_DIR_SINCE:
            return "kubelet %s: gpuharden adds --config-dir only from v1.32 (drop-ins merge correctly from there)" % version["version"]
        present = [rel for rel in self.reader.files_below(directory) if rel.endswith(".conf") and rel != dropin_name] \
            if self.reader.isdir(directory) else []
        if present:
            return ("%s already holds drop-ins the kubelet does not read yet (%s): --config-dir would apply them too"
                    % (directory, ", ".join(present)))
        return None

    def add_config_dir_flag(self, view, directory):
        """(the environment file with --config-dir added to KUBELET_EXTRA_ARGS, None) or (None, why not)."""
        env, _files = unit_environment(self.reader, view["unit"])
        _value, origin = env.get(KUBEADM_EXTRA_ARGS, (None, None))
        if origin is not None and origin.kind != "envfile":
            return None, "%s is set by %s, which gpuharden never edits" % (KUBEADM_EXTRA_ARGS, origin.describe())
        if origin is not None:
            path = origin.path
        else:
            files = [path for path, _optional, _unit_path in view["unit"]["environment_files"] if path != KUBEADM_FLAGS_ENV]
            if not files:
                return None, "the unit %s reads no environment file besides %s" % (view["unit"]["path"], KUBEADM_FLAGS_ENV)
            path = files[-1]
        if path == KUBEADM_FLAGS_ENV:
            return None, "%s comes from %s, which kubeadm writes" % (KUBEADM_EXTRA_ARGS, KUBEADM_FLAGS_ENV)
        text = self.reader.read(path)
        edited = EnvFile(path, text or "")
        edited.created = text is None
        flag = "--config-dir=%s" % directory.rstrip("/")
        if KUBEADM_EXTRA_ARGS in edited.values:
            try:
                edited.set(KUBEADM_EXTRA_ARGS, " ".join(edited.values[KUBEADM_EXTRA_ARGS].split() + [flag]))
            except GpuhardenError as error:
                return None, error.msg
        else:
            edited.add(KUBEADM_EXTRA_ARGS, flag)
        return edited, None

    def finish(self, view, target, desired, managed, before):
        if self.numa_limit["action"] == "raised":
            where = target.path if target is not None else view["kubelet_arg"]["target"][0]
            self.reason(where, "max-allowable-numa-nodes=%s: this node has %s NUMA nodes, more than the kubelet's default "
                               "limit of %d (the kubelet logs a warning above it)"
                        % (self.numa_limit["limit_after"], self.numa_limit["nodes"], DEFAULT_MAX_NUMA_NODES))
        changes = self.changes(view, target)
        after_reader = self.reader.with_overlay({change.node_path: change.after for change in changes})
        after_view = discover(after_reader, view["service"], view["flavor"], self.versions)
        after = {path: effective(after_view, path, value) for path, value in managed}
        for path, value in managed:
            if not effective_matches(after[path], value):  # pragma: no cover - a planner bug, never a silent write
                raise GpuhardenError("planned %s=%s but the kubelet would still read %s from %s"
                                     % (".".join(path), _show(value), _show(after[path]["value"]), after[path]["source"]))
        self.check_result(view, after_view, desired)
        persistence, why = self.persistence(view, managed, after, changes)
        result = self.result(view, after_view, managed, before, after, changes)
        result.update(persistence=persistence, persistence_reason=why, config_dir_route=self.route, refused=list(self.refused))
        if self.route:
            # the kubelet's flags change: restart it now, under the stage's health check and rollback, rather than meet
            # --config-dir first at the next restart (a kubeadm upgrade's)
            result["restart_required"] = True
        return refuse_unless_durable(result, self.params.get("require_durable"))

    def plan_kubelet_args(self, view, desired):
        """Set each managed field as kubelet-arg entries of the k3s/rke2 config file the distribution reads last."""
        flavor = view["flavor"]
        version = view["version"]["version"]
        if view["kubelet_arg"]["exec"]:
            raise GpuhardenError("%s %s reads kubelet settings only from kubelet-arg, and this unit passes --kubelet-arg "
                                 "in ExecStart= (%s), which beats the config files and is never edited; move them to %s"
                                 % (flavor, version, view["unit"]["path"], RANCHER[flavor]["config"]))
        target_path, target_key = view["kubelet_arg"]["target"]
        for field, value in desired.items():
            if field in FLAGLESS_FIELDS:
                raise GpuhardenError("%s: %s %s reads kubelet settings only from kubelet-arg flags (no drop-in "
                                     "directory before v1.32), and the kubelet has no flag for it; upgrade %s to "
                                     "v1.32 or later" % (field, flavor, version, flavor))
            name = flag_for_field(field)
            words = ["%s=%s" % (name, text) for text in self.flag_values(view, field, value)]
            self.set_kubelet_arg(view, name, words, target_path, target_key, field)

    def flag_values(self, view, field, value):
        """The text of each occurrence of ``field``'s flag that gives it ``value`` (maps keep the other keys)."""
        if field == "reservedMemory":
            return ["%d:%s" % (entry["numaNode"], ",".join("%s=%s" % item for item in entry["limits"].items()))
                    for entry in value]
        if isinstance(value, dict):
            found = [flag for flag in view["flags"] if flag.name == flag_for_field(field)]
            merged = dict(flag_map(found, field), **{key: _flag_text(item) for key, item in value.items()})
            separator = "<" if field in LANGLE_MAP_FIELDS else "="
            pairs = ["%s%s%s" % (key, separator, item) for key, item in merged.items()]
            return pairs if field in NOSPLIT_MAP_FIELDS else [",".join(pairs)]
        if isinstance(value, list):
            return [",".join(_flag_text(item) for item in value)]
        return [_flag_text(value)]

    def set_kubelet_arg(self, view, name, words, target_path, target_key, field):
        files = view["rancher_files"]
        current = [(path, key, entry) for path, loaded in files.items() for key in ("kubelet-arg", "kubelet-arg+")
                   if isinstance(loaded.doc.get(key), list) for entry in loaded.doc[key] if _arg_name(entry) == name]
        if [entry.lstrip("-") for _path, _key, entry in current] == words and \
                all((path, key) == (target_path, target_key) for path, key, _entry in current):
            return
        if target_path not in files:
            loaded = YamlFile(target_path, "", "%s config file" % view["flavor"])
            loaded.created = True
            files[target_path] = loaded
        for path, loaded in files.items():
            for key in ("kubelet-arg", "kubelet-arg+"):
                entries = loaded.doc.get(key)
                if (path, key) == (target_path, target_key) and not isinstance(entries, list):
                    loaded.doc[key] = entries = []
                if not isinstance(entries, list):
                    continue
                positions = [index for index, entry in enumerate(entries) if _arg_name(entry) == name]
                is_target = (path, key) == (target_path, target_key)
                if not positions and not is_target:
                    continue
                at = positions[0] if positions else len(entries)
                for index in reversed(positions):
                    del entries[index]
                if is_target:
                    for offset, word in enumerate(words):
                        entries.insert(at + offset, word)
                loaded.modified = True
                self.yaml_edits[path] = loaded
                self.reason(path, ("sets %s in %s" % (", ".join(words), key)) if is_target
                            else "removed --%s from %s: %s now sets %s" % (name, key, target_path, field))

    def persistence(self, view, managed, after, changes):
        """("durable" | "reverts_on_kubeadm_upgrade", why): whether the managed values outlive the distribution's
        own rewrites of its files."""
        if view["flavor"] != "kubeadm":
            where = "kubelet-arg in %s" % view["kubelet_arg"]["target"][0] if view["kubelet_args_only"] else \
                "the drop-in directory %s" % view["config_dir"]
            return "durable", "%s never rewrites %s or its config files" % (view["flavor"], where)
        in_config = sorted(".".join(path) for path, _value in managed
                           if after[path]["source"].get("kind") == "file" and after[path]["source"].get("path") == KUBEADM_CONFIG)
        if in_config:
            why = ("%s come from %s, which `kubeadm upgrade node` rewrites from the kube-system/kubelet-config ConfigMap "
                   "(they last only if the ConfigMap carries them too)" % (", ".join(in_config), KUBEADM_CONFIG))
            if not view["config_dir"]:
                why += ("; the kubelet reads no --config-dir and gpuharden added none: %s. The fix: a kubelet v1.32 or "
                        "later (or option distribution_version naming it), or --config-dir=%s in %s yourself, then run "
                        "again" % (self.route_skipped or "no drop-in directory", KUBEADM_CONFIG_DIR, KUBEADM_EXTRA_ARGS))
            return "reverts_on_kubeadm_upgrade", why
        if self.route:
            where = ("the drop-in directory %s, which the kubelet reads through --config-dir in %s of %s (files kubeadm "
                     "never writes)" % (self.route["config_dir"], self.route["variable"], self.route["file"]))
        elif view["config_dir"]:
            where = "the drop-in directory %s" % view["config_dir"]
        else:
            where = "files kubeadm does not manage"
        why = "the values live in %s and flags kubeadm does not rewrite" % where
        if any(change.node_path == KUBEADM_FLAGS_ENV and change.changed for change in changes):
            why += ("; a flag removed from %s stays removed through `kubeadm upgrade node`, which rewrites that file only "
                    "from its own content, but `kubeadm join` writes it anew from nodeRegistration.kubeletExtraArgs: "
                    "remove it there too" % KUBEADM_FLAGS_ENV)
        return "durable", why

    def changes(self, view, target):
        changes = []
        edited = {target.path: target} if target is not None and target.modified else {}
        edited.update(self.yaml_edits)
        for path, loaded in sorted(edited.items()):
            for key in ("kubelet-arg", "kubelet-arg+"):
                if isinstance(loaded.doc, dict) and isinstance(loaded.doc.get(key), list):
                    entries = loaded.doc[key]
                    for index in reversed(range(len(entries))):
                        if entries[index] is None:
                            del entries[index]
            after = loaded.render()
            before = None if getattr(loaded, "created", False) else loaded.text
            if before != after:
                changes.append(self.change(path, before, after))
        for path, env_file in sorted(self.envfile_edits.items()):
            if env_file.render() != env_file.text:
                changes.append(self.change(path, None if getattr(env_file, "created", False) else env_file.text,
                                           env_file.render()))
        return changes

    def change(self, node_path, before, after, reason=None):
        change = _files.FileChange(self.reader.path(node_path), before, after, mode=0o644,
                                   reason=reason or "; ".join(self.reasons.get(node_path, [])))
        change.node_path = node_path
        return change

    def check_result(self, view, after_view, desired):
        self.check_reserved_cpus_online(after_view)
        self.check_numa_limit(after_view)
        cpu = effective(after_view, ("cpuManagerPolicy",))["value"]
        if cpu == "static":
            reserved = effective(after_view, ("reservedSystemCPUs",))["value"]
            kube_cpu = effective(after_view, ("kubeReserved", "cpu"))["value"]
            system_cpu = effective(after_view, ("systemReserved", "cpu"))["value"]
            if not reserved and not kube_cpu and not system_cpu:
                raise GpuhardenError("cpuManagerPolicy static without reserved CPUs: the kubelet refuses to start; set "
                                     "reserved_system_cpus (or kubeReserved/systemReserved cpu in settings)")
        memory = effective(after_view, ("memoryManagerPolicy",))["value"]
        if memory == "Static" and not effective(after_view, ("reservedMemory",))["value"]:
            raise GpuhardenError("memoryManagerPolicy Static without reservedMemory: the kubelet refuses to start; set "
                                 "reserved_memory (one entry per NUMA node)")
        if memory == "Static":
            self.check_reserved_memory(after_view)

    def check_numa_limit(self, after_view):
        """What plan_numa_limit decided, on the files the kubelet would read after the change: a policy other than none
        within max-allowable-numa-nodes, or nothing written.  A kept policy was reported there instead."""
        report = self.numa_limit
        if report["nodes"] is None or report["action"] == "kept":
            return
        policy = effective(after_view, ("topologyManagerPolicy",))["value"] or "none"
        limit = _numa_limit(effective_map(after_view, "topologyManagerPolicyOptions"))
        if policy != "none" and report["nodes"] > limit:  # pragma: no cover - a planner bug, never a silent write
            raise GpuhardenError("planned topologyManagerPolicy %s on %s NUMA nodes, but the kubelet would read "
                                 "max-allowable-numa-nodes=%s and not start; nothing written" % (policy, report["nodes"], limit))

    def check_reserved_cpus_online(self, view):
        """reservedSystemCPUs must be CPUs the node has, whatever the CPU Manager policy, or the kubelet exits at start
        with "reserved-cpus: X is not a subset of online-cpus: Y" (kubernetes/kubernetes cmd/kubelet/app/server.go
        getReservedCPUs, against the CPU topology cadvisor discovers; measured with the real kubelet v1.36.3, which
        then left the node without a kubelet until the role's rollback).  The node's online CPUs are read from
        sysfs; where that file is missing nothing is judged.  Checked before anything is written."""
        entry = effective(view, ("reservedSystemCPUs",))
        reserved = entry["value"]
        online_text = (self.reader.read(ONLINE_CPUS) or "").strip()
        # only what this plan would set: a node already running on a bad value is the audit's to report, not a refusal
        if not reserved or not online_text or reserved == getattr(self, "reserved_cpus_before", None):
            return
        online, wanted = cpu_set(online_text), cpu_set(str(reserved))
        if not wanted <= online:
            raise GpuhardenError("reservedSystemCPUs %s (from %s) names CPU(s) %s that the node does not have: its online CPUs "
                                 "are %s (%s); the kubelet would refuse to start (reserved-cpus is not a subset of "
                                 "online-cpus); nothing written"
                                 % (reserved, entry["source"], format_cpu_set(wanted - online), online_text, ONLINE_CPUS))

    def check_reserved_memory(self, view):
        """Memory Manager Static: for memory and each hugepages size, the reservedMemory limits over all NUMA nodes
        must equal kubeReserved + systemReserved (+ the evictionHard memory.available threshold for memory), or the
        kubelet refuses to start (kubernetes/kubernetes pkg/kubelet/cm/memorymanager/memory_manager.go
        validateReservedMemory; the reservation is GetNodeAllocatableReservation in pkg/kubelet/cm, the eviction
        part hardEvictionReservation).  Checked on the values the kubelet would read after the change."""
        reserved = {}
        for entry in effective(view, ("reservedMemory",))["value"] or []:
            for name, quantity in (entry.get("limits") or {}).items():
                where = "reservedMemory[numaNode=%s].limits.%s" % (entry.get("numaNode"), name)
                reserved[name] = reserved.get(name, 0) + _quantity(where, quantity)
        kube, system = effective_map(view, "kubeReserved"), effective_map(view, "systemReserved")
        eviction_text, eviction_source = eviction_memory(view)
        types = {name for name in list(reserved) + list(kube) + list(system)
                 if name == "memory" or name.startswith("hugepages-")} | {"memory"}
        for name in sorted(types):
            parts = [("kubeReserved.%s" % name, kube.get(name)), ("systemReserved.%s" % name, system.get(name))]
            if name == "memory":
                parts.append(("evictionHard memory.available (%s)" % eviction_source, eviction_text))
            wanted = 0
            for label, text in parts:
                if text is not None:
                    wanted += self.eviction_bytes(text) if label.startswith("evictionHard") else _quantity(label, text)
            have = reserved.get(name, 0)
            if have != wanted:
                raise GpuhardenError(
                    "memoryManagerPolicy Static: reservedMemory reserves %s=%s over all NUMA nodes, but %s = %s; the "
                    "kubelet refuses to start unless they are equal (pkg/kubelet/cm/memorymanager/memory_manager.go): "
                    "make reserved_memory add up to %s or change the reservations; nothing written"
                    % (name, _show_bytes(have), " + ".join("%s %s" % (label, text if text is not None else "(unset: 0)")
                                                           for label, text in parts), _show_bytes(wanted), _show_bytes(wanted)))

    def eviction_bytes(self, text):
        if not str(text).endswith("%"):
            return _quantity("evictionHard memory.available", text)
        # A percentage of the node's memory capacity (cadvisor: MemTotal), computed as the kubelet does: the
        # percentage is a float32 (pkg/kubelet/eviction/helpers.go parsePercentage, api GetThresholdQuantity).
        meminfo = self.reader.read("/proc/meminfo") or ""
        match = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.M)
        if not match:
            raise GpuhardenError("evictionHard memory.available=%s is a percentage and /proc/meminfo has no MemTotal: "
                                 "cannot check the Memory Manager reservation; give it as a quantity" % text)
        try:
            percent = _float32(_float32(float(str(text)[:-1])) / 100)
        except ValueError:
            raise GpuhardenError("evictionHard memory.available=%s is not a percentage" % text) from None
        return int(int(match.group(1)) * 1024 * percent)

    def stale_state(self, view, after_view):
        """Checkpoints the kubelet would refuse after the change (kubelet pkg/kubelet/cm/cpumanager/state/state_checkpoint.go
        and memorymanager/state: the checkpoint's policyName must equal the configured policy).  ``stale_before``: it
        was refused by the configuration before the change too (the node's kubelet was already failing on it).  The policies
        before come from ``policies_before``, read before the edits (the view's layers are edited in place)."""
        stale = []
        for name, field in ((CPU_STATE, "cpuManagerPolicy"), (MEMORY_STATE, "memoryManagerPolicy")):
            path = "%s/%s" % (after_view["root_dir"].rstrip("/"), name)
            text = self.reader.read(path)
            if text is None:
                continue
            policy = effective(after_view, (field,))["value"] or DEFAULTS[field]
            policy_before = getattr(self, "policies_before", {}).get(field, policy)
            try:
                # the kubelet reads its checkpoint with Go's encoding/json: the last of two equal keys wins
                checkpoint = _safe_parse.json_load(text, path, what="checkpoint", duplicate_keys=False)
                have = checkpoint.get("policyName", "") if isinstance(checkpoint, dict) else None
            except GpuhardenError:
                have = None
            if have != policy:
                stale.append({"path": path, "policy": have, "configured_policy": policy, "stale_before": have != policy_before,
                              "reason": "unreadable checkpoint" if have is None else
                              "checkpoint policy %s differs from configured policy %s" % (have, policy)})
        return stale

    def result(self, view, after_view, managed, before, after, changes):
        stale = self.stale_state(view, after_view)
        if self.params.get("remove_stale_state"):
            for entry in stale:
                change = self.change(entry["path"], self.reader.read(entry["path"]), None,
                                     reason="stale checkpoint: " + entry["reason"])
                # One the configuration before this change refused too: the uninstall must never bring it back.
                change.restorable = not entry["stale_before"]
                changes.append(change)

        def policy_after(field):
            return effective(after_view, (field,))["value"] or DEFAULTS[field]

        sources = {}
        for path, _value in managed:
            sources[".".join(path)] = {
                "before": before[path]["value"], "after": after[path]["value"],
                "source_before": before[path]["source"], "source_after": after[path]["source"],
            }
        # A restart only matters when what the kubelet reads changes (a flag that already carries the value,
        # or a file value shadowed by it, changes nothing effective) or a stale checkpoint must go.
        effective_change = any(not _same_effective(before[path], after[path]) for path, _value in managed)
        return {
            "changes": changes,
            "service": view["service"],
            "flavor": view["flavor"],
            "sources": sources,
            "config_file": view["config"],
            "config_dir": view["config_dir"],
            "policies_set": dict(self.policies_set),
            "cpu_manager_policy_changed": self.policies_before["cpuManagerPolicy"] != policy_after("cpuManagerPolicy"),
            "memory_manager_policy_changed":
                self.policies_before["memoryManagerPolicy"] != policy_after("memoryManagerPolicy"),
            "stale_state_files": stale,
            "restart_required": effective_change or bool(stale),
            "effective_changed": effective_change,
            "distribution_version": (view["version"] or {}).get("version"),
            "kubelet_args_only": view["kubelet_args_only"],
            "numa_limit": dict(self.numa_limit),
            "refused": [dict(entry) for entry in self.refused],
        }


def plan(reader, params, cgroup_version=None, run_command=None):
    """The whole plan: {changes: [FileChange], service, flavor, sources, stale_state_files, ...}."""
    return Planner(reader, params, cgroup_version, run_command).run()


def _same_effective(before, after):
    if before["flag"] is not None:
        return flag_agrees(before["value"], after["value"])
    if after["flag"] is not None:
        return flag_agrees(after["value"], before["value"])
    return _same(before["value"], after["value"])


def _float32(value):
    return struct.unpack("f", struct.pack("f", value))[0]


def _quantity(label, text):
    """A Kubernetes quantity as an exact number (bytes for memory)."""
    match = QUANTITY_PARTS_RE.match(str(text).strip())
    if not match:
        raise GpuhardenError("%s=%s is not a Kubernetes quantity" % (label, text))
    number = Fraction(match.group(1))
    if match.group(2):
        return number * Fraction(10) ** int(match.group(2)[1:])
    return number * QUANTITY_SUFFIX[match.group(3)]


def _show_bytes(value):
    for suffix, size in (("Gi", 2 ** 30), ("Mi", 2 ** 20), ("Ki", 2 ** 10)):
        if value and value % size == 0:
            return "%d%s" % (value // size, suffix)
    return str(int(value)) if value == int(value) else str(float(value))


def effective_map(view, field):
    """A map field as the kubelet reads it: the --config file, drop-ins merged key by key (JSON merge patch,
    null removes), then the flag (replacing the map, or merged into it for featureGates)."""
    merged = {}
    for layer in view["layers"]:
        state, found = layer.lookup((field,))
        if state == "unset":
            merged = {}
        elif state == "set" and isinstance(found, dict):
            if not layer.dropin:
                merged = {}
            for key, item in found.items():
                if item is None:
                    merged.pop(str(key), None)
                else:
                    merged[str(key)] = _plain(item)
    found = [flag for flag in view["flags"] if flag.name == flag_for_field(field)]
    if found:
        flags = flag_map(found, field)
        merged = dict(merged, **flags) if field in MERGED_MAP_FIELDS else flags
    return merged


def eviction_memory(view):
    """(threshold text or None, where it comes from) of evictionHard memory.available.

    The kubelet uses its default (100Mi) only when the --config file sets no evictionHard map at all, or with
    mergeDefaultEvictionSettings (cmd/kubelet/app/server.go loadConfigFile); drop-ins merge key by key over that;
    a --eviction-hard flag replaces the whole map."""
    base_sets = False
    merge_defaults = False
    for layer in view["layers"]:
        if not layer.dropin:
            state, _found = layer.lookup(("evictionHard",))
            base_sets = state == "set"
            merge_defaults = layer.lookup(("mergeDefaultEvictionSettings",)) == ("set", True)
    flags = [flag for flag in view["flags"] if flag.name == "eviction-hard"]
    if flags:
        origin = flags[-1].origin
        where = "flag %s, %s" % (flags[-1].text(), origin.describe())
        return flag_map(flags, "evictionHard").get("memory.available"), where
    merged = effective_map(view, "evictionHard")
    if "memory.available" in merged:
        return merged["memory.available"], "the kubelet configuration files"
    if not base_sets or merge_defaults:
        return DEFAULT_EVICTION_MEMORY, "the kubelet's default"
    return None, "not set: the --config file's evictionHard has no memory.available"


def _flag_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(_plain(value))


# ---------------------------------------------------------------------------------------------
# What is left out, or refused, and what a kubeadm upgrade would undo

MEMORY_QOS_GATE = "featureGates.MemoryQoS"
MEMORY_QOS_FIX = ("set cgroup_limits_memory_qos_feature_gate=false for this node (role gpuharden.k8s.cgroup_limits; for "
                  "module kubelet_config: leave featureGates.MemoryQoS out of settings), or move the node to cgroup v2 "
                  "(systemd.unified_cgroup_hierarchy=1 on the kernel command line, then reboot)")


def without_memory_qos_on_cgroup_v1(desired, cgroup_version):
    """(desired, refused): on a node whose memory controller is on cgroup v1 (or hybrid), featureGates.MemoryQoS=true
    is left out, with memoryReservationPolicy (the kubelet refuses TieredReservation without the gate: kubernetes v1.36.3
    pkg/kubelet/apis/config/validation/validation.go), and named in ``refused``; every other setting stays.  The kubelet
    applies MemoryQoS only on the unified hierarchy (pkg/kubelet/cm/pod_container_manager_linux.go) and on cgroup v1
    only logs "MemoryQoS feature only works with cgroups v2" (cmd/kubelet/app/server.go), so the gate would protect
    nothing there; memoryThrottlingFactor is kept, as the kubelet only range-checks it without MemoryQoS."""
    gates = desired.get("featureGates") or {}
    if cgroup_version not in (1, "hybrid") or gates.get("MemoryQoS") is not True:
        return desired, []
    kept = dict(desired)
    others = {name: value for name, value in gates.items() if name != "MemoryQoS"}
    if others:
        kept["featureGates"] = others
    else:
        del kept["featureGates"]
    left_out = [MEMORY_QOS_GATE + "=true"]
    if kept.get("memoryReservationPolicy", "None") != "None":
        left_out.append("memoryReservationPolicy=%s" % kept.pop("memoryReservationPolicy"))
    why = ("this node's memory controller is on cgroup v%s, and the kubelet applies MemoryQoS (memory.high, memory.min) "
           "only on cgroup v2: left out, so nothing claims a protection the node cannot give; the other kubelet settings are "
           "still written" % ("1 (hybrid hierarchy)" if cgroup_version == "hybrid" else "1"))
    return kept, [{"what": ", ".join(left_out), "why": why, "fix": MEMORY_QOS_FIX}]


def refuse_unless_durable(plan, require_durable):
    """The plan as the stage runs it: with option require_durable and settings that would not outlast a kubeadm upgrade,
    nothing is written nor restarted and ``refused`` says why (node_audit keeps the whole plan for its findings)."""
    if not require_durable or plan["persistence"] == "durable":
        return plan
    entry = {"what": "the kubelet settings (%s)" % ", ".join(sorted(plan["sources"])),
             "why": "require_durable: they would not outlast `kubeadm upgrade node`: %s" % plan["persistence_reason"],
             "fix": "make the kubelet read a --config-dir (the reason says how), or set require_durable=false (role "
                    "gpuharden.k8s.kubelet_topology: kubelet_topology_require_durable=false) to write them where a kubeadm "
                    "upgrade reverts them"}
    return dict(plan, changes=[], restart_required=False, effective_changed=False, cpu_manager_policy_changed=False,
                memory_manager_policy_changed=False, stale_state_files=[], refused=plan["refused"] + [entry])


def kubeadm_upgrade_reverts(plan):
    """What `kubeadm upgrade node` would undo on a kubeadm node (it rewrites config.yaml from the kubelet-config ConfigMap,
    KUBEADM_CONFIG), or None: {fields, values, stops_kubelet, fixed_by_plan}.  The managed fields that live in
    config.yaml after the plan, or, when the plan moves them to a drop-in, those that live there now (``fixed_by_plan``).
    ``stops_kubelet``: the CPU or Memory Manager policies among them set to another than the kubelet's default.  The
    kubelet writes its checkpoint under the policy it runs (cpu_manager_state, memory_manager_state), and a revert to the
    ConfigMap's policy (the default, unless the ConfigMap sets the same) makes it refuse to start: "could not restore
    state from checkpoint ... configured policy differs" (kubernetes v1.36.3 pkg/kubelet/cm/cpumanager/state/
    state_checkpoint.go, memorymanager/state/state_checkpoint.go)."""
    if plan.get("flavor") != "kubeadm":
        return None
    sources = plan["sources"]

    def in_config(when):
        return sorted(field for field, source in sources.items()
                      if source["source_" + when].get("kind") == "file" and source["source_" + when].get("path") == KUBEADM_CONFIG)

    fields, when = in_config("after"), "after"
    if not fields:
        fields, when = in_config("before"), "before"
    if not fields:
        return None
    values = {field: sources[field][when] for field in fields}
    stops = [field for field in fields if field in ("cpuManagerPolicy", "memoryManagerPolicy")
             and values[field] not in (None, DEFAULTS[field])]
    return {"fields": fields, "values": values, "stops_kubelet": stops, "fixed_by_plan": when == "before"}


# ---------------------------------------------------------------------------------------------
# Options and the whole decision, shared by kubelet_config and node_audit


def argument_spec():
    return {
        "topology_manager_policy": {"type": "str", "choices": list(TOPOLOGY_POLICIES)},
        "topology_manager_scope": {"type": "str", "choices": list(TOPOLOGY_SCOPES)},
        "topology_manager_policy_options": {"type": "dict"},
        "cpu_manager_policy": {"type": "str", "choices": list(CPU_POLICIES)},
        "reserved_system_cpus": {"type": "str"},
        "memory_manager_policy": {"type": "str", "choices": list(MEMORY_POLICIES)},
        "reserved_memory": {"type": "list", "elements": "dict", "options": {
            "numaNode": {"type": "int", "required": True},
            "limits": {"type": "dict", "required": True},
        }},
        "settings": {"type": "dict", "default": {}},
        "flavor": {"type": "str", "choices": ["auto"] + list(FLAVORS), "default": "auto"},
        "service": {"type": "str", "default": "auto"},
        "on_flag_conflict": {"type": "str", "choices": ["fix", "fail"], "default": "fix"},
        "dropin_name": {"type": "str", "default": "50-gpuharden.conf"},
        "remove_stale_state": {"type": "bool", "default": False},
        "distribution_version": {"type": "str"},
        "require_durable": {"type": "bool", "default": False},
        "numa_over_limit": {"type": "str", "choices": list(NUMA_OVER_LIMIT), "default": "raise"},
        "kubeadm_config_dir": {"type": "str", "default": KUBEADM_CONFIG_DIR},
        "backup": {"type": "bool", "default": False},
        "root": {"type": "path", "default": "/"},
    }


def decide(params, run_command=None):
    """Read the node as the kubelet would and plan (nothing changes here).  ``run_command(argv) -> (rc, out, err)``
    asks k3s/rke2 for its version when option distribution_version is not given."""
    root = params["root"]
    if not os.path.isdir(root):
        raise GpuhardenError("kubelet_config: option root=%s is not a directory" % root)
    return plan(NodeReader(root), params, cgroup_version=_host.cgroup_version(root), run_command=run_command)
