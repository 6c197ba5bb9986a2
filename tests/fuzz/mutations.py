# SPDX-License-Identifier: GPL-3.0-or-later
"""Mutations of a node root: special files, links, immutability, size, nesting, encodings, edits of real files.

A target is ``Target(node_path, kind)``; ``kind`` says which content mutations make sense (``yaml`` covers JSON, a
subset of YAML; ``toml``; ``lines``: unit files, env files, modprobe.d; ``colon``: the driver's ``Key: value`` files;
``cgroup``: one value; ``mig``: a mig-parted config).  ``FAMILIES`` maps a family to the kinds it applies to; the
strategies (``case_strategy``) draw a family, a target and a payload; ``apply`` makes the mutation on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import tomlkit
import yaml
from hypothesis import strategies as st

from tests.fuzz import engine
from tests.fuzz.engine import Case

ANY = ("yaml", "toml", "lines", "colon", "cgroup", "mig", "json")
STRUCTURED = ("yaml", "toml", "mig", "json")
# "dir": a directory the module lists (/dev, /proc/driver/nvidia/gpus): only what replaces or hides it applies
WITH_DIRS = ANY + ("dir",)


@dataclass(frozen=True)
class Target:
    path: str  # as the node sees it; an option name for kind "option"
    kind: str
    writes: bool = False  # the module may write this file


# family -> kinds it applies to
FAMILIES = {
    "none": WITH_DIRS + ("option",),  # the seed as it is: its success is judged like any other
    "fifo": WITH_DIRS,
    "directory": ANY,
    "regular_file": ("dir",),
    "device": WITH_DIRS,
    "socket": WITH_DIRS,
    "parent_is_file": ANY,
    "link_in_abs": ANY,
    "link_in_rel": ANY,
    "link_out_abs": WITH_DIRS,
    "link_out_rel": WITH_DIRS,
    "link_dangling": WITH_DIRS,
    "link_loop": WITH_DIRS,
    "immutable": ANY,
    "immutable_dir": ANY,
    "invalid_utf8": ANY,
    "nul_bytes": ANY,
    "truncate": ANY,
    "huge": ANY,
    "huge_scalar": STRUCTURED,
    "many_keys": STRUCTURED,
    "deep": STRUCTURED,
    "billion_laughs": ("yaml", "mig"),
    "edit": ANY,
    "race": ANY,
    "raw": (),  # exact bytes (payload[0]): pinned inputs of the regression tests, never generated
    # what an API server answers (device_plugin, tests/fuzz/apiserver.py)
    "api_strings": ("api",),
    "api_wrong_types": ("api",),
    "api_not_json": ("api",),
    "api_deep": ("api",),
    "api_huge": ("api",),
    "api_billion_laughs": ("api",),
    "option_dotdot": ("option",),
    "option_value": ("option",),
}
SPECIAL = ("fifo", "directory", "device", "socket", "parent_is_file", "link_in_abs", "link_in_rel", "link_out_abs",
           "link_out_rel", "link_dangling", "link_loop", "immutable", "immutable_dir")

# Hostile values for edits: every type confusion a config can hold, sizes, escapes, paths, injections.
VALUES = (
    None, "", " ", "null", "~", True, False, 0, -1, 1, 254, 255, 256, 2 ** 31, 2 ** 63, 10 ** 30, -10 ** 30, 1.5, 1e308,
    "x" * 300, "ünïcödé ✓", "a\nb", "tab\there", "../../../../etc/passwd", "/etc/shadow", "C:\\windows", "0x20B210DE",
    [], {}, [1, 2], ["MemoryQoS"], {"a": 1}, {"nested": {"deeper": [1, {"x": None}]}}, "1Gi", "single-numa-node",
    "static", "0-1", "none", "max", "all", "disabled", "1g.10gb", "3g.40gb@4", "7g.80gb", "{{ lookup('pipe','id') }}",
    "$(reboot)", "'; rm -rf /", "\u202e", "-", "--flag=x", "=", "[", "{", "#", "\\", "\"", "'",
)
CGROUP_VALUES = ("max", "max\n", "", "\n", "-1", "0", "1", "4096", " 4096 ", "12abc", "9" * 20, "9" * 30,
                 "18446744073709551615", "max max", "MAX", "1e9", "0x1000", "4096\n8192\n", "\u0664\u0660\u0669\u0666")


VALUE_TOKENS = st.one_of(st.integers(0, len(VALUES) - 1).map(lambda i: ("pool", i)),
                         st.integers(-2 ** 70, 2 ** 70).map(lambda n: ("int", n)),
                         st.text(max_size=40).map(lambda text: ("text", text)))


def _value_token(draw):
    return draw(VALUE_TOKENS)


def value_of(token):
    kind, value = token
    return VALUES[value] if kind == "pool" else value


# ---------------------------------------------------------------------------------------------------------------
# Strategies


@st.composite
def edit_ops(draw, kind):
    """A short list of edits for ``kind`` (hashable tuples)."""
    count = draw(st.integers(1, 4))
    ops = []
    for _ in range(count):
        if kind in ("yaml", "json", "mig", "toml"):
            op = draw(st.sampled_from(("set", "set", "delete", "add", "retype")
                                      + (("overlap", "duplicate_name", "profile", "count", "devices") if kind == "mig" else ())
                                      + (("inline_tables",) if kind == "toml" else ())))
            ops.append((op, draw(st.integers(0, 10 ** 6)), _value_token(draw)))
        elif kind == "cgroup":
            ops.append(("value", draw(st.integers(0, len(CGROUP_VALUES) - 1)), ("text", draw(st.text(max_size=12)))))
        else:  # lines, colon
            op = draw(st.sampled_from(("set", "delete", "duplicate", "junk", "append_token")))
            ops.append((op, draw(st.integers(0, 10 ** 6)), _value_token(draw)))
    style = draw(st.sampled_from(("keep", "block", "flow", "json", "json_compact"))) if kind in ("yaml", "json", "mig") else "keep"
    return (style, tuple(ops))


def payload_strategy(family, kind):
    if family in ("invalid_utf8", "nul_bytes", "truncate"):
        return st.integers(0, 100).map(lambda percent: (percent,))
    if family == "huge":
        return st.sampled_from(((5 * 1024 * 1024,), (20 * 1024 * 1024,)))
    if family == "many_keys":
        return st.sampled_from(((100000,), (30000,)))
    if family == "deep":
        return st.sampled_from(((200,), (10000,), (100000,)))
    if family == "billion_laughs":
        return st.sampled_from(((9, 9),))
    if family == "huge_scalar":
        return st.sampled_from(((20 * 1024 * 1024,), (2 * 1024 * 1024,)))
    if family == "edit":
        return edit_ops(kind)
    if family == "race":
        return st.just(("config-management agent",))
    if family == "option_dotdot":
        return st.integers(1, 12).map(lambda up: (up,))
    if family == "option_value":
        return VALUE_TOKENS.map(lambda token: (token,))
    return st.just(())


@st.composite
def case_strategy(draw, module, variants, targets_of, families=None):
    """A Case of ``module``: a variant, a target of it, a family that applies to the target's kind, a payload."""
    variant = draw(st.sampled_from(variants))
    targets = targets_of(variant)
    target = draw(st.sampled_from(targets))
    usable = [family for family, kinds in FAMILIES.items() if target.kind in kinds and (families is None or family in families)]
    if target.kind != "option" and not target.writes:
        usable = [family for family in usable if family != "race"]
    family = draw(st.sampled_from(usable))
    payload = draw(payload_strategy(family, target.kind))
    return Case(module, variant, family, "%s:%s:%d" % (target.kind, target.path, target.writes), payload)


def parse_target(text):
    kind, rest = text.split(":", 1)
    path, writes = rest.rsplit(":", 1)  # paths hold colons (PCI addresses)
    return Target(path, kind, writes == "1")


# ---------------------------------------------------------------------------------------------------------------
# Applying a mutation


def here(root, node_path):
    return Path(str(root) + "/" + node_path.lstrip("/"))


def _replace(path):
    """Remove whatever is at ``path`` (file, link, directory), keeping its parent."""
    if path.is_symlink() or path.is_file() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)


def _content(path):
    try:
        return path.read_bytes() if path.is_file() else b""
    except OSError:
        return b""


def apply(built, case, mutation):
    """Make ``case``'s mutation in ``built.root``; fills ``mutation`` (names, links, immutable, race, expect)."""
    target = parse_target(case.target)
    if case.family == "none":
        return None
    if target.kind == "option":
        return _apply_option(built, case, target, mutation)
    if target.kind == "api":
        return _apply_api(built, case, target, mutation)
    path = here(built.root, target.path)
    original = _content(path)
    mutation.names.extend(_names(built, target))
    if built.wrong_if is not None:
        mutation.wrong_if_success = built.wrong_if(case, target)
    family = case.family
    if family == "fifo":
        _replace(path)
        os.mkfifo(path)
    elif family == "directory":
        _replace(path)
        path.mkdir()
        (path / "inside").write_bytes(original or b"x")
    elif family == "regular_file":
        _replace(path)
        path.write_bytes(b"a file where the driver keeps a directory\n")
    elif family == "device":
        _replace(path)
        os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))  # an endless device (/dev/zero's numbers)
    elif family == "socket":
        _replace(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        here_now = os.getcwd()
        os.chdir(path.parent)  # a relative name: node-root paths can be longer than sun_path's 108 bytes
        try:
            server.bind(path.name)
        finally:
            os.chdir(here_now)
        built.cleanup.append(server.close)
    elif family == "parent_is_file":
        parent = path.parent
        if parent == built.root:
            parent = path
        mutation.names.append(str(parent).replace(str(built.root), "", 1) or "/")
        mutation.names.append(str(parent))
        _replace(parent)
        parent.write_bytes(b"a file where a directory should be\n")
    elif family.startswith("link_"):
        _link(built, path, original, family, mutation)
    elif family == "immutable":
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            mutation.names.append(str(path.parent))  # the refusal may be of another file the module writes there
            _chattr(path.parent, mutation)
        else:
            _chattr(path, mutation)
    elif family == "immutable_dir":
        path.parent.mkdir(parents=True, exist_ok=True)
        mutation.names.append(str(path.parent))
        _chattr(path.parent, mutation)
    elif family == "raw":
        _replace(path)
        path.write_bytes(case.payload[0])
    elif family == "race":
        if not path.exists():
            return
        text = original.decode("utf-8", "replace")
        mutation.race = {"path": str(path), "content": text + _comment_for(target.kind) + "changed by another writer\n",
                         "marker": str(built.outside.parent / "raced")}
    else:
        data = content_mutation(family, target.kind, original, case.payload)
        _replace(path)
        path.write_bytes(data)
        if family == "edit" and target.kind == "mig":
            mutation.expect = mig_expectation(data, built.args.get("selected"))


OUTSIDE_MARKER = b"\n# " + engine.OUTSIDE_MARKER.encode() + b"\n"


def _comments(name):
    return name.endswith((".toml", ".yaml", ".yml", ".conf", ".env", ".service"))


def _names(built, target):
    names = [target.path, str(here(built.root, target.path))]
    names.extend(built.names.get(target.path, ()))
    names.extend(built.names.get("*", ()))  # what the variant itself may be refused for
    return names


def _comment_for(kind):
    return {"toml": "\n# ", "yaml": "\n# ", "mig": "\n# ", "lines": "\n# "}.get(kind, "\n# ")


def _chattr(path, mutation):
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode == 0:
        mutation.immutable.append(path)


def _link(built, path, original, family, mutation):
    """Replace ``path`` with a link; the content it pointed to lives inside the root (in) or outside it (out)."""
    name = path.name
    _replace(path)
    if family in ("link_in_abs", "link_in_rel"):
        real = here(built.root, "/srv/elsewhere/" + name)
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_bytes(original or b"")
        text = "/srv/elsewhere/" + name if family == "link_in_abs" else os.path.relpath(real, path.parent)
        mutation.links.append((str(path), str(real)))
    elif family in ("link_out_abs", "link_out_rel"):
        real = built.outside / name
        # a comment only the copy outside the root holds: seen in the module's output or in a file it wrote, it
        # was read through the link, out of the root
        real.write_bytes((original or b"") + (OUTSIDE_MARKER if _comments(path.name) else b""))
        text = str(real) if family == "link_out_abs" else os.path.relpath(real, path.parent)
        mutation.links.append((str(path), None))  # the outside snapshot covers what it points to
    elif family == "link_dangling":
        text = "/nonexistent/" + name
        mutation.links.append((str(path), None))
    else:  # link_loop
        other = path.with_name(name + ".loop")
        os.symlink(name, other)
        text = other.name
        mutation.links.append((str(path), None))
    os.symlink(text, path)


LAUGHS = "\n".join(['lol0: &l0 ["lol"]'] + ["lol%d: &l%d [%s]" % (level, level, ", ".join(["*l%d" % (level - 1)] * 9))
                                                for level in range(1, 10)]) + "\n"


def _apply_api(built, case, target, mutation):
    """Make the API server answer ``target.path`` (a list or an object) the hostile way."""
    server, path, family = built.server, target.path, case.family
    mutation.names.extend(built.names.get(path, ()))
    current = server.objects.get(path)
    if family == "api_strings":
        server.objects[path] = ["a string", "another"] if isinstance(current, list) else "a string"
    elif family == "api_wrong_types":
        wrong = {"metadata": ["not", "a", "mapping"], "spec": "text", "data": [1, 2]}
        server.objects[path] = [wrong, 42, None] if isinstance(current, list) else wrong
    elif family == "api_not_json":
        server.override[path] = b"<html><body>502 Bad Gateway</body></html>"
    elif family == "api_deep":
        server.override[path] = b'{"kind": "List", "items": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    elif family == "api_huge":
        server.override[path] = json.dumps({"kind": "List", "items": [], "padding": "x" * (20 * 1024 * 1024)}).encode()
    elif family == "api_billion_laughs":
        if isinstance(current, dict):
            server.objects[path] = dict(current, data={"config.yaml": LAUGHS})
        elif isinstance(current, list):
            mutation.names.append("config")


def _apply_option(built, case, target, mutation):
    option = target.path
    mutation.names.extend([option] + list(built.names.get(option, ())) + list(built.names.get("*", ())))
    if case.family == "option_dotdot":
        up = case.payload[0]
        value = built.args.get(option) or "/"
        built.args[option] = "/" + "/".join([".."] * up) + "/" + built.outside.name + "/" + os.path.basename(str(value).rstrip("/"))
    else:
        built.args[option] = value_of(case.payload[0])


# ---------------------------------------------------------------------------------------------------------------
# Content


def content_mutation(family, kind, original, payload):
    if family == "invalid_utf8":
        at = len(original) * payload[0] // 100
        return original[:at] + b"\xff\xfe\xc3(" + original[at:]
    if family == "nul_bytes":
        at = len(original) * payload[0] // 100
        return original[:at] + b"\x00\x00" + original[at:]
    if family == "truncate":
        return original[:len(original) * payload[0] // 100]
    if family == "huge":
        line = {"toml": b"# padding padding padding padding padding\n", "yaml": b"# padding padding padding padding\n",
                "mig": b"# padding padding padding padding\n", "json": b" " * 63 + b"\n"}.get(kind, b"padding padding padding\n")
        return original + line * (payload[0] // len(line))
    if family == "huge_scalar":
        if kind == "toml":
            return b"huge = \"" + b"x" * payload[0] + b"\"\n" + original
        return original.rstrip(b"\n") + b"\nhugeScalar: \"" + b"x" * payload[0] + b"\"\n"
    if family == "many_keys":
        if kind == "toml":
            return original + b"\n[generated]\n" + b"".join(b"k%d = %d\n" % (i, i) for i in range(payload[0]))
        if kind == "json":
            return json.dumps({"k%d" % i: i for i in range(payload[0])}).encode()
        return original.rstrip(b"\n") + b"\ngenerated:\n" + b"".join(b"  k%d: %d\n" % (i, i) for i in range(payload[0]))
    if family == "deep":
        depth = payload[0]
        if kind == "toml":
            return original + b"\ndeep = " + b"[" * depth + b"]" * depth + b"\n"
        return original.rstrip(b"\n") + b"\ndeep: " + b"[" * depth + b"]" * depth + b"\n"
    if family == "billion_laughs":
        width, levels = payload
        lines = [b'lol0: &l0 ["lol"]']
        for level in range(1, levels + 1):
            lines.append(b"lol%d: &l%d [" % (level, level) + b", ".join([b"*l%d" % (level - 1)] * width) + b"]")
        return original.rstrip(b"\n") + b"\n" + b"\n".join(lines) + b"\n"
    if family == "edit":
        return edit_content(kind, original, payload)
    raise AssertionError("unknown family %s" % family)


def _key_paths(data, prefix=()):
    paths = []
    if isinstance(data, dict):
        for key, value in data.items():
            paths.append(prefix + (key,))
            paths.extend(_key_paths(value, prefix + (key,)))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            paths.append(prefix + (index,))
            paths.extend(_key_paths(value, prefix + (index,)))
    return paths


def _container(data, path):
    for part in path[:-1]:
        data = data[part]
    return data


def _set(data, path, value):
    if not path:
        return value
    _container(data, path)[path[-1]] = value
    return data


def _retype(value):
    if isinstance(value, dict):
        return list(value)[:1]
    if isinstance(value, list):
        return {"0": value[0] if value else None}
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return [value]
    return {}


def edit_content(kind, original, payload):
    style, ops = payload
    text = original.decode("utf-8", "replace")
    if kind in ("yaml", "json", "mig"):
        return _edit_yaml(kind, text, style, ops)
    if kind == "toml":
        return _edit_toml(text, ops)
    if kind == "cgroup":
        op = ops[-1]
        return (CGROUP_VALUES[op[1] % len(CGROUP_VALUES)] if op[1] % 3 else op[2][1]).encode("utf-8", "surrogatepass")
    return _edit_lines(kind, text, ops)


def _edit_yaml(kind, text, style, ops):
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, (dict, list)):
        data = {}
    duplicate_names = []
    for op, selector, token in ops:
        paths = _key_paths(data)
        value = value_of(token)
        if op in ("set", "retype", "delete") and paths:
            path = paths[selector % len(paths)]
            if op == "delete":
                container = _container(data, path)
                del container[path[-1]]
            else:
                current = _container(data, path)[path[-1]]
                data = _set(data, path, _retype(current) if op == "retype" else value)
        elif op == "add" and isinstance(data, dict):
            data["fuzz%d" % (selector % 97)] = value
        elif kind == "mig":
            data, duplicate_names = _edit_mig(data, op, selector, value, duplicate_names)
    try:
        if style == "json" or (style == "keep" and kind == "json"):
            out = json.dumps(data, indent=2, default=str)
        elif style == "json_compact":
            out = json.dumps(data, default=str)
        else:
            out = yaml.safe_dump(data, default_flow_style=(style == "flow"), sort_keys=False, allow_unicode=True)
    except (ValueError, yaml.YAMLError):
        out = text
    for name in duplicate_names:  # a repeated config name: only text can hold it
        out = out.rstrip("\n") + "\n" if style not in ("json", "json_compact", "flow") else out
        if style not in ("json", "json_compact", "flow") and "mig-configs:" in out:
            out = out.replace("mig-configs:\n", "mig-configs:\n  %s:\n  - devices: all\n    mig-enabled: false\n" % name, 1)
    return out.encode("utf-8", "surrogatepass")


def _edit_mig(data, op, selector, value, duplicate_names):
    configs = data.get("mig-configs") if isinstance(data, dict) else None
    if not isinstance(configs, dict) or not configs:
        return data, duplicate_names
    names = sorted(configs, key=str)
    name = names[selector % len(names)]
    entries = configs[name]
    if op == "duplicate_name":
        duplicate_names.append(name)
        return data, duplicate_names
    if not isinstance(entries, list) or not entries:
        return data, duplicate_names
    entry = entries[selector % len(entries)]
    if not isinstance(entry, dict):
        return data, duplicate_names
    if op == "overlap":
        entries.append(dict(entry, devices=[selector % 4] if entry.get("devices") == "all" else "all"))
    elif op == "profile":
        devices = entry.get("mig-devices") if isinstance(entry.get("mig-devices"), dict) else {}
        entry["mig-devices"] = dict(devices, **{str(value): 1})
        entry["mig-enabled"] = True
    elif op == "count" and isinstance(entry.get("mig-devices"), dict) and entry["mig-devices"]:
        key = sorted(entry["mig-devices"], key=str)[selector % len(entry["mig-devices"])]
        entry["mig-devices"][key] = value
    elif op == "devices":
        entry["devices"] = value
    return data, duplicate_names


def mig_expectation(data, selected):
    """"refused" when the file is one mig-parted v0.15.0 applies wrongly: a repeated config name (it keeps the last
    silently), or two entries of the selected config without device-filter that name one GPU index (it applies both in
    turn; see node/_mig.py resolve_entries)."""
    try:
        parsed = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):
        return None
    text = data.decode("utf-8", "replace")
    if not isinstance(parsed, dict) or not isinstance(parsed.get("mig-configs"), dict):
        return None
    for name in parsed["mig-configs"]:
        if text.count("\n  %s:\n" % name) > 1:
            return "refused"
    entries = parsed["mig-configs"].get(selected)
    seen = set()
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("device-filter"):
            continue
        devices = entry.get("devices")
        named = set(range(8)) if devices == "all" else {i for i in devices if isinstance(i, int)} if isinstance(devices, list) else set()
        if named & seen:
            return "refused"
        seen |= named
    return None


def _edit_toml(text, ops):
    try:
        doc = tomlkit.parse(text)
    except Exception:  # noqa: BLE001 (tomlkit raises several types; the mutation then starts from an empty document)
        doc = tomlkit.document()
    for op, selector, token in ops:
        plain = doc.unwrap()
        paths = _key_paths(plain)
        value = value_of(token)
        if op == "inline_tables" and "plugins" in doc:
            inline = tomlkit.inline_table()
            inline.update(doc["plugins"].unwrap() if hasattr(doc["plugins"], "unwrap") else {})
            doc["plugins"] = inline
            continue
        if value is None:
            value = "null"
        if op == "add":
            doc["fuzz%d" % (selector % 97)] = value
            continue
        if not paths:
            continue
        path = paths[selector % len(paths)]
        try:
            container = doc
            for part in path[:-1]:
                container = container[part]
            if op == "delete":
                del container[path[-1]]
            else:
                current = container[path[-1]]
                new = _retype(current.unwrap() if hasattr(current, "unwrap") else current) if op == "retype" else value
                container[path[-1]] = new if new is not None else "null"
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    try:
        return tomlkit.dumps(doc).encode("utf-8", "surrogatepass")
    except Exception:  # noqa: BLE001 (a value tomlkit cannot write: keep the text)
        return text.encode("utf-8", "surrogatepass")


def _edit_lines(kind, text, ops):
    lines = text.splitlines()
    for op, selector, token in ops:
        value = value_of(token)
        token_text = json.dumps(value) if not isinstance(value, str) else value
        index = selector % len(lines) if lines else 0
        if op == "set" and lines:
            key, sep, _old = lines[index].partition(":" if kind == "colon" else "=")
            lines[index] = key + (sep or (":" if kind == "colon" else "=")) + " " + token_text
        elif op == "delete" and lines:
            del lines[index]
        elif op == "duplicate" and lines:
            lines.insert(index, lines[index])
        elif op == "junk":
            lines.insert(index, token_text)
        elif op == "append_token" and lines:
            lines[index] = lines[index] + " " + token_text
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
