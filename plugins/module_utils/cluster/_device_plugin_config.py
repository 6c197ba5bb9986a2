# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The NVIDIA device plugin's config file read as the plugin reads it, per release (pure functions): which keys it
reads, which it ignores, and every config it refuses at start (it exits 1, so its pod crash-loops).

Read from NVIDIA/k8s-device-plugin v0.15.0, v0.18.2 and v0.20.0 (the minors between checked for the keys they
add), and the decoders they use; ``tests/real/device_plugin.py`` REFUSED_CONFIGS runs the real v0.15.0 and v0.18.2
binaries on each case this module predicts.

- Parsing (api/config/v1/config.go parseConfigFrom): sigs.k8s.io/yaml (v1.4.0; v1.6.0 from 0.20) turns the YAML 1.1
  document into JSON and encoding/json decodes it, not strictly: an unknown key is ignored without a word, and the
  keys of a struct (the document, ``flags``, ``flags.plugin``, ``flags.gfd``, ``resources``, ``sharing``, ``imex``)
  match case-insensitively (``MigStrategy`` is ``migStrategy``; of two spellings of one key the one that sorts
  last wins, as encoding/json reads the keys in the order json.Marshal wrote them).  A YAML number or boolean
  becomes text only for ``version`` (``version: 1`` is "1", see TEXT); anything else of the wrong type is refused
  (``migStrategy: no`` is the boolean false).  ``version`` must be ``v1`` (empty means v1).
- The types with their own decoder read their keys from a map, exact case only, and refuse what they cannot take
  (api/config/v1/replicas.go, resources.go, flags.go deviceListStrategyFlag, duration.go): ``sharing.timeSlicing``
  and ``sharing.mps`` need ``resources``, each with ``name`` and an integer ``replicas`` of at least 2, ``devices``
  "all", a positive count or a list of indices / UUIDs; ``resources.gpus`` / ``resources.mig`` entries need
  ``pattern`` and ``name``; a resource name is prefixed with ``nvidia.com/`` unless it has it, and must then be a
  DNS subdomain of at most 63 characters in all.
- Then the settings (cmd/nvidia-device-plugin/main.go validateFlags; before 0.17 the MIG strategy is checked in
  plugin-manager.go NewPluginManager), each from its flag or environment variable when set, else the file
  (api/config/v1/flags.go updateFromCLIFlag): device list strategies, device ID strategy, shared-devices allocation
  policy (0.20), MPS (not with migStrategy mixed, and only with an MPS root), device discovery strategy (0.16), MIG
  strategy, IMEX channel IDs (0.17, [] or [0]).  A boolean environment variable that strconv.ParseBool does not
  take stops the command line parser first (urfave/cli v2 flag_bool.go).
"""

from __future__ import annotations

import difflib
import json
import math
import re

V15, V16, V17, V18, V20 = (0, 15, 0), (0, 16, 0), (0, 17, 0), (0, 18, 0), (0, 20, 0)
NEWEST_KNOWN = V20
RESOURCE_DOMAIN = "nvidia.com"
MAX_RESOURCE_NAME = 63  # api/config/v1/consts.go MaxResourceNameLength
MIG_STRATEGIES = ("none", "single", "mixed")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_ID_STRATEGIES = ("uuid", "index")
DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")
ALLOCATION_POLICIES = ("distributed", "packed")

# The findings a refusal becomes (the audit builds them from each refusal's ``ident``; all in the device_plugin group of
# the findings catalogue).
FINDING_IDS = ("plugin_config_invalid", "plugin_resource_name_invalid", "plugin_device_list_strategy_invalid",
               "plugin_device_id_strategy_invalid", "plugin_mps_invalid", "plugin_mig_strategy_invalid")

# Kinds of value, as the plugin's Go types decode them.
STRING, TEXT, BOOL, STRATEGIES, DURATION, INTS, STRUCT, RESOURCES, REPLICATED = (
    "string", "text", "bool", "strategies", "duration", "ints", "struct", "resources", "replicated")


def _fields(*entries):
    """{key: (kind, first release that reads it, the fields of a STRUCT)}."""
    return {key: (kind, since, children) for key, kind, since, children in entries}


PLUGIN_FLAGS = _fields(
    ("passDeviceSpecs", BOOL, V15, None), ("deviceListStrategy", STRATEGIES, V15, None), ("deviceIDStrategy", STRING, V15, None),
    ("cdiAnnotationPrefix", STRING, V15, None), ("nvidiaCTKPath", STRING, V15, None), ("containerDriverRoot", STRING, V15, None),
    ("sharedDevicesAllocationPolicy", STRING, V20, None))
GFD_FLAGS = _fields(
    ("oneshot", BOOL, V15, None), ("noTimestamp", BOOL, V15, None), ("sleepInterval", DURATION, V15, None),
    ("outputFile", STRING, V15, None), ("machineTypeFile", STRING, V15, None))
FLAGS = _fields(
    ("migStrategy", STRING, V15, None), ("failOnInitError", BOOL, V15, None), ("mpsRoot", STRING, V15, None),
    ("nvidiaDriverRoot", STRING, V15, None), ("nvidiaDevRoot", STRING, V16, None), ("gdrcopyEnabled", BOOL, V18, None),
    ("gdsEnabled", BOOL, V15, None), ("mofedEnabled", BOOL, V15, None), ("useNodeFeatureAPI", BOOL, V15, None),
    ("deviceDiscoveryStrategy", STRING, V16, None), ("plugin", STRUCT, V15, PLUGIN_FLAGS), ("gfd", STRUCT, V15, GFD_FLAGS))
# TEXT: a string field that sigs.k8s.io/yaml feeds a YAML number or boolean as its text (version: 1 is "1").  It does
# so only for a field it finds by the key: the fields of ``flags`` are promoted from the embedded CommandLineFlags,
# which its converter does not follow (yaml.go convertToJSONableObject takes the field's first index), so there a
# number or boolean reaches encoding/json as one and a string field refuses it (pinned by the real binaries).
DOCUMENT = _fields(
    ("version", TEXT, V15, None), ("flags", STRUCT, V15, FLAGS),
    ("resources", STRUCT, V15, _fields(("gpus", RESOURCES, V15, None), ("mig", RESOURCES, V15, None))),
    ("sharing", STRUCT, V15, _fields(("timeSlicing", REPLICATED, V15, None), ("mps", REPLICATED, V15, None))),
    ("imex", STRUCT, V17, _fields(("channelIDs", INTS, V17, None), ("required", BOOL, V17, None))))
# Keys of the types that decode themselves (exact case): api/config/v1/replicas.go, resources.go.
REPLICATED_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
REPLICATED_RESOURCE_KEYS = ("name", "rename", "devices", "replicas")
RESOURCE_KEYS = ("pattern", "name")

# The settings a flag or an environment variable overrides (cmd/nvidia-device-plugin/main.go): config path ->
# (flag, environment variables, first release with it, comma-separated list).
OVERRIDES = {
    "flags.migStrategy": ("mig-strategy", ("MIG_STRATEGY",), V15, False),
    "flags.mpsRoot": ("mps-root", ("MPS_ROOT",), V15, False),
    "flags.deviceDiscoveryStrategy": ("device-discovery-strategy", ("DEVICE_DISCOVERY_STRATEGY",), V16, False),
    "flags.plugin.deviceListStrategy": ("device-list-strategy", ("DEVICE_LIST_STRATEGY",), V15, True),
    "flags.plugin.deviceIDStrategy": ("device-id-strategy", ("DEVICE_ID_STRATEGY",), V15, False),
    "flags.plugin.sharedDevicesAllocationPolicy": ("shared-devices-allocation-policy", ("SHARED_DEVICES_ALLOCATION_POLICY",), V20, False),
    "imex.channelIDs": ("imex-channel-ids", ("IMEX_CHANNEL_IDS",), V17, True),
}
# Boolean flags, whose value (argument or environment variable) must be one strconv.ParseBool takes (urfave/cli v2
# flag_bool.go Apply; Go's flag package for an argument).
BOOL_FLAGS = (("fail-on-init-error", "FAIL_ON_INIT_ERROR", V15), ("pass-device-specs", "PASS_DEVICE_SPECS", V15),
              ("gds-enabled", "GDS_ENABLED", V15), ("mofed-enabled", "MOFED_ENABLED", V15),
              ("gdrcopy-enabled", "GDRCOPY_ENABLED", V18), ("imex-required", "IMEX_REQUIRED", V17))
GO_BOOLS = ("1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False")

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_UUID = re.compile(r"^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32})$")
_DURATION = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+$|^[-+]?0$")


def release_text(version):
    return "v%d.%d.%d" % tuple(version[:3])


def schema_version(parsed):
    """The release whose schema applies: the DaemonSet's; the newest this module knows for a newer or unknown one, the
    oldest for an older one (reported as too old anyway)."""
    if parsed is None or tuple(parsed[:3]) > NEWEST_KNOWN:
        return NEWEST_KNOWN
    return max(tuple(parsed[:3]), V15)


def closest(key, candidates):
    """The known key closest to ``key`` (difflib, case-insensitive), or None."""
    folded = {candidate.lower(): candidate for candidate in candidates}
    match = difflib.get_close_matches(str(key).lower(), list(folded), n=1, cutoff=0.6)
    return folded[match[0]] if match else None


def _json_type(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string"


def resource_name_problem(name):
    """Why the plugin refuses ``name`` as a resource name, or None (api/config/v1/resources.go NewResourceName)."""
    if not isinstance(name, str):
        return "%s, not a string" % _json_type(name)
    qualified = name if name.startswith(RESOURCE_DOMAIN + "/") else "%s/%s" % (RESOURCE_DOMAIN, name)
    short = qualified.split("/", 1)[1]
    if "/" in short:
        return "%r is not an %s/ resource (the plugin prefixes it: %s is no valid name)" % (name, RESOURCE_DOMAIN, qualified)
    if len(qualified) > MAX_RESOURCE_NAME:
        return "%r is longer than %d characters as %s" % (name, MAX_RESOURCE_NAME, qualified)
    if not _DNS_SUBDOMAIN.match(short):
        return "%r: the name after %s/ must be a DNS subdomain (lower-case letters, digits, '-' and '.')" % (name, RESOURCE_DOMAIN)
    return None


class Decoded:
    """A config document as the plugin decodes it: ``config`` with the plugin's key spellings (only the keys it reads,
    strings as it converts them), ``refusals`` ([{field, found, message, ident}]: the plugin exits at start), and
    ``unknown`` ([{field, key, closest, since}]: keys it ignores)."""

    def __init__(self, version, source=""):
        self.version, self.source = version, source
        self.config = {}
        self.refusals = []
        self.unknown = []

    def refuse(self, field, found, message, ident="plugin_config_invalid"):
        self.refusals.append({"field": field, "found": found, "message": _at(self.source, message), "ident": ident})

    def ignore(self, field, key, candidates, since=None, exact=False):
        self.unknown.append({"field": field, "where": _at(self.source, field), "key": key, "closest": closest(key, candidates),
                             "since": since, "exact": exact})


def _at(source, text):
    """``text`` (a key path, a message beginning with one) in the config file ``source`` (None or "": no file)."""
    return ("%s %s" % (source, text)).strip() if source else text


def _path(parent, key):
    return "%s.%s" % (parent, key) if parent else str(key)


def _go_string(value):
    """A YAML scalar as sigs.k8s.io/yaml hands it to a string field (numbers and booleans become their text)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else "%g" % value
    return str(value)


def _decode_value(decoded, field, kind, value, children):
    if kind == STRUCT:
        return _decode_struct(decoded, field, value, children)
    if kind == REPLICATED:
        return _decode_replicated(decoded, field, value)
    if value is None:
        return None
    if kind in (STRING, TEXT):
        if isinstance(value, str) or (kind == TEXT and not isinstance(value, (dict, list))):
            return _go_string(value)
        decoded.refuse(field, value, "%s is %s %s, not a string%s" % (
            field, _json_type(value), json.dumps(value, default=str), " (quote it)" if not isinstance(value, (dict, list)) else ""))
        return None
    if kind == BOOL:
        if not isinstance(value, bool):
            decoded.refuse(field, value, "%s is %s %r, not true or false (a quoted \"false\" is a string)" % (field, _json_type(value), value))
            return None
        return value
    if kind == STRATEGIES:  # a string or a list of strings, never split at commas (flags.go deviceListStrategyFlag)
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return list(value)
        decoded.refuse(field, value, "%s is %r: a device list strategy or a list of them (strings)" % (field, value))
        return None
    if kind == DURATION:
        if (isinstance(value, (int, float)) and not isinstance(value, bool)) or (isinstance(value, str) and _DURATION.match(value)):
            return value
        decoded.refuse(field, value, "%s is %r, not a duration such as 60s" % (field, value))
        return None
    if kind == INTS:
        if isinstance(value, list) and all(_integral(item) for item in value):
            return [int(item) for item in value]
        decoded.refuse(field, value, "%s is %r, not a list of integers" % (field, value))
        return None
    return _decode_resources(decoded, field, value)


def _integral(value):
    return not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, float) and value.is_integer()))


def _decode_struct(decoded, field, value, fields):
    """A struct decoded by encoding/json: keys case-insensitive, the last of two spellings (in sorted order) wins."""
    if value is None:
        return None
    if not isinstance(value, dict):
        decoded.refuse(field or "the document", value, "%s is %s, not a mapping" % (field or "the document", _json_type(value)))
        return None
    out = {}
    folded = {key.lower(): key for key in fields}
    for key in sorted(value, key=_go_string):
        text = _go_string(key)
        name = text if text in fields else folded.get(text.lower())
        kind, since, children = fields[name] if name else (None, None, None)
        if name is None or decoded.version < since:
            decoded.ignore(_path(field, text), text, list(fields), since)
            continue
        out[name] = _decode_value(decoded, _path(field, name), kind, value[key], children)
    return {key: item for key, item in out.items() if item is not None}


def _exact_keys(decoded, field, value, keys):
    for key in value:
        if key not in keys:
            decoded.ignore(_path(field, _go_string(key)), _go_string(key), keys, exact=True)


def _entries(decoded, field, entries, keys):
    """(where, entry) of each mapping in a list the plugin decodes entry by entry (exact keys): other entries are
    refused, unknown keys reported."""
    for index, entry in enumerate(entries):
        where = "%s[%d]" % (field, index)
        if not isinstance(entry, dict):
            decoded.refuse(where, entry, "%s is %s, not a mapping with %s" % (where, _json_type(entry), " and ".join(keys[:2])))
            continue
        _exact_keys(decoded, where, entry, keys)
        yield where, entry


def _name_ok(decoded, where, entry, key):
    """True when the entry's ``key`` is a resource name the plugin takes (a missing optional key is fine)."""
    problem = resource_name_problem(entry[key]) if key in entry else None
    if problem:
        decoded.refuse("%s.%s" % (where, key), entry[key], "%s.%s is %s" % (where, key, problem), "plugin_resource_name_invalid")
    return problem is None


def _decode_resources(decoded, field, value):
    """resources.gpus / resources.mig: [{pattern, name}] (resources.go Resource.UnmarshalJSON, exact keys)."""
    if not isinstance(value, list):
        decoded.refuse(field, value, "%s is %s, not a list" % (field, _json_type(value)))
        return None
    out = []
    for where, entry in _entries(decoded, field, value, RESOURCE_KEYS):
        for key in RESOURCE_KEYS:
            if key not in entry:
                decoded.refuse(where, entry, "%s has no %s (both pattern and name are required)" % (where, key))
        pattern = entry.get("pattern")
        if "pattern" in entry and not isinstance(pattern, str):
            decoded.refuse(where + ".pattern", pattern, "%s.pattern is %s, not a string" % (where, _json_type(pattern)))
        if _name_ok(decoded, where, entry, "name") and isinstance(pattern, str) and "name" in entry:
            out.append({"pattern": pattern, "name": entry["name"]})
    return out


def _decode_devices(decoded, where, devices):
    """"all", a positive count, or a list of GPU indices, MIG indices (gpu:mig) and GPU/MIG UUIDs (replicas.go)."""
    if devices == "all":
        return
    if _integral(devices):
        if devices <= 0:
            decoded.refuse(where, devices, "%s is %d: a count of devices must be above 0" % (where, devices))
        return
    if isinstance(devices, list):
        for item in devices:
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                continue
            if isinstance(item, str) and _device_ref(item):
                continue
            decoded.refuse(where, item, "%s: %r is not a GPU index, a MIG index (gpu:mig) or a GPU or MIG UUID" % (where, item))
        return
    decoded.refuse(where, devices, "%s is %r: \"all\", a positive count or a list of devices" % (where, devices))


def _device_ref(text):
    if text.isdigit():
        return True
    parts = text.split(":")
    if len(parts) == 2 and all(part.isdigit() for part in parts):
        return True
    if text.startswith("GPU-"):
        return bool(_UUID.match(text[4:]))
    if text.startswith("MIG-"):
        rest = text[4:]
        if _UUID.match(rest):
            return True
        gpu, _sep, indices = rest.partition("/")
        numbers = indices.split("/")
        return gpu.startswith("GPU-") and bool(_UUID.match(gpu[4:])) and len(numbers) == 2 and all(n.isdigit() for n in numbers)
    return False


def _decode_replicated(decoded, field, value):
    """sharing.timeSlicing / sharing.mps (replicas.go ReplicatedResources and ReplicatedResource UnmarshalJSON).

    ``timeSlicing`` is a struct: present at all, even empty or null, its decoder runs and wants resources; ``mps`` is a
    pointer, so null leaves MPS off."""
    if value is None and field.endswith(".mps"):
        return None
    value = {} if value is None else value
    if not isinstance(value, dict):
        decoded.refuse(field, value, "%s is %s, not a mapping" % (field, _json_type(value)))
        return None
    _exact_keys(decoded, field, value, REPLICATED_KEYS)
    out = {}
    for key in ("renameByDefault", "failRequestsGreaterThanOne"):
        flag = value.get(key)
        if flag is not None and not isinstance(flag, bool):
            decoded.refuse(_path(field, key), flag, "%s.%s is %s %r, not true or false" % (field, key, _json_type(flag), flag))
        elif flag is not None:
            out[key] = flag
    resources = value.get("resources")
    if resources is not None and not isinstance(resources, list):
        decoded.refuse(_path(field, "resources"), resources, "%s.resources is %s, not a list" % (field, _json_type(resources)))
        return None
    if not resources:
        decoded.refuse(_path(field, "resources"), resources, "%s has no resources: the plugin needs at least one {name, replicas}" % field)
        return None
    out["resources"] = []
    for where, entry in _entries(decoded, _path(field, "resources"), resources, REPLICATED_RESOURCE_KEYS):
        ok = _name_ok(decoded, where, entry, "name")
        if "name" not in entry:
            decoded.refuse(where, entry, "%s has no name" % where)
            ok = False
        if "devices" in entry:
            _decode_devices(decoded, where + ".devices", entry["devices"])
        replicas = entry.get("replicas")
        if "replicas" not in entry:
            decoded.refuse(where, entry, "%s has no replicas" % where)
            ok = False
        elif replicas is not None and not _integral(replicas):
            decoded.refuse(where + ".replicas", replicas, "%s.replicas is %s %r, not an integer" % (where, _json_type(replicas), replicas))
            ok = False
        elif replicas is None or replicas < 2:
            decoded.refuse(where + ".replicas", replicas, "%s.replicas is %r: the plugin needs at least 2 (1 shares nothing)" % (where, replicas))
            ok = False
        _name_ok(decoded, where, entry, "rename")
        if ok:
            out["resources"].append({"name": entry["name"], "replicas": int(replicas)})
    return out


def decode(document, version, source=""):
    """The document (YAML already loaded; None for an empty file) as release ``version`` decodes it; ``source`` names
    the file in messages."""
    decoded = Decoded(tuple(version[:3]), source)
    config = _decode_struct(decoded, "", document, DOCUMENT) if document is not None else {}
    decoded.config = config or {}
    config_version = decoded.config.get("version") or "v1"
    if config_version != "v1":
        decoded.refuse("version", config_version, "version is %r: the plugin reads only v1 (api/config/v1) and refuses any other"
                       % config_version)
    return decoded


def _config_value(config, path):
    value = config
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def effective(config, path, override, version, source=""):
    """(value, where) of a setting: its flag or environment variable where the release has it and it is set, else the
    config file's value (where: ``source`` and the key), else (None, None).
    ``override(flag, envs)`` -> (text, where) or (None, None)."""
    flag, envs, since, listed = OVERRIDES[path]
    if tuple(version[:3]) >= since:
        text, where = override(flag, envs)
        if text is not None:
            # urfave/cli v2 splits a slice flag's environment value at commas and trims each part (flag_string_slice.go).
            return ([part.strip() for part in text.split(",")] if listed else text), where
    value = _config_value(config, path)
    return (value, _at(source, path)) if value is not None else (None, None)


def no_override(flag, envs):
    return None, None


def settings_refusals(config, version, override=no_override, source=""):
    """What validateFlags refuses in a decoded config, its flags and environment: [{field, found, message, ident}]."""
    version = tuple(version[:3])
    out = []

    def setting(path):
        return effective(config, path, override, version, source)

    def refuse(ident, where, found, message, expected=None):
        out.append({"field": where, "found": found, "message": message, "ident": ident, "expected": expected})

    for flag, env, since in BOOL_FLAGS:
        text, where = override(flag, (env,)) if version >= since else (None, None)
        if text not in (None, "") and text not in GO_BOOLS:
            refuse("plugin_config_invalid", where, text, "%s is %r, not a boolean the plugin parses (true, false, 1, 0, t, f)" % (where, text))
    strategies, where = setting("flags.plugin.deviceListStrategy")
    for item in strategies or []:
        if item not in DEVICE_LIST_STRATEGIES:
            refuse("plugin_device_list_strategy_invalid", where, item,
                   "%s is %r, not a device list strategy (%s)" % (where, item, ", ".join(DEVICE_LIST_STRATEGIES)), list(DEVICE_LIST_STRATEGIES))
    value, where = setting("flags.plugin.deviceIDStrategy")
    if value is not None and value not in DEVICE_ID_STRATEGIES:
        refuse("plugin_device_id_strategy_invalid", where, value, "%s is %r, not one of %s" % (where, value, ", ".join(DEVICE_ID_STRATEGIES)),
               list(DEVICE_ID_STRATEGIES))
    if version >= V20:
        value, where = setting("flags.plugin.sharedDevicesAllocationPolicy")
        if value is not None and value not in ALLOCATION_POLICIES:
            refuse("plugin_config_invalid", where, value, "%s is %r, not one of %s" % (where, value, ", ".join(ALLOCATION_POLICIES)),
                   list(ALLOCATION_POLICIES))
    mig, mig_where = setting("flags.migStrategy")
    if (_config_value(config, "sharing.mps") or {}).get("resources"):  # replicas >= 2 each, so MPS is the strategy
        if mig == "mixed":
            refuse("plugin_mps_invalid", mig_where, mig, _at(source, "sharing.mps with migStrategy mixed (%s): the plugin does not share "
                   "MIG devices with MPS; use time-slicing, or migStrategy none" % mig_where), "migStrategy none or single")
        root, _where = setting("flags.mpsRoot")
        if not root:
            refuse("plugin_mps_invalid", _at(source, "flags.mpsRoot"), None, _at(source, "sharing.mps without an MPS root (flags.mpsRoot or "
                   "MPS_ROOT): the plugin needs the directory the mps-control-daemon uses (the Helm chart sets MPS_ROOT=/run/nvidia/mps)"),
                   "an MPS root")
    if version >= V16:
        value, where = setting("flags.deviceDiscoveryStrategy")
        if value is not None and value not in DISCOVERY_STRATEGIES:
            refuse("plugin_config_invalid", where, value, "%s is %r, not one of %s" % (where, value, ", ".join(DISCOVERY_STRATEGIES)),
                   list(DISCOVERY_STRATEGIES))
    if mig is not None and mig not in MIG_STRATEGIES:
        refuse("plugin_mig_strategy_invalid", mig_where, mig, "%s is %r, not one of %s" % (mig_where, mig, ", ".join(MIG_STRATEGIES)),
               list(MIG_STRATEGIES))
    if version >= V17:
        ids, where = setting("imex.channelIDs")
        if ids is not None and [str(i) for i in ids] not in ([], ["0"]):
            refuse("plugin_config_invalid", where, ids, "%s is %s: the plugin takes [] or [0]" % (where, json.dumps(ids)))
    return out
