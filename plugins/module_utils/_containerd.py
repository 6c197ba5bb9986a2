# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""containerd's CRI runtime for NVIDIA: read the config and its imports, plan the smallest edit.

``read_config_set`` reads the main file and every file its ``imports`` globs pull in, in containerd's
load order (the main file, then its imports breadth first, each glob sorted), and parses each file once
with tomlkit.  ``plan_runtime`` is pure: it takes those parsed files and returns a plan whose
``changes`` are ``_files.FileChange`` objects with the new text, comments and ordering kept.

How containerd combines the files decides where the runtime goes:

* config ``version = 3`` (containerd 2.x) merges plugin sections key by key, later files winning; a
  new runtime goes into the drop-in (``99-nvidia.toml`` in the directory an import glob covers), the
  layout ``nvidia-ctk`` >= 1.18 writes, and an existing definition is corrected where it wins.
* config ``version = 2`` may run on containerd 1.x, which replaces a whole plugin section with the one
  of the last file that defines it; the runtime goes into that file (usually the main file), because a
  drop-in holding only the runtime would wipe every other CRI setting there.
* version 1 configs (no ``version`` key) are refused with a message, not guessed at.
"""

from __future__ import annotations

import copy
import fnmatch
import glob
import os
import re

from ansible_collections.gpuharden.k8s.plugins.module_utils._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils._files import FileChange, read_text

try:
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    HAS_TOMLKIT = True
    TOMLKIT_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - the module reports missing_required_lib
    import traceback

    HAS_TOMLKIT = False
    TOMLKIT_IMPORT_ERROR = traceback.format_exc()

CRI_PLUGINS = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
SUPPORTED_VERSIONS = tuple(sorted(CRI_PLUGINS))
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
GLOB_MAGIC = re.compile(r"[*?\[]")
DROP_IN_HEADER = "# The NVIDIA container runtime for containerd, managed by gpuharden.k8s.containerd_nvidia_runtime.\n"


class ConfigFile:
    """One parsed containerd config file: ``path`` as the node sees it, ``real_path`` under root."""

    def __init__(self, path, real_path, text, doc):
        self.path = path
        self.real_path = real_path
        self.text = text
        self.doc = doc
        self.imports = []  # resolved node paths, filled by read_config_set


def _type_name(value):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _show(value):
    if hasattr(value, "unwrap"):
        value = value.unwrap()
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _wrong_type(path, field, value, expected):
    return GpuhardenError("%s: %s must be %s, got %s %s" % (path, field, expected, _type_name(value), _show(value)),
                          path=path, field=field)


def parse_toml(path, text):
    """A tomlkit document, or a GpuhardenError naming the file, line and column."""
    try:
        return tomlkit.parse(text)
    except TOMLKitError as error:
        line = getattr(error, "line", None)
        col = getattr(error, "col", None)
        where = " (line %s, column %s)" % (line, col) if line is not None else ""
        message = str(error).split(" at line ", maxsplit=1)[0]
        raise GpuhardenError("%s: invalid TOML%s: %s; nothing was changed" % (path, where, message), path=path) from None


def _root_join(root, path):
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def node_path(root, real):
    if root in ("", "/"):
        return real
    return "/" + os.path.relpath(real, root)


def import_patterns(config):
    """The file's ``imports`` as absolute node-path patterns (relative ones are relative to its directory)."""
    imports = config.doc.get("imports", [])
    if not isinstance(imports, list):
        raise _wrong_type(config.path, "imports", imports, "an array of path strings")
    patterns = []
    for index, pattern in enumerate(imports):
        if not isinstance(pattern, str) or not pattern:
            raise _wrong_type(config.path, "imports[%d]" % index, pattern, "a non-empty path string")
        patterns.append(os.path.normpath(pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(config.path), pattern)))
    return patterns


def read_config_set(root, path):
    """Read and parse the main config and every file it imports, in containerd's load order."""
    real = _root_join(root, path)
    text = read_text(real)
    if text is None:
        raise GpuhardenError("%s: no containerd config file; generate one (containerd config default) before adding a runtime" % path, path=path)
    files = []
    pending = [(path, real, text, None)]
    seen = set()
    while pending:
        file_path, real_path, content, importer = pending.pop(0)
        key = os.path.realpath(real_path)
        if key in seen:
            continue
        seen.add(key)
        if content is None:
            content = read_text(real_path)
            if content is None:
                raise GpuhardenError("%s: imports %s, which does not exist; containerd refuses to start like that" % (importer, file_path),
                                     path=importer, field="imports", value=file_path)
        config = ConfigFile(file_path, real_path, content, parse_toml(file_path, content))
        files.append(config)
        for pattern in import_patterns(config):
            real_pattern = _root_join(root, pattern)
            matches = sorted(glob.glob(real_pattern)) if GLOB_MAGIC.search(pattern) else [real_pattern]
            for match in matches:
                if GLOB_MAGIC.search(pattern) and os.path.isdir(match):
                    continue
                resolved = node_path(root, match)
                config.imports.append(resolved)
                pending.append((resolved, match, None, config.path))
    return files


# ---------------------------------------------------------------------------------------------
# reading the CRI section of one file


def _table(config, parent, key, field):
    """parent[key] as a table, None when absent, an error when it is something else."""
    if parent is None or key not in parent:
        return None
    value = parent[key]
    if not isinstance(value, dict):
        raise _wrong_type(config.path, field, value, "a table")
    return value


def file_version(config, main_version=None):
    """The file's config version; None for a version 1 file that has nothing for the CRI plugin."""
    version = config.doc.get("version")
    if version is None:
        if main_version is None:
            raise GpuhardenError(
                "%s: no `version` key, so containerd reads it as config version 1, which this module does not edit; "
                "migrate it first (containerd config migrate > new.toml) and set version = 2 or 3" % config.path,
                path=config.path, field="version")
        if "plugins" in config.doc:
            raise GpuhardenError(
                "%s: imported file has a `plugins` table but no `version` key (config version 1); "
                "add version = %d so its plugin paths are read as intended" % (config.path, main_version),
                path=config.path, field="version")
        return None
    if isinstance(version, bool) or not isinstance(version, int):
        raise _wrong_type(config.path, "version", version, "an integer (2 or 3)")
    if version not in SUPPORTED_VERSIONS:
        raise GpuhardenError("%s: version = %d is not a containerd config version this module edits (2 or 3)" % (config.path, version),
                             path=config.path, field="version", value=int(version))
    if main_version is not None and version > main_version:
        raise GpuhardenError("%s: imported file has version = %d, newer than the main config's version = %d; containerd refuses that"
                             % (config.path, version, main_version), path=config.path, field="version", value=int(version))
    return version


class CriView:
    """The CRI plugin section of one file, type-checked."""

    def __init__(self, config, version):
        self.config = config
        self.version = version
        self.plugin = CRI_PLUGINS[version]
        self.prefix = 'plugins."%s"' % self.plugin
        plugins = _table(config, config.doc, "plugins", "plugins")
        self.cri = _table(config, plugins, self.plugin, self.prefix)
        self.containerd = _table(config, self.cri, "containerd", self.prefix + ".containerd")
        self.runtimes = _table(config, self.containerd, "runtimes", self.prefix + ".containerd.runtimes")
        if self.runtimes is not None:
            for name in self.runtimes:
                runtime = _table(config, self.runtimes, name, self.runtime_field(name))
                _table(config, runtime, "options", self.runtime_field(name) + ".options")

    def runtime_field(self, name):
        return "%s.containerd.runtimes.%s" % (self.prefix, _quote_key(name))

    @property
    def defines_cri(self):
        return self.cri is not None

    def runtime(self, name):
        return None if self.runtimes is None else self.runtimes.get(name)

    def default_runtime_name(self):
        if self.containerd is None or "default_runtime_name" not in self.containerd:
            return None
        value = self.containerd["default_runtime_name"]
        if not isinstance(value, str):
            raise _wrong_type(self.config.path, self.prefix + ".containerd.default_runtime_name", value, "a string")
        return str(value)

    def enable_cdi(self):
        if self.cri is None or "enable_cdi" not in self.cri:
            return None
        value = self.cri["enable_cdi"]
        if not isinstance(value, bool):
            raise _wrong_type(self.config.path, self.prefix + ".enable_cdi", value, "a boolean")
        return bool(value)


def _quote_key(name):
    return name if re.match(r"^[A-Za-z0-9_-]+$", name) else '"%s"' % name


def _plain(value):
    return value.unwrap() if hasattr(value, "unwrap") else copy.deepcopy(value)


def _merge(into, other):
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


# ---------------------------------------------------------------------------------------------
# the plan


def validate_params(params):
    name = params["runtime_name"]
    if not isinstance(name, str) or not DNS_LABEL.match(name):
        raise GpuhardenError("runtime_name=%r: must be a DNS label (lowercase letters, digits and '-', at most 63), because a "
                             "RuntimeClass handler must equal it" % (name,), field="runtime_name", value=name)
    for field in ("binary_name", "drop_in", "path"):
        value = params[field]
        if not isinstance(value, str) or not os.path.isabs(value):
            raise GpuhardenError("%s=%r: must be an absolute path" % (field, value), field=field, value=value)
    if not params["drop_in"].endswith(".toml"):
        raise GpuhardenError("drop_in=%r: must name a .toml file" % params["drop_in"], field="drop_in", value=params["drop_in"])
    if not params["base_runtime"] or not isinstance(params["base_runtime"], str):
        raise GpuhardenError("base_runtime=%r: must be a runtime name" % (params["base_runtime"],), field="base_runtime")
    if not params["runtime_type"] or not isinstance(params["runtime_type"], str):
        raise GpuhardenError("runtime_type=%r: must be a containerd shim name" % (params["runtime_type"],), field="runtime_type")


def _drop_in_target(files, drop_in):
    """Where a new drop-in goes: the configured path when an import glob covers it, else the same file
    name in the directory of the first ``<dir>/<glob>`` import that would load it; None without one."""
    patterns = [pattern for config in files for pattern in import_patterns(config)]
    for pattern in patterns:
        if fnmatch.fnmatchcase(drop_in, pattern):
            return drop_in
    name = os.path.basename(drop_in)
    for pattern in patterns:
        directory, base = os.path.split(pattern)
        if not GLOB_MAGIC.search(directory) and GLOB_MAGIC.search(base) and fnmatch.fnmatchcase(name, base):
            return os.path.join(directory, name)
    return None


def desired_runtime(base, params):
    """The runtime table to create: the base runtime cloned, with our runtime_type and BinaryName."""
    runtime = copy.deepcopy(base) if base else {}
    runtime["runtime_type"] = params["runtime_type"]
    options = runtime.get("options") or {}
    options["BinaryName"] = params["binary_name"]
    runtime["options"] = options
    return runtime


def required_settings(base_options, params):
    """(key path, value) pairs an existing runtime must have; other keys it has are left alone."""
    settings = [(("runtime_type",), params["runtime_type"])]
    for key, value in (base_options or {}).items():
        if key != "BinaryName":
            settings.append((("options", key), value))
    settings.append((("options", "BinaryName"), params["binary_name"]))
    return settings


def _same(left, right):
    """Equal and of the same TOML type (true is not 1)."""
    if isinstance(left, (tuple, list)) and isinstance(right, (tuple, list)):
        return len(left) == len(right) and all(_same(left[index], right[index]) for index in range(len(left)))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[key], right[key]) for key in left)
    return type(left) is type(right) and left == right


def _get_path(table, keys):
    for key in keys:
        if not isinstance(table, dict) or key not in table:
            return None, False
        table = table[key]
    return table, True


def plan_runtime(files, params, root="/"):
    """Decide every edit; returns a plan dict.  Pure: ``files`` come from read_config_set."""
    validate_params(params)
    name = params["runtime_name"]
    main = files[0]
    version = file_version(main)
    merge = version >= 3
    views = []
    for config in files:
        file_ver = version if config is main else file_version(config, version)
        if file_ver is not None:
            views.append(CriView(config, file_ver))
    main_view = views[0]
    warnings = []

    # The files whose CRI section counts.  v2: only the last file defining it (containerd 1.x replaces
    # the whole section per file); v3: all of them, merged in load order.
    cri_views = [view for view in views if view.defines_cri]
    if merge:
        effective_views = cri_views
    else:
        effective_views = [cri_views[-1]] if cri_views else [main_view]
        shadowed = [view.config.path for view in cri_views[:-1] if view.runtime(name) is not None]
        if shadowed:
            raise GpuhardenError(
                "%s: defines runtime %r, but %s also defines the CRI plugin section and, with config version 2, containerd 1.x "
                "uses only the last file's section; move the runtime there or merge the files" % (shadowed[0], name, effective_views[0].config.path),
                path=shadowed[0], field=effective_views[0].runtime_field(name))

    def effective(getter):
        value = None
        for view in effective_views:
            got = getter(view)
            if got is None:
                continue
            value = _merge(value if isinstance(value, dict) else {}, got) if isinstance(got, dict) else got
        return value

    current = effective(lambda view: _plain(view.runtime(name)) if view.runtime(name) is not None else None)
    default_name = effective(lambda view: view.default_runtime_name())
    cdi = effective(lambda view: view.enable_cdi())
    base_name = params["base_runtime"]
    base = effective(lambda view: _plain(view.runtime(base_name)) if view.runtime(base_name) is not None else None)
    if base is None and default_name and default_name != name:
        base_name = default_name
        base = effective(lambda view: _plain(view.runtime(default_name)) if view.runtime(default_name) is not None else None)
        if base is not None:
            warnings.append("no runtime %r in %s; options copied from the default runtime %r" % (params["base_runtime"], main.path, default_name))
    if base is None:
        base_name = None
        warnings.append("no runtime %r to copy options from in %s: the %s runtime gets only runtime_type and BinaryName "
                        "(check SystemdCgroup matches the kubelet's cgroupDriver)" % (params["base_runtime"], main.path, name))
    base_options = (base or {}).get("options") or {}
    if base is not None and not isinstance(base_options, dict):
        raise _wrong_type(main.path, "runtimes.%s.options" % base_name, base_options, "a table")

    # Where each thing is written.
    defining = [view for view in effective_views if view.runtime(name) is not None]
    new_drop_in = None
    if defining:
        runtime_view = defining[-1]
    elif merge:
        target = _drop_in_target(files, params["drop_in"])
        runtime_view = None
        if target is not None:
            for view in views:
                if os.path.normpath(view.config.path) == target:
                    runtime_view = view
            if runtime_view is None:
                new_drop_in = target
        else:
            runtime_view = main_view
    else:
        runtime_view = effective_views[-1]

    edits = {}  # config path -> list of (description, function(doc, cri plugin id))
    actions = []

    def edit(view_or_path, description, function):
        key = view_or_path if isinstance(view_or_path, str) else view_or_path.config.path
        edits.setdefault(key, []).append((description, function))
        actions.append(description)

    if current is None:
        wanted = desired_runtime(base, params)

        def add_runtime(doc, cri_id):
            _insert_runtime(doc, cri_id, name, wanted, base_name)

        edit(new_drop_in or runtime_view, "add runtime %r to %s" % (name, new_drop_in or runtime_view.config.path), add_runtime)
        desired = wanted
    else:
        missing = [(keys, value) for keys, value in required_settings(base_options, params) if not _same(_get_path(current, keys), (value, True))]
        desired = _merge(copy.deepcopy(current), {})
        for keys, value in required_settings(base_options, params):
            _set_plain(desired, keys, value)
        if missing:
            def fix_runtime(doc, cri_id):
                table = _ensure_tables(doc, ["plugins", cri_id, "containerd", "runtimes", name])
                for keys, value in missing:
                    parent = table
                    for key in keys[:-1]:
                        if key not in parent:
                            sub = tomlkit.table()
                            sub.trivia.indent = "\n" + _header_indent(parent)
                            parent.append(key, sub)
                        parent = parent[key]
                    _set_key(parent, keys[-1], value)

            fields = ", ".join(".".join(keys) for keys, _value in missing)
            edit(runtime_view, "update %s of runtime %r in %s" % (fields, name, runtime_view.config.path), fix_runtime)

    settings_target = new_drop_in or runtime_view
    if params["set_as_default"] and default_name != name:
        setters = [view for view in effective_views if view.default_runtime_name() is not None]
        where = setters[-1] if setters else settings_target

        def set_default(doc, cri_id):
            _set_key(_ensure_tables(doc, ["plugins", cri_id, "containerd"]), "default_runtime_name", name)

        edit(where, "set default_runtime_name = %r in %s (was %r)" % (name, where if isinstance(where, str) else where.config.path, default_name), set_default)
    if params["enable_cdi"] and cdi is not True:
        setters = [view for view in effective_views if view.enable_cdi() is not None]
        where = setters[-1] if setters else settings_target

        def set_cdi(doc, cri_id):
            _set_key(_ensure_tables(doc, ["plugins", cri_id]), "enable_cdi", True)

        edit(where, "set enable_cdi = true in %s" % (where if isinstance(where, str) else where.config.path), set_cdi)

    changes = []
    by_path = {view.config.path: view for view in views}
    for path, steps in edits.items():
        reason = "; ".join(description for description, _function in steps)
        if path in by_path:
            view = by_path[path]
            doc = parse_toml(view.config.path, view.config.text)  # a private copy: the input stays untouched
            for _description, function in steps:
                function(doc, view.plugin)
            changes.append(FileChange(view.config.real_path, view.config.text, tomlkit.dumps(doc), reason=reason))
        else:
            doc = tomlkit.document()
            doc.add("version", version)
            for _description, function in steps:
                function(doc, CRI_PLUGINS[version])
            changes.append(FileChange(_root_join(root, path), None, DROP_IN_HEADER + tomlkit.dumps(doc), mode=0o644, reason=reason))

    plan = {
        "runtime_name": name,
        "config_version": version,
        "files": [config.path for config in files],
        "runtime_file": new_drop_in or runtime_view.config.path,
        "base_runtime": base_name,
        "current": {"runtime": current, "default_runtime_name": default_name, "enable_cdi": cdi},
        "desired": {"runtime": desired,
                    "default_runtime_name": name if params["set_as_default"] else default_name,
                    "enable_cdi": True if params["enable_cdi"] else cdi},
        "actions": actions,
        "changes": [change for change in changes if change.changed],
        "warnings": warnings,
    }
    if plan["changes"]:
        _self_check(files, plan, params, root)
    return plan


def _set_plain(table, keys, value):
    for key in keys[:-1]:
        table = table.setdefault(key, {})
    table[keys[-1]] = copy.deepcopy(value)


def _ensure_tables(doc, keys, super_last=False):
    table = doc
    for index, key in enumerate(keys):
        if key not in table:
            new = tomlkit.table(is_super_table=super_last or index < len(keys) - 1)
            table[key] = new
        table = table[key]
    return table


def _insert_runtime(doc, cri_id, name, wanted, base_name):
    """Add the runtime table after the existing runtimes, with the base runtime's indentation."""
    runtimes = _ensure_tables(doc, ["plugins", cri_id, "containerd", "runtimes"], super_last=True)
    base = runtimes.get(base_name) if base_name else None
    header_indent, key_indent, options_indent, option_key_indent = "", "  ", "", "  "
    if base is not None and hasattr(base, "trivia"):
        header_indent = base.trivia.indent.replace("\n", "")
        key_indent = _first_key_indent(base, header_indent + "  ")
        options = base.get("options")
        if options is not None and hasattr(options, "trivia"):
            options_indent = options.trivia.indent.replace("\n", "")
            option_key_indent = _first_key_indent(options, options_indent + "  ")
        else:
            options_indent, option_key_indent = header_indent, key_indent
    else:
        options_indent, option_key_indent = header_indent, key_indent
    table = tomlkit.table()
    options_table = tomlkit.table()
    for key, value in wanted.items():
        if key == "options":
            continue
        table.add(key, _item(value, key_indent))
    for key, value in wanted["options"].items():
        options_table.add(key, _item(value, option_key_indent))
    options_table.add(tomlkit.nl())
    for trailing in _detach_trailing_comments(runtimes):
        options_table.add(trailing)
    table.append("options", options_table)
    table.trivia.indent = header_indent if _ends_with_blank_line(runtimes) else "\n" + header_indent
    options_table.trivia.indent = "\n" + options_indent
    _raw_set(runtimes, name, table)


def _detach_trailing_comments(container):
    """Comments at the very end of the last table belong to whatever follows it (tomlkit keeps them with the
    table above); take them off so that they stay in front of the next table after the insertion."""
    table = container
    while True:
        body = getattr(getattr(table, "value", None), "body", None)
        if not body:
            return []
        last_key, last = body[-1]
        if last_key is not None and isinstance(last, dict) and hasattr(last, "value"):
            table = last
            continue
        break
    index = len(body)
    while index > 0 and body[index - 1][0] is None and isinstance(body[index - 1][1], (tomlkit.items.Comment, tomlkit.items.Whitespace)):
        index -= 1
    tail = body[index:]
    if not any(isinstance(item, tomlkit.items.Comment) for _key, item in tail):
        return []
    # keep the blank line(s) that close the table, move the comment block
    first_comment = next(position for position, (_key, item) in enumerate(tail) if isinstance(item, tomlkit.items.Comment))
    moved = [item for _key, item in tail[first_comment:]]
    del body[index + first_comment:]
    return moved


def _ends_with_blank_line(container):
    """Whether the text before an appended table already ends with an empty line."""
    body = getattr(getattr(container, "value", None), "body", None)
    if not body:
        return True
    last = body[-1][1]
    text = last.as_string() if hasattr(last, "as_string") else ""
    return text.endswith("\n\n") or text == "\n"


def _header_indent(table):
    return table.trivia.indent.replace("\n", "") if hasattr(table, "trivia") else ""


def _set_key(table, key, value):
    """Set a key: an existing one keeps its place and comment, a new one goes after the table's other
    keys (before its sub-tables), indented like them."""
    if value is None:
        return
    if key in table:
        table[key] = copy.deepcopy(value)
        return
    indent = _first_key_indent(table, _header_indent(table) + "  " if _header_indent(table) else "")
    new = _item(value, indent)
    body = getattr(getattr(table, "value", None), "body", None)
    if body is None:
        table[key] = new
        return
    position = len(body)
    for index, (existing_key, existing) in enumerate(body):
        if existing_key is not None and isinstance(existing, dict):
            position = index
            break
    # keys go after the last key/value line, not after trailing blank lines or comments of the header block
    while position > 0 and body[position - 1][0] is None:
        position -= 1
    if position == len(body) or not body:
        table.raw_append(key, new) if hasattr(table, "raw_append") else table.append(key, new)
    else:
        after_key = body[position - 1][0] if position > 0 else None
        if after_key is None:
            table.raw_append(key, new)
        else:
            table.value._insert_after(after_key, key, new)
        dict.__setitem__(table, key, table.value[key])


def _first_key_indent(table, fallback):
    for key, value in table.value.body:
        if key is not None and hasattr(value, "trivia") and not isinstance(value, dict):
            return value.trivia.indent.replace("\n", "")
    return fallback


def _item(value, indent):
    item = tomlkit.item(copy.deepcopy(value))
    item.trivia.indent = indent
    return item


def _raw_set(container, key, table):
    if hasattr(container, "raw_append"):
        container.raw_append(key, table)
    else:  # an out-of-order table proxy: its own __setitem__ keeps our indentation
        container[key] = table


def _self_check(files, plan, params, root):
    """Re-read the planned texts as containerd would and confirm they define exactly what was planned."""
    texts = {change.path: change.after for change in plan["changes"]}
    reparsed = []
    for config in files:
        text = texts.pop(config.real_path, config.text)
        clone = ConfigFile(config.path, config.real_path, text, parse_toml(config.path + " (planned)", text))
        clone.imports = config.imports
        reparsed.append(clone)
    for real_path, text in texts.items():  # a new drop-in
        new_path = node_path(root, real_path)
        reparsed.append(ConfigFile(new_path, real_path, text, parse_toml(new_path + " (planned)", text)))
    again = plan_runtime_view(reparsed, params)
    if again != plan["desired"]:
        raise GpuhardenError("internal check failed: the planned files would define %r, not %r; nothing was changed" % (again, plan["desired"]))


def plan_runtime_view(files, params):
    """The effective runtime, default runtime and enable_cdi of a set of files (used by the self-check)."""
    main = files[0]
    version = file_version(main)
    views = [CriView(config, version if config is main else file_version(config, version)) for config in files
             if config is main or file_version(config, version) is not None]
    cri_views = [view for view in views if view.defines_cri]
    effective_views = cri_views if version >= 3 else (cri_views[-1:] or views[:1])
    name = params["runtime_name"]
    runtime = default_name = cdi = None
    for view in effective_views:
        if view.runtime(name) is not None:
            runtime = _merge(runtime or {}, _plain(view.runtime(name)))
        if view.default_runtime_name() is not None:
            default_name = view.default_runtime_name()
        if view.enable_cdi() is not None:
            cdi = view.enable_cdi()
    return {"runtime": runtime, "default_runtime_name": default_name, "enable_cdi": cdi}


# ---------------------------------------------------------------------------------------------
# Options and the whole decision, shared by containerd_nvidia_runtime and node_audit


def argument_spec():
    return {
        "root": {"type": "path", "default": "/"},
        "path": {"type": "path", "default": "/etc/containerd/config.toml"},
        "runtime_name": {"type": "str", "default": "nvidia"},
        "binary_name": {"type": "path", "default": "/usr/bin/nvidia-container-runtime"},
        "runtime_type": {"type": "str", "default": "io.containerd.runc.v2"},
        "base_runtime": {"type": "str", "default": "runc"},
        "set_as_default": {"type": "bool", "default": False},
        "enable_cdi": {"type": "bool", "default": False},
        "drop_in": {"type": "path", "default": "/etc/containerd/conf.d/99-nvidia.toml"},
        "backup": {"type": "bool", "default": False},
    }


def decide(params):
    """Validate, read the whole config set, plan (nothing changes here)."""
    validate_params(params)
    files = read_config_set(params["root"], params["path"])
    return plan_runtime(files, params, root=params["root"])
