# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""MIG layouts as data: parse, validate, pack, plan.  Pure: no NVML, no files, no host access.

Two inputs become one list of entries ``{devices, device_filter, mig_enabled, mig_devices, pins}``:

* NVIDIA mig-parted's v1 file format, unchanged (``version: v1``, ``mig-configs``, a selected name);
* the short inventory form ``{all: {"1g.10gb": 7}, 3: {"3g.40gb@4": 1}, 5: disabled}``.

``resolve`` turns the entries into one desired state per GPU; ``validate`` checks it against the GPU's
profile table (names, instance limits, placements); ``plan_gpu`` computes the minimal steps from the
current state; ``pack`` chooses explicit placements (largest first, with backtracking: it finds a fit
whenever one exists); ``advertised_resources``/``strategy_findings`` say what the device plugin will
advertise under each MIG strategy.
"""

from __future__ import annotations

import re

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding

MIG_PARTED_ENTRY_FIELDS = ("device-filter", "devices", "mig-enabled", "mig-devices")
STRATEGIES = ("none", "single", "mixed")
# A MIG profile name as go-nvlib parses it (NVIDIA/go-nvlib pkg/nvlib/device/mig_profile.go parseMigProfile, vendored
# by NVIDIA/mig-parted v0.15.0 as go-nvlib v0.12.0): "[<c>c.]<g>g.<gb>gb", then either "+" or "-" (never both) and a
# comma-separated list of unique attributes, each of letters, digits and dots, not starting with a digit, not
# starting or ending with a dot: 1g.10gb+me, 1g.24gb+me.all, 2g.48gb+gfx, 1g.24gb-me (no media extensions).
_FIELDS_RE = re.compile(r"^(?:([0-9]+)c\.)?([0-9]+)g\.([0-9]+)gb$")
_ATTRIBUTE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9.]*$")
_DISABLED_WORDS = ("disabled", "off", "none")

# Built-in GPU-instance profile tables (mig.md section 2), used only where NVML reports no table for a GPU whose
# MIG is disabled.  A real H200 on driver 580.159.04 did report its table with MIG disabled
# (tools/gpu_reality_check.py, 2026-12-04); older drivers are said to answer NOT_SUPPORTED, so the fallback stays.
# Placements are memory-slice starts; ``size`` is the placement size in memory slices; ``slices`` counts compute
# slices.  The 80 GB and 141 GB boards share ids, enums, slices and placements; only the memory in the names differs.
_TABLE_ROWS = (
    # names (80 GB, 141 GB), id, enum, compute slices, placement size, max instances, starts
    (("1g.10gb", "1g.18gb"), 19, 0, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    (("1g.10gb+me", "1g.18gb+me"), 20, 7, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (("1g.20gb", "1g.35gb"), 15, 9, 1, 2, 4, (0, 2, 4, 6)),
    (("2g.20gb", "2g.35gb"), 14, 1, 2, 2, 3, (0, 2, 4)),
    (("3g.40gb", "3g.71gb"), 9, 2, 3, 4, 2, (0, 4)),
    (("4g.40gb", "4g.71gb"), 5, 3, 4, 4, 1, (0,)),
    (("7g.80gb", "7g.141gb"), 0, 4, 7, 8, 1, (0,)),
)


def _table(rows, column):
    return {
        names[column]: {"id": pid, "enum": enum, "slices": slices, "size": size, "instance_count": limit,
                        "starts": list(starts)}
        for names, pid, enum, slices, size, limit, starts in rows
    }


BUILTIN_TABLES = {"A100-80GB": _table(_TABLE_ROWS, 0), "H100-80GB": _table(_TABLE_ROWS, 0),
                  "H200-141GB": _table(_TABLE_ROWS, 1)}
# PCI device ids (device << 16 | vendor) of the boards whose table is built in.
BUILTIN_TABLE_BY_DEVICE_ID = {
    "0x20B210DE": "A100-80GB",  # A100-SXM4-80GB
    "0x20B510DE": "A100-80GB",  # A100 80GB PCIe
    "0x233010DE": "H100-80GB",  # H100 SXM5 80GB
    "0x233110DE": "H100-80GB",  # H100 PCIe 80GB
    "0x233510DE": "H200-141GB",  # H200 SXM 141GB (read from one, 2026-12-04)
}
COMPUTE_SLICES = 7
MEMORY_SLICES = 8


def builtin_table(pci_device_id):
    name = BUILTIN_TABLE_BY_DEVICE_ID.get((pci_device_id or "").upper().replace("0X", "0x"))
    return BUILTIN_TABLES[name] if name else None


# ---------------------------------------------------------------------------------------------
# Profile names


def parse_profile(name):
    """A MIG profile name as {c, g, gb, attributes, negative}; raises ValueError saying what is wrong.

    Follows go-nvlib ``parseMigProfile`` (pkg/nvlib/device/mig_profile.go): ``c`` equals ``g`` when the name has
    no compute-instance part; ``attributes`` holds the ``+`` list, ``negative`` the ``-`` list (sorted tuples).
    """
    if not isinstance(name, str) or not name:
        raise ValueError("the profile is empty")
    if "+" in name and "-" in name:
        raise ValueError("it has both '+' and '-' attributes")
    sign = "+" if "+" in name else ("-" if "-" in name else None)
    fields, _sep, attributes = name.partition(sign) if sign else (name, "", "")
    match = _FIELDS_RE.match(fields)
    if not match:
        raise ValueError("%r is not [<c>c.]<g>g.<gb>gb" % fields)
    listed = attributes.split(",") if sign else []
    for attribute in listed:
        if not _ATTRIBUTE_RE.match(attribute) or attribute.endswith("."):
            raise ValueError("attribute %r must be letters, digits and dots, start with a letter and not end with a dot"
                             % attribute)
    if len(set(listed)) != len(listed):
        raise ValueError("an attribute is listed twice")
    g = int(match.group(2))
    return {"c": int(match.group(1)) if match.group(1) else g, "g": g, "gb": int(match.group(3)),
            "attributes": tuple(sorted(listed)) if sign == "+" else (),
            "negative": tuple(sorted(listed)) if sign == "-" else ()}


def same_profile(one, other):
    """Whether two profile names name the same profile (attribute order does not matter, as in go-nvlib Matches)."""
    try:
        return parse_profile(one) == parse_profile(other)
    except ValueError:
        return False


def table_name(name, table):
    """The spelling ``table`` uses for profile ``name`` (``1g.10gb+me`` for ``1g.10gb+me``), or None."""
    if name in table:
        return name
    for known in table:
        if same_profile(name, known):
            return known
    return None


# The NVIDIA device plugin's MIG resource names, mixed strategy (NVIDIA/k8s-device-plugin):
# - internal/rm/rm.go AddDefaultResourcesToConfig registers one pattern per MIG profile of the node's GPUs whose
#   compute-instance slices equal its GPU-instance slices (C == G: "1g.10gb", "1g.10gb+me", never "1c.3g.40gb"),
#   in NVML enum order (go-nvlib pkg/nvlib/device/device.go VisitMigProfiles), each named "mig-" + the profile with
#   "+" replaced by "." (nvidia.com/mig-1g.10gb.me);
# - internal/rm/device_map.go buildMigDeviceMap gives each MIG device (one per compute instance) the first pattern
#   that matches its profile (go-nvlib MigProfileInfo.String(): "1c.3g.40gb" for a 1-slice compute instance in a
#   3g.40gb GPU instance); a device that matches none stops the plugin ("MIG profile ... does not match any resource
#   patterns");
# - api/config/v1/resources.go ResourcePattern.Matches: up to v0.19.x an unanchored regular expression, so pattern
#   "3g.40gb" matches "1c.3g.40gb" and "1g.10gb" (registered first) matches "1g.10gb+me".  The real v0.18.2 binary,
#   run on the NVML double, advertised three 1c.3g.40gb devices as nvidia.com/mig-3g.40gb x3.  From v0.20.0 the
#   pattern is anchored (commit 0dfdfb97, #1807): attribute profiles are resources of their own and a compute
#   instance smaller than its GPU instance matches nothing, so the plugin does not start.
PLUGIN_ANCHORED_SINCE = "v0.20.0"


def plugin_profile(name):
    """go-nvlib's String() of a parsed profile: the compute-instance part only where it differs."""
    info = parse_profile(name)
    suffix = ("+" + ",".join(info["attributes"])) if info["attributes"] else (
        "-" + ",".join(info["negative"]) if info["negative"] else "")
    base = "%dg.%dgb" % (info["g"], info["gb"])
    return (base if info["c"] == info["g"] else "%dc.%s" % (info["c"], base)) + suffix


def mig_resource_name(profile, anchored=True, registered=None):
    """The extended resource the device plugin (mixed strategy) advertises a MIG device of ``profile`` under.

    ``anchored``: plugin v0.20.0 or newer.  ``registered``: the C == G profile names of the node's GPUs in NVML enum
    order (the plugin's patterns); None assumes the device's own GPU-instance profile is one of them.  Returns None
    where no pattern matches (the plugin does not start) or the name is not a MIG profile.
    """
    try:
        device = plugin_profile(profile)
    except ValueError:
        return None
    if registered is None:
        # the plain profile's NVML enum precedes its attribute variants' (1_SLICE 0 < 1_SLICE_REV1 7 < 1_SLICE_NO_ME 0xD)
        gi_profile = device.split(".", 1)[1] if device.split(".", 1)[0].endswith("c") else device
        registered = [re.split(r"[+-]", gi_profile, maxsplit=1)[0], gi_profile]
    for pattern in registered:
        if (device == pattern) if anchored else (pattern in device):
            return "nvidia.com/mig-" + pattern.replace("+", ".")
    return None


def mig_resource_names(profile, registered=None):
    """{"mixed": name under plugin v0.20.0+ (None: no pattern matches), "mixed_legacy": name under v0.19.x and older}."""
    return {"mixed": mig_resource_name(profile, True, registered),
            "mixed_legacy": mig_resource_name(profile, False, registered)}


# ---------------------------------------------------------------------------------------------
# Parsing


def _where(source, *path):
    return "%s: %s" % (source, ".".join(str(part) for part in path)) if path else source


def _parse_profile_counts(value, source, path):
    """{profile: count} -> ({profile: count}, [(profile, start)]) ; "3g.40gb@4": 1 pins a placement."""
    if value is None:
        return {}, []
    if not isinstance(value, dict):
        raise GpuhardenError(
            "%s must be a mapping of MIG profile to count, got %r" % (_where(source, *path), value),
            field=".".join(map(str, path)), value=value,
        )
    counts, pins = {}, []
    for key, count in value.items():
        name = str(key)
        start = None
        if "@" in name:
            name, _sep, where = name.partition("@")
            if not where.isdigit():
                raise GpuhardenError(
                    "%s: profile %r pins a placement that is not a number (use e.g. 3g.40gb@4)"
                    % (_where(source, *path), key),
                    field=".".join(map(str, path)), value=key,
                )
            start = int(where)
        try:
            info = parse_profile(name)
        except ValueError as error:
            raise GpuhardenError(
                "%s: %r is not a MIG profile name: %s (expected e.g. 1g.10gb, 3g.40gb, 1g.10gb+me, 1g.24gb+me.all, "
                "1g.24gb-me)" % (_where(source, *path), key, error),
                field=".".join(map(str, path)), value=key,
            ) from None
        if info["c"] != info["g"]:
            raise GpuhardenError(
                "%s: %r names a compute-instance profile; layouts list GPU-instance profiles (%s), each of which gets "
                "its default compute instance" % (_where(source, *path), key, name.split(".", 1)[1]),
                field=".".join(map(str, path)), value=key,
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise GpuhardenError(
                "%s: count of %s must be a non-negative integer, got %r" % (_where(source, *path), key, count),
                field="%s.%s" % (".".join(map(str, path)), key), value=count,
            )
        if start is not None:
            if count > 1:
                raise GpuhardenError(
                    "%s: pinned profile %s can only have count 1, got %r" % (_where(source, *path), key, count),
                    field="%s.%s" % (".".join(map(str, path)), key), value=count,
                )
            pins.extend([(name, start)] * count)
        if count:
            counts[name] = counts.get(name, 0) + count
    if value and not counts:
        # mig-parted rejects it too (pkg/types/mig_config.go MigConfig.AssertValidFormat: "all counts for all
        # MigProfiles are 0"); an empty mapping is MIG enabled without instances
        raise GpuhardenError(
            "%s: every count is 0 (%s); use an empty mapping for MIG enabled without instances, or set a count"
            % (_where(source, *path), ", ".join("%s: %s" % item for item in value.items())),
            field=".".join(map(str, path)), value=value,
        )
    return counts, pins


def described(value):
    """What a value is, in words for a message (never a Python type name)."""
    if value is None:
        return "nothing (an empty document or value)"
    if isinstance(value, bool):
        return "the boolean %s" % str(value).lower()
    kinds = ((dict, "a mapping"), (list, "a list"), (str, "the string"), ((int, float), "the number"))
    words = next((words for kind, words in kinds if isinstance(value, kind)), "a value of another kind")
    return words if isinstance(value, (dict, list)) else "%s %r" % (words, value if not isinstance(value, str) else value[:80])


def _entry(devices, mig_enabled, mig_devices=None, device_filter=None, pins=None, origin=None, exclusive=False):
    """One entry; ``origin`` names where it was written (file and config), ``exclusive``: no other exclusive entry may
    select the same GPU (mig-parted files, see ``resolve_entries``)."""
    return {
        "devices": devices,
        "device_filter": device_filter,
        "mig_enabled": mig_enabled,
        "mig_devices": dict(mig_devices or {}),
        "pins": list(pins or []),
        "origin": origin,
        "exclusive": exclusive,
    }


def parse_mig_parted(config, selected, source="config"):
    """mig-parted v1 (``api/spec/v1/spec.go``) -> entries.  Unknown fields are rejected, as mig-parted does."""
    if not isinstance(config, dict):
        raise GpuhardenError("%s must be a mig-parted v1 mapping, got %s" % (source, described(config)), field="", value=config)
    unknown = sorted(set(map(str, config)) - {"version", "mig-configs"})
    if unknown:
        raise GpuhardenError("%s: unknown top-level field(s) %s (mig-parted v1 allows version, mig-configs)"
                             % (source, ", ".join(unknown)), field=unknown[0], value=unknown[0])
    if config.get("version") != "v1":
        raise GpuhardenError("%s: version must be v1, got %r" % (source, config.get("version")),
                             field="version", value=config.get("version"))
    configs = config.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise GpuhardenError("%s: mig-configs must be a non-empty mapping of config name to entries, got %r"
                             % (source, configs), field="mig-configs", value=configs)
    if selected not in configs:
        raise GpuhardenError("%s: selected config %r is not in mig-configs (have: %s)"
                             % (source, selected, ", ".join(sorted(map(str, configs)))),
                             field="mig-configs", value=selected)
    entries_in = configs[selected]
    if not isinstance(entries_in, list) or not entries_in:
        raise GpuhardenError("%s: mig-configs.%s must be a non-empty list of entries, got %r"
                             % (source, selected, entries_in), field="mig-configs.%s" % selected, value=entries_in)
    entries = []
    for position, raw in enumerate(entries_in):
        path = ("mig-configs", selected, position)
        if not isinstance(raw, dict):
            raise GpuhardenError("%s must be a mapping, got %r" % (_where(source, *path), raw),
                                 field=".".join(map(str, path)), value=raw)
        unknown = sorted(set(map(str, raw)) - set(MIG_PARTED_ENTRY_FIELDS))
        if unknown:
            raise GpuhardenError("%s: unknown field(s) %s (allowed: %s)" % (_where(source, *path), ", ".join(unknown),
                                 ", ".join(MIG_PARTED_ENTRY_FIELDS)), field=unknown[0], value=raw[unknown[0]])
        devices = raw.get("devices")
        if devices != "all":
            if (not isinstance(devices, list) or not devices
                    or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in devices)):
                raise GpuhardenError("%s: devices must be 'all' or a list of GPU indices, got %r"
                                     % (_where(source, *path), devices),
                                     field=".".join(map(str, path + ("devices",))), value=devices)
            devices = sorted(set(devices))
        enabled = raw.get("mig-enabled")
        if not isinstance(enabled, bool):
            raise GpuhardenError("%s: mig-enabled is required and must be true or false, got %r"
                                 % (_where(source, *path), enabled),
                                 field=".".join(map(str, path + ("mig-enabled",))), value=enabled)
        device_filter = raw.get("device-filter")
        if device_filter is not None:
            if isinstance(device_filter, str):
                device_filter = [device_filter]
            if not isinstance(device_filter, list) or not all(
                isinstance(f, str) and re.match(r"^0x[0-9a-fA-F]{8}([0-9a-fA-F]{8})?$", f) for f in device_filter
            ):
                raise GpuhardenError("%s: device-filter must be a list of PCI ids like 0x20B210DE, got %r"
                                     % (_where(source, *path), device_filter),
                                     field=".".join(map(str, path + ("device-filter",))), value=device_filter)
            device_filter = [f[:10].upper().replace("0X", "0x") for f in device_filter]
        if enabled and raw.get("mig-devices") is None:
            # api/spec/v1/spec.go (MigConfigSpec.UnmarshalJSON): "missing required field 'mig-devices' when
            # 'mig-enabled' is true"; mig-devices: {} (MIG enabled, no instances) is accepted
            raise GpuhardenError("%s: mig-devices is required when mig-enabled is true (use {} for MIG enabled without "
                                 "instances), as in mig-parted" % _where(source, *path),
                                 field=".".join(map(str, path + ("mig-devices",))), value=None)
        counts, pins = _parse_profile_counts(raw.get("mig-devices"), source, path + ("mig-devices",))
        if not enabled and (counts or raw.get("mig-devices")):
            raise GpuhardenError("%s: mig-devices must be empty when mig-enabled is false, got %r"
                                 % (_where(source, *path), raw.get("mig-devices")),
                                 field=".".join(map(str, path + ("mig-devices",))), value=raw.get("mig-devices"))
        entries.append(_entry(devices, enabled, counts, device_filter, pins,
                              origin="%s: mig-configs.%s[%d]" % (source, selected, position), exclusive=True))
    return entries


def parse_short(layout, source="layout"):
    """The inventory form: ``{all | <index> | "0,1": {profile: count} | disabled | false}`` -> entries.

    ``all`` applies first, then per-index keys override it.  A mapping (even empty) means MIG enabled with
    those GPU instances; ``false``/``disabled``/``null`` means MIG disabled.  ``"3g.40gb@4": 1`` pins a placement.
    """
    if not isinstance(layout, dict) or not layout:
        raise GpuhardenError("%s must be a non-empty mapping of 'all' or GPU index to a layout, got %r"
                             % (source, layout), field="", value=layout)
    entries_all, entries_indexed = [], []
    for key, value in layout.items():
        text = str(key).strip()
        if text == "all":
            devices = "all"
        else:
            parts = [part.strip() for part in text.split(",")]
            if isinstance(key, bool) or not all(part.isdigit() for part in parts):
                raise GpuhardenError("%s: key %r is neither 'all' nor a GPU index (or comma-separated indices)"
                                     % (source, key), field=str(key), value=key)
            devices = sorted({int(part) for part in parts})
        origin = "%s.%s" % (source, key)
        if value is False or value is None or (isinstance(value, str) and value.strip().lower() in _DISABLED_WORDS):
            entry = _entry(devices, False, origin=origin)
        elif isinstance(value, dict):
            counts, pins = _parse_profile_counts(value, source, (key,))
            entry = _entry(devices, True, counts, None, pins, origin=origin)
        else:
            raise GpuhardenError("%s.%s must be a mapping of MIG profile to count or 'disabled', got %r"
                                 % (source, key, value), field=str(key), value=value)
        (entries_all if devices == "all" else entries_indexed).append(entry)
    return entries_all + entries_indexed


# ---------------------------------------------------------------------------------------------
# Resolution and validation


def gpu_label(gpu):
    return "GPU %s (%s, %s)" % (gpu["index"], gpu.get("pci_bus_id"), gpu.get("name"))


def _filter_matches(entry, gpu):
    if not entry["device_filter"]:
        return True
    return (gpu.get("pci_device_id") or "").upper().replace("0X", "0x") in entry["device_filter"]


def _selection(entries, gpus):
    """Per entry: (position, entry, the GPU indices it names that the node has, those it selects, those missing)."""
    by_index = {gpu["index"]: gpu for gpu in gpus}
    for position, entry in enumerate(entries):
        if entry["devices"] == "all":
            named, missing = sorted(by_index), []
        else:
            named = [index for index in entry["devices"] if index in by_index]
            missing = [index for index in entry["devices"] if index not in by_index]
        selected = [index for index in named if _filter_matches(entry, by_index[index])]
        yield position, entry, named, selected, missing


def resolve_entries(entries, gpus):
    """Per-GPU desired state {index: {mig_enabled, mig_devices, pins}} and the entries (or parts) that select no GPU.

    Entries apply in order and a later one overrides an earlier one for the same GPU; GPUs no entry selects are
    left alone.  As mig-parted walks the GPUs present and applies each entry to those it matches
    (NVIDIA/mig-parted v0.15.0 cmd/nvidia-mig-parted/assert/assert.go WalkSelectedMigConfigForEachGPU), an index
    the node does not have, or a device-filter no GPU matches, is left out, not an error: the same config file
    serves nodes with different GPUs.  ``unmatched`` lists them: [{entry, devices?, device_filter?, reason}].

    Two entries of one mig-parted config (``exclusive``) that select the same GPU are refused.  mig-parted v0.15.0
    does not refuse them: it applies every entry in turn to the GPUs it selects (cmd/nvidia-mig-parted/apply/mode.go
    ApplyMigMode, apply/config.go ApplyMigConfig).  With different mig-enabled, the mode ends as the last entry says
    and ApplyMigConfig then fails on the earlier entry ("unable to apply MIG config with MIG mode disabled", or "MIG
    mode is currently enabled, but the configuration specifies it should be disabled"), after the mode change and
    the GPU reset; with the same mode, the earlier layout is created and destroyed again, and only the last one
    stays.  Either way the earlier entry is a mistake.  The short form's ``all`` plus per-index keys overrides on
    purpose and is not exclusive.
    """
    by_index = {gpu["index"]: gpu for gpu in gpus}
    desired, unmatched, owners = {}, [], {}
    for position, entry, named, selected, missing in _selection(entries, gpus):
        if missing:
            unmatched.append({"entry": position, "devices": missing,
                              "reason": "no GPU with index %s on the node (GPUs %s)"
                                        % (", ".join(map(str, missing)), sorted(by_index))})
        if named and not selected and entry["device_filter"]:
            unmatched.append({"entry": position, "device_filter": list(entry["device_filter"]),
                              "reason": "no GPU %s matches device-filter %s (their PCI ids: %s)"
                                        % ("on the node" if entry["devices"] == "all" else "of %s" % named,
                                           ", ".join(entry["device_filter"]),
                                           ", ".join(sorted({str(by_index[i].get("pci_device_id")) for i in named})))})
        for index in selected:
            earlier = owners.get(index)
            if entry.get("exclusive") and earlier is not None:
                raise GpuhardenError(
                    "%s: selects %s, which %s selects already: mig-parted applies both in turn (the earlier layout "
                    "is destroyed again, or the apply fails after the mode change when mig-enabled differs); give "
                    "each GPU one entry" % (entry.get("origin") or "entry %d" % position, gpu_label(by_index[index]),
                                            earlier.get("origin") or "another entry"),
                    field="devices", value=entry["devices"], gpu=index)
            if entry.get("exclusive"):
                owners[index] = entry
            desired[index] = {
                "mig_enabled": entry["mig_enabled"],
                "mig_devices": dict(entry["mig_devices"]),
                "pins": list(entry["pins"]),
            }
    return desired, unmatched


def origins(entries, gpus):
    """{GPU index: where the entry that decides its layout was written} (the last entry that selects it)."""
    found = {}
    for _position, entry, _named, selected, _missing in _selection(entries, gpus):
        for index in selected:
            found[index] = entry.get("origin")
    return found


def resolve(entries, gpus):
    """Per-GPU desired state only (see ``resolve_entries``)."""
    return resolve_entries(entries, gpus)[0]


def spelled(want, table):
    """``want`` with its profiles spelled as ``table`` spells them (``1g.24gb+me.all,gfx`` -> the table's order);
    names the table does not know stay, for ``validate`` to report."""
    if not table or not want["mig_enabled"]:
        return want
    rename = {name: table_name(name, table) or name for name in want["mig_devices"]}
    counts = {}
    for name, count in want["mig_devices"].items():
        counts[rename[name]] = counts.get(rename[name], 0) + count
    return dict(want, mig_devices=counts, pins=[(rename.get(name, name), start) for name, start in want["pins"]])


def validate(gpu, want, table):
    """Check one GPU's desired layout against its profile table; returns the fitting placement list.

    ``table`` is {name: {id, slices, size, instance_count, starts}} or None when MIG is not supported.
    Raises GpuhardenError naming the GPU and the profile.
    """
    label = gpu_label(gpu)
    if not want["mig_enabled"]:
        return []
    if not gpu.get("mig_capable"):
        profiles = ", ".join(sorted(want["mig_devices"])) or "(MIG enabled, no instances)"
        raise GpuhardenError("%s does not support MIG, but the layout asks for MIG with %s" % (label, profiles),
                             gpu=gpu["index"], field="mig-enabled", value=True)
    if table is None:
        raise GpuhardenError("%s: MIG is disabled, NVML reports no profile table for it and gpuharden has none built "
                             "in for its board; enable MIG on it once (e.g. a layout with mig-enabled and no "
                             "mig-devices) so NVML can report the table" % label,
                             gpu=gpu["index"], field="mig-devices", value=want["mig_devices"])
    for name, count in sorted(want["mig_devices"].items()):
        if name not in table:
            raise GpuhardenError("%s has no MIG profile %s (its profiles: %s)" % (label, name, ", ".join(sorted(table))),
                                 gpu=gpu["index"], field="mig-devices", value=name)
        limit = table[name]["instance_count"]
        if count > limit:
            raise GpuhardenError("%s: profile %s allows at most %d instance(s), the layout asks for %d"
                                 % (label, name, limit, count), gpu=gpu["index"], field="mig-devices." + name, value=count)
    for name, start in want["pins"]:
        if start not in table[name]["starts"]:
            raise GpuhardenError("%s: profile %s cannot start at %d (placements: %s)"
                                 % (label, name, start, table[name]["starts"]),
                                 gpu=gpu["index"], field="mig-devices.%s@%d" % (name, start), value=start)
    slices = sum(table[name]["slices"] * count for name, count in want["mig_devices"].items())
    if slices > COMPUTE_SLICES:
        raise GpuhardenError("%s: layout %s needs %d compute slices, the GPU has %d"
                             % (label, layout_text(want), slices, COMPUTE_SLICES),
                             gpu=gpu["index"], field="mig-devices", value=want["mig_devices"])
    memory = sum(table[name]["size"] * count for name, count in want["mig_devices"].items())
    if memory > MEMORY_SLICES:
        raise GpuhardenError("%s: layout %s needs %d memory slices, the GPU has %d"
                             % (label, layout_text(want), memory, MEMORY_SLICES),
                             gpu=gpu["index"], field="mig-devices", value=want["mig_devices"])
    placed = pack(table, want["mig_devices"], pinned=want["pins"])
    if placed is None:
        raise GpuhardenError("%s: layout %s does not fit: no placement of these profiles avoids overlapping "
                             "memory slices" % (label, layout_text(want)),
                             gpu=gpu["index"], field="mig-devices", value=want["mig_devices"])
    return placed


# ---------------------------------------------------------------------------------------------
# Packing


def _fits(table, used_mask, used_slices, name, start):
    size = table[name]["size"]
    mask = ((1 << size) - 1) << start
    if used_mask & mask or start + size > MEMORY_SLICES:
        return None
    if used_slices + table[name]["slices"] > COMPUTE_SLICES:
        return None
    return mask


def pack(table, counts, pinned=(), occupied=()):
    """Explicit placements for ``counts`` ({profile: n}) next to ``occupied`` [(profile, start)] instances.

    ``pinned`` [(profile, start)] are part of ``counts`` with a fixed start.  Largest profiles first, each
    tried at every listed start, with backtracking: returns [(profile, start)] sorted by start, or None when
    no placement exists.  Never overlapping, never over the compute slices or a profile's instance limit.
    """
    used_mask, used_slices, per_profile = 0, 0, {}
    fixed = list(occupied) + list(pinned)
    for name, start in fixed:
        mask = _fits(table, used_mask, used_slices, name, start)
        if mask is None or start not in table[name]["starts"]:
            return None
        used_mask |= mask
        used_slices += table[name]["slices"]
        per_profile[name] = per_profile.get(name, 0) + 1
    remaining = dict(counts)
    for name, _start in pinned:
        remaining[name] = remaining.get(name, 0) - 1
        if remaining[name] < 0:
            return None
    if any(name not in table for name in list(remaining) + list(per_profile)):
        return None
    totals = dict(per_profile)
    for name, count in remaining.items():
        totals[name] = totals.get(name, 0) + count
    if any(totals[name] > table[name]["instance_count"] for name in totals):
        return None
    todo = []
    for name, count in remaining.items():
        todo.extend([name] * count)
    todo.sort(key=lambda name: (-table[name]["size"], -table[name]["slices"], name))
    chosen = []

    def search(position, mask, slices, floor):
        if position == len(todo):
            return True
        name = todo[position]
        for start in table[name]["starts"]:
            # identical profiles in a row take increasing starts: the same set is never tried twice
            if position and todo[position - 1] == name and start <= floor:
                continue
            bits = _fits(table, mask, slices, name, start)
            if bits is None:
                continue
            chosen.append((name, start))
            if search(position + 1, mask | bits, slices + table[name]["slices"], start):
                return True
            chosen.pop()
        return False

    if not search(0, used_mask, used_slices, -1):
        return None
    return sorted(list(pinned) + chosen, key=lambda item: (item[1], item[0]))


# ---------------------------------------------------------------------------------------------
# Planning


def layout_counts(instances):
    counts = {}
    for instance in instances:
        counts[instance["profile"]] = counts.get(instance["profile"], 0) + 1
    return counts


def layout_text(state):
    """'MIG disabled', 'MIG enabled, no instances', '7x 1g.10gb', '1x 3g.40gb + 2x 2g.20gb' (+ pending)."""
    if not state.get("mig_enabled"):
        return "MIG disabled"
    counts = state.get("mig_devices") or {}
    if not counts:
        return "MIG enabled, no instances"
    return " + ".join("%dx %s" % (counts[name], name) for name in sorted(counts, key=lambda n: (-int(n[0]), n)))


def current_layout(gpu):
    """A GPU's current state in the input's form: {mig_enabled, mig_devices} (the current mode, not pending)."""
    if not gpu.get("mig_capable"):
        return {"mig_enabled": False, "mig_devices": {}}
    enabled = gpu.get("mode_current") == 1
    return {"mig_enabled": enabled, "mig_devices": layout_counts(gpu.get("gpu_instances") or []) if enabled else {}}


def _destroy_steps(gpu, instances):
    steps = []
    for instance in instances:
        for ci in instance.get("compute_instances") or []:
            steps.append({"action": "destroy_ci", "gpu": gpu["index"], "gi_id": instance["id"], "ci_id": ci["id"],
                          "profile": instance["profile"], "start": instance["start"]})
        steps.append({"action": "destroy_gi", "gpu": gpu["index"], "gi_id": instance["id"],
                      "profile": instance["profile"], "start": instance["start"]})
    return steps


def _create_steps(gpu, table, placements):
    steps = []
    for name, start in placements:
        steps.append({"action": "create_gi", "gpu": gpu["index"], "profile": name, "profile_id": table[name]["id"],
                      "start": start, "size": table[name]["size"]})
        steps.append({"action": "create_ci", "gpu": gpu["index"], "profile": name, "start": start})
    return steps


def _keep_candidates(instances, want):
    """Existing instances that can stay: per profile up to the wanted count, pinned starts first."""
    keep, budget = [], dict(want["mig_devices"])
    pins = list(want["pins"])
    ordered = sorted(instances, key=lambda gi: (0 if (gi["profile"], gi["start"]) in pins else 1, gi["start"]))
    for instance in ordered:
        name = instance["profile"]
        if budget.get(name, 0) <= 0:
            continue
        if pins and any(pin[0] == name for pin in pins) and (name, instance["start"]) not in pins:
            # a pinned profile keeps only the instances at pinned starts, unless more unpinned ones are wanted
            pinned_count = sum(1 for pin in pins if pin[0] == name)
            if want["mig_devices"][name] <= pinned_count:
                continue
        keep.append(instance)
        budget[name] -= 1
    return keep


def plan_gpu(gpu, want, table):
    """Minimal steps for one GPU: [] when the layout already holds (profile multiset; pins when given).

    Returns {"steps", "mode_change", "pending"}: ``pending`` is true when a mode change already waits for a
    reset (nothing can be done until then).  ``table`` must be the GPU's table when MIG is (to be) enabled.
    """
    index = gpu["index"]
    instances = gpu.get("gpu_instances") or []
    current_mode, pending_mode = gpu.get("mode_current"), gpu.get("mode_pending")
    result = {"steps": [], "mode_change": False, "pending": False}
    if not gpu.get("mig_capable"):
        return result
    target_mode = 1 if want["mig_enabled"] else 0
    if current_mode != target_mode:
        if pending_mode == target_mode:
            result["pending"] = True  # already requested; only a reset makes it current
            return result
        steps = _destroy_steps(gpu, instances) if current_mode == 1 else []
        steps.append({"action": "set_mode", "gpu": index, "mode": target_mode})
        result["mode_change"] = True
        if target_mode == 1:
            placed = pack(table, want["mig_devices"], pinned=want["pins"])
            steps.extend(_create_steps(gpu, table, placed or []))
        result["steps"] = steps
        return result
    steps = []
    if pending_mode != current_mode:
        steps.append({"action": "set_mode", "gpu": index, "mode": target_mode})  # cancels the pending change
    if target_mode == 0:
        result["steps"] = steps
        return result
    keep = _keep_candidates(instances, want)
    kept_ids = {gi["id"] for gi in keep}
    remaining = dict(want["mig_devices"])
    for gi in keep:
        remaining[gi["profile"]] -= 1
    pins_left = [pin for pin in want["pins"] if not any((gi["profile"], gi["start"]) == pin for gi in keep)]
    placed = pack(table, {k: v for k, v in remaining.items() if v}, pinned=pins_left,
                  occupied=[(gi["profile"], gi["start"]) for gi in keep])
    if placed is None:  # the kept instances block a fit: rebuild the GPU from scratch
        keep, kept_ids = [], set()
        placed = pack(table, want["mig_devices"], pinned=want["pins"])
    steps.extend(_destroy_steps(gpu, [gi for gi in instances if gi["id"] not in kept_ids]))
    for gi in keep:
        if not gi.get("compute_instances"):
            steps.append({"action": "create_ci", "gpu": index, "profile": gi["profile"], "start": gi["start"]})
    steps.extend(_create_steps(gpu, table, placed or []))
    result["steps"] = steps
    return result


def predicted_layout(gpu, want, outcome):
    """The layout a GPU will have after its plan (what check mode reports as 'after')."""
    if not gpu.get("mig_capable") or want is None:
        return current_layout(gpu)
    if outcome["pending"]:
        return current_layout(gpu)
    return {"mig_enabled": want["mig_enabled"], "mig_devices": dict(want["mig_devices"]) if want["mig_enabled"] else {}}


def diff_text(gpus, layouts):
    return "".join("GPU %s (%s): %s\n" % (gpu["index"], gpu.get("pci_bus_id"), layout_text(layouts[gpu["index"]]))
                   for gpu in gpus)


def busy_gpus(gpus, plans, force):
    """GPUs the plan touches that run processes: [{index, pci_bus_id, pids}] (empty with force)."""
    if force:
        return []
    busy = []
    for gpu in gpus:
        outcome = plans.get(gpu["index"])
        if outcome and outcome["steps"] and gpu.get("processes"):
            busy.append({"index": gpu["index"], "pci_bus_id": gpu.get("pci_bus_id"),
                         "pids": sorted(proc["pid"] for proc in gpu["processes"])})
    return busy


# ---------------------------------------------------------------------------------------------
# Device-plugin strategies


def _registered(gpus):
    """The device plugin's MIG patterns for these GPUs: C == G profile names in NVML enum order (rm.go, see above)."""
    seen = {}
    for gpu in gpus:
        for name, entry in (gpu.get("profile_table") or {}).items():
            seen.setdefault(name, entry.get("enum", 0))
    return sorted(seen, key=lambda name: (seen[name], name)) or None


def advertised_resources(gpus, layouts):
    """Extended resources the NVIDIA device plugin advertises per MIG strategy, for the given layouts.

    Every GPU instance of a layout holds its default compute instance (C == G): one MIG device each.  ``mixed``
    is what plugin v0.20.0 and newer advertise (attribute profiles on their own: nvidia.com/mig-1g.10gb.me),
    ``mixed_legacy`` what v0.19.x and older advertise (unanchored patterns: a 1g.10gb+me device counts as
    nvidia.com/mig-1g.10gb); see the naming notes above.  ``single`` is None where the strategy cannot serve the
    node (see ``strategy_findings``): every MIG device is one nvidia.com/gpu.
    """
    whole = len(gpus)
    registered = _registered(gpus)
    mixed, legacy = {}, {}
    single_profiles, single_count, single_ok = set(), 0, bool(gpus)
    for gpu in gpus:
        layout = layouts[gpu["index"]]
        if layout["mig_enabled"]:
            for name, count in layout["mig_devices"].items():
                names = mig_resource_names(name, registered)
                for target, key in ((mixed, names["mixed"]), (legacy, names["mixed_legacy"])):
                    key = key or "nvidia.com/mig-" + name.replace("+", ".")
                    target[key] = target.get(key, 0) + count
                single_profiles.add(name)
                single_count += count
            if not layout["mig_devices"]:
                single_ok = False
        else:
            for target in (mixed, legacy):
                target["nvidia.com/gpu"] = target.get("nvidia.com/gpu", 0) + 1
            single_ok = False
    if len(single_profiles) > 1:
        single_ok = False
    return {
        "none": {"nvidia.com/gpu": whole} if whole else {},
        "single": {"nvidia.com/gpu": single_count} if single_ok else None,
        "mixed": dict(sorted(mixed.items())),
        "mixed_legacy": dict(sorted(legacy.items())),
    }


def strategy_findings(gpus, layouts, strategy):
    """Findings [{id, severity, expected, actual}] for layouts the chosen strategy cannot serve."""
    findings = []
    enabled = [gpu for gpu in gpus if layouts[gpu["index"]]["mig_enabled"]]
    if strategy == "none" and enabled:
        findings.append(finding(
            "mig_strategy_none_hides_slices", "error", "migStrategy mixed or single on a node with MIG-enabled GPUs",
            "migStrategy none: GPUs %s are MIG-enabled and their MIG devices are not advertised"
            % ", ".join(str(gpu["index"]) for gpu in enabled),
            "the device plugin's migStrategy is a choice: set mig_strategy (device_plugin_mig_strategy) to mixed or single"))
    if strategy == "single":
        profiles = {name for gpu in enabled for name in layouts[gpu["index"]]["mig_devices"]}
        disabled = [gpu["index"] for gpu in gpus if not layouts[gpu["index"]]["mig_enabled"]]
        empty = [gpu["index"] for gpu in enabled if not layouts[gpu["index"]]["mig_devices"]]
        if disabled or empty or len(profiles) != 1:
            findings.append(finding(
                "mig_strategy_single_mismatch", "error", "migStrategy single: every GPU MIG-enabled with one and the same profile",
                "MIG disabled on GPUs %s; without instances: %s; profiles: %s" % (disabled or "none", empty or "none", sorted(profiles) or "none"),
                "choose mig_strategy mixed, or one and the same profile on every GPU of the node"))
    return findings


def custom_compute_findings(gpus, plans):
    """GPU instances that stay and hold compute instances smaller than themselves (not default CIs)."""
    findings = []
    for gpu in gpus:
        outcome = plans.get(gpu["index"])
        if outcome is None or not gpu.get("mig_capable") or gpu.get("mode_current") != 1:
            continue
        destroyed = {step["gi_id"] for step in outcome["steps"] if step["action"] == "destroy_gi"}
        table = gpu.get("profile_table") or {}
        for instance in gpu.get("gpu_instances") or []:
            slices = (table.get(instance["profile"]) or {}).get("slices")
            cis = instance.get("compute_instances") or []
            if instance["id"] in destroyed or slices is None:
                continue
            small = [ci for ci in cis if ci.get("size") is not None and ci["size"] != slices]
            if small:
                device = "%dc.%s" % (small[0]["size"], instance["profile"])
                legacy = mig_resource_name(device, False, _registered([gpu]))
                findings.append(finding(
                    "mig_custom_compute_instances", "warning",
                    "one default compute instance in GPU instance %s (%s)" % (instance["id"], instance["profile"]),
                    "%d compute instance(s) of %s slice(s) (MIG devices %s): the device plugin v0.19.x and older "
                    "advertises each as one %s; v0.20.0 and newer match no resource pattern and do not start "
                    "(internal/rm/device_map.go)"
                    % (len(cis), ", ".join(sorted({str(ci["size"]) for ci in small})), device, legacy),
                    "use default compute instances (one per GPU instance)", gpu=gpu["index"]))
    return findings


def plan_node(gpus, entries, force, strategy):
    """The whole decision, pure: desired per GPU, per-GPU plans, layouts, findings, busy GPUs, unmatched entries."""
    desired, unmatched = resolve_entries(entries, gpus)
    written_in = origins(entries, gpus)
    for gpu in gpus:
        if gpu["index"] in desired:
            desired[gpu["index"]] = spelled(desired[gpu["index"]], gpu["profile_table"])
            try:
                validate(gpu, desired[gpu["index"]], gpu["profile_table"])
            except GpuhardenError as error:  # the GPU is named; the file and config say where to fix it
                where = written_in.get(gpu["index"])
                raise GpuhardenError("%s: %s" % (where, error.msg) if where else error.msg, **error.result) from None
    plans = {index: plan_gpu(gpu, desired[index], gpu["profile_table"])
             for index, gpu in ((gpu["index"], gpu) for gpu in gpus) if index in desired}
    before = {gpu["index"]: current_layout(gpu) for gpu in gpus}
    target = {gpu["index"]: predicted_layout(gpu, desired.get(gpu["index"]), {"pending": False}) for gpu in gpus}
    findings = []
    for gpu in gpus:
        index = gpu["index"]
        pending = gpu.get("mig_capable") and gpu.get("mode_current") != gpu.get("mode_pending")
        if index in desired and (before[index] != target[index] or pending or plans[index]["steps"]):
            findings.append(finding(
                "mig_layout_drift", "warning", layout_text(target[index]),
                layout_text(before[index]) + (" (mode change pending)" if pending else ""),
                "the mig stage drains the node and applies the layout", planned=bool(plans[index]["steps"]), gpu=index))
    findings.extend(strategy_findings(gpus, target, strategy))
    findings.extend(custom_compute_findings(gpus, plans))
    return {
        "desired": desired, "plans": plans, "before": before, "target": target, "findings": findings,
        "busy": busy_gpus(gpus, plans, force), "unmatched_entries": unmatched,
    }
