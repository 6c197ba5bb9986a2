# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Bounded YAML and TOML parsing, with errors a person can act on.

A config a node module reads is checked before it is built into objects: its size, how deep it nests, how many
nodes it holds once every alias is expanded (a YAML "billion laughs" is a few hundred bytes that expand to 10^9
nodes; anything that walks the result, a validator or a dump, then never ends) and, for YAML, aliases that contain
themselves and duplicate keys.  The check walks the parser's event stream, which both PyYAML and ruamel.yaml produce
without recursion, so a document nested 100,000 deep is refused before the recursive composer sees it.

Errors are one line: ``<file>: line L, column C: <what is wrong>``, never the parser's multi-line report.
"""

from __future__ import annotations

import json
import re
import traceback

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

try:
    import yaml

    HAS_YAML = True
    YAML_IMPORT_ERROR = None
except ImportError:  # guarded: the modules report the missing library (_module_shell requires)
    yaml = None
    HAS_YAML = False
    YAML_IMPORT_ERROR = traceback.format_exc()
try:
    from ruamel.yaml.error import YAMLError as RuamelYAMLError
except ImportError:
    RuamelYAMLError = None

# Real kubelet, containerd, mig-parted and device plugin configs are a few KiB and a few hundred nodes, nested
# less than 10 deep; NVIDIA's own mig-parted config-default.yaml (v0.15.0) is about 3,000 nodes.
MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_NODES = 50000


def _where(source, mark):
    if mark is None:
        return source
    return "%s: line %d, column %d" % (source, mark.line + 1, mark.column + 1)


def _one_line(text):
    return " ".join(str(text).split())


def _refuse(source, mark, what, fix):
    raise GpuhardenError("%s: %s" % (_where(source, mark), what), fix=fix)


def yaml_error_message(source, error):
    """A PyYAML or ruamel.yaml error as one line: file, line, column, the problem (no parser internals)."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or getattr(error, "context", None) or "not valid YAML"
    context = getattr(error, "context", None)
    if context and context != problem:
        problem = "%s (%s)" % (problem, context)
    return "%s: %s" % (_where(source, mark), _one_line(problem))


def _size(text, source, max_bytes):
    if len(text) > max_bytes:
        raise GpuhardenError("%s: %d characters, more than the %d gpuharden parses in one config: refusing it"
                             % (source, len(text), max_bytes), fix="check what this file is; a config is a few KiB")


def check_yaml_events(events, source, max_depth=MAX_DEPTH, max_nodes=MAX_NODES, duplicate_keys=True):
    """Walk a YAML event stream (PyYAML's or ruamel.yaml's) and refuse what no config needs.

    Counts every node with aliases expanded (an alias counts the whole node it names), the nesting depth, and refuses
    an alias inside the node it names (a recursive document) and, where ``duplicate_keys``, a mapping that repeats a
    plain key (YAML forbids it; parsers that accept it keep one of the two values silently).
    """
    stack = []  # one frame per open collection: [anchor, nodes so far, mark, keys seen (mapping) or None, position]
    sizes = {}  # anchor -> expanded node count of the finished node
    open_anchors = set()
    total = 0
    for event in events:
        kind = type(event).__name__
        if kind in ("StreamStartEvent", "StreamEndEvent", "DocumentStartEvent", "DocumentEndEvent"):
            continue
        mark = getattr(event, "start_mark", None)
        if kind in ("MappingStartEvent", "SequenceStartEvent"):
            _count_as_child(stack, event, source, duplicate_keys)
            if len(stack) >= max_depth:
                _refuse(source, mark, "nested more than %d levels deep" % max_depth,
                        "flatten the document: no config gpuharden reads nests this deep")
            stack.append([event.anchor, 1, mark, {} if kind == "MappingStartEvent" else None, 0])
            if event.anchor:
                open_anchors.add(event.anchor)
            continue
        if kind in ("MappingEndEvent", "SequenceEndEvent"):
            anchor, count, _mark, _keys, _position = stack.pop()
            if anchor:
                sizes[anchor] = count
                open_anchors.discard(anchor)
            if stack:
                stack[-1][1] += count
            else:
                total += count
        elif kind == "AliasEvent":
            if event.anchor in open_anchors:
                _refuse(source, mark, "alias *%s refers to a node that contains it (a recursive document)" % event.anchor,
                        "replace the alias with the content it should repeat")
            _count_as_child(stack, event, source, duplicate_keys)
            count = sizes.get(event.anchor, 1)
            if stack:
                stack[-1][1] += count
            else:
                total += count
        else:  # ScalarEvent
            _count_as_child(stack, event, source, duplicate_keys)
            if event.anchor:
                sizes[event.anchor] = 1
            if stack:
                stack[-1][1] += 1
            else:
                total += 1
        expanded = total + sum(frame[1] for frame in stack)
        if expanded > max_nodes:
            _refuse(source, mark, "more than %d nodes once its aliases are expanded (aliases repeated inside aliases?)"
                    % max_nodes, "write the content out, without aliases of aliases; no config gpuharden reads is this big")


def _count_as_child(stack, event, source, duplicate_keys):
    """Track mapping keys: every other child of a mapping is a key; a repeated plain scalar key is refused."""
    if not stack or stack[-1][3] is None:
        return
    frame = stack[-1]
    position = frame[4]
    frame[4] += 1
    if position % 2 or not duplicate_keys or type(event).__name__ != "ScalarEvent":
        return
    key = event.value
    mark = getattr(event, "start_mark", None)
    if key in frame[3]:
        first = frame[3][key]
        _refuse(source, mark, "key %r appears twice in one mapping (first at line %d)" % (key[:80], first.line + 1 if first else 0),
                "keep one of them: YAML forbids repeated keys, and parsers disagree on which one wins")
    frame[3][key] = mark


def safe_load(text, source, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, max_nodes=MAX_NODES, duplicate_keys=True):
    """PyYAML ``safe_load`` of ``text`` after the bounds check; every error one line naming ``source``."""
    _size(text, source, max_bytes)
    try:
        check_yaml_events(yaml.parse(text, Loader=yaml.SafeLoader), source, max_depth, max_nodes, duplicate_keys)
        return yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506 (the safe loader)
    except yaml.YAMLError as error:
        raise GpuhardenError(yaml_error_message(source, error), fix="fix the YAML at that line") from None


def round_trip_load(loader, text, source, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, max_nodes=MAX_NODES):
    """``loader.load(text)`` (a configured ruamel.yaml ``YAML`` instance, e.g. typ="rt") after the bounds check;
    every error one line naming ``source``.  ruamel.yaml refuses duplicate keys itself (DuplicateKeyError)."""
    _size(text, source, max_bytes)
    try:
        check_yaml_events(loader.parse(text), source, max_depth, max_nodes, duplicate_keys=True)
        return loader.load(text)
    except RuamelYAMLError as error:
        raise GpuhardenError(yaml_error_message(source, error), fix="fix the YAML at that line") from None


# ---------------------------------------------------------------------------------------------------------------
# TOML (tomlkit parses recursively: a deep inline nesting is a RecursionError, a huge file minutes)


def check_toml(text, source, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH):
    """Refuse a TOML document too big or nested too deep for tomlkit, before tomlkit sees it.

    Counts the nesting of inline arrays and tables outside strings and comments (TOML 1.0: basic and literal
    strings, their multi-line forms, ``#`` comments); table headers do not nest and are not counted.
    """
    _size(text, source, max_bytes)
    depth = deepest = 0
    line, column_start = 1, 0
    position, end = 0, len(text)
    while position < end:
        char = text[position]
        if char == "\n":
            line += 1
            column_start = position + 1
        elif char == "#":
            newline = text.find("\n", position)
            position = end if newline < 0 else newline
            continue
        elif char in "\"'":
            position, line, column_start = _skip_toml_string(text, position, line, column_start)
            continue
        elif (char in "[{" and depth) or char == "{" or (char == "[" and _inline_array_start(text, position)):
            depth += 1  # inside a value every bracket nests; outside, "[" opens a value only after "="
        elif char in "]}" and depth:
            depth -= 1
        if depth > deepest:
            deepest = depth
            if deepest > max_depth:
                raise GpuhardenError("%s: line %d, column %d: inline arrays or tables nested more than %d deep"
                                     % (source, line, position - column_start + 1, max_depth),
                                     fix="flatten the document: no config gpuharden reads nests this deep")
        position += 1


def _inline_array_start(text, position):
    """Whether ``[`` at ``position`` (outside any inline value) opens a value, not a table header: a value follows
    ``=`` on its line."""
    line_start = text.rfind("\n", 0, position) + 1
    return "=" in text[line_start:position]


def _skip_toml_string(text, position, line, column_start):
    quote = text[position]
    triple = text.startswith(quote * 3, position)
    delimiter = quote * 3 if triple else quote
    index = position + len(delimiter)
    while index < len(text):
        char = text[index]
        if char == "\\" and quote == '"':
            index += 2
            continue
        if char == "\n":
            line += 1
            column_start = index + 1
            if not triple:
                return index, line - 1, column_start  # an unterminated string: tomlkit reports it
        if text.startswith(delimiter, index):
            index += len(delimiter)
            while triple and index < len(text) and text[index] == quote:  # up to two quotes may end the content
                index += 1
            return index, line, column_start
        index += 1
    return index, line, column_start


def toml_error_message(source, error):
    """A tomlkit parse error as one line: file, line, column, the problem."""
    line = getattr(error, "line", None)
    column = getattr(error, "col", None)
    message = _one_line(error)
    if line is not None:
        message = message.split(" at line ", maxsplit=1)[0]
        return "%s: line %s, column %s: %s" % (source, line, (column or 0) + 1, message)
    return "%s: %s" % (source, message)


# ---------------------------------------------------------------------------------------------------------------
# JSON: json.loads recurses once per nesting level and keeps the last of two equal keys, so the depth is checked
# on the text first and duplicates are refused while decoding.

JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def json_position(text, offset):
    line = text.count("\n", 0, offset) + 1
    return "line %d, column %d" % (line, offset - (text.rfind("\n", 0, offset) + 1) + 1)


def _refuse_constant(name):
    raise ValueError("%s is not a JSON value" % name)


def _unique_keys(source):
    def build(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise GpuhardenError("%s: key %s appears twice in one object" % (source, json.dumps(key[:80])),
                                     fix="keep one of them: decoders disagree on which one wins")
            seen[key] = value
        return seen
    return build


def json_load(text, source, what="document", not_json=None, not_json_fix=None,
              max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, max_nodes=MAX_NODES, duplicate_keys=True):
    """The JSON document ``text`` (object order kept), bounded in size, depth and values like the YAML above; NaN and
    Infinity refused; a key twice in one object refused unless ``duplicate_keys`` is false (then the last wins, as in
    Go's encoding/json); every error one line naming ``source`` (``what`` names the kind of file in the fixes)."""
    if len(text) > max_bytes:
        raise GpuhardenError("%s: %d characters, more than the %d gpuharden parses in one config: refusing it"
                             % (source, len(text), max_bytes), fix="check what this file is; a %s is a few KiB" % what)
    depth = 0
    for match in re.finditer(r"[\[\]{}]", JSON_STRING.sub(lambda found: " " * len(found.group(0)), text)):
        depth += 1 if match.group(0) in "[{" else -1
        if depth > max_depth:
            raise GpuhardenError("%s: %s: nested more than %d levels deep" % (source, json_position(text, match.start()), max_depth),
                                 fix="flatten the document: no %s nests this deep" % what)
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys(source) if duplicate_keys else None, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        note = " (%s)" % not_json if not_json else ""
        raise GpuhardenError("%s: %s: not JSON: %s%s" % (source, json_position(text, error.pos), error.msg, note),
                             fix=not_json_fix or "write the %s as JSON" % what) from None
    except ValueError as error:
        raise GpuhardenError("%s: not JSON: %s" % (source, error), fix="write numbers as numbers") from None
    pending, count = [doc], 0
    while pending:
        value = pending.pop()
        count += 1
        if count > max_nodes:
            raise GpuhardenError("%s: more than %d values: refusing it" % (source, max_nodes),
                                 fix="check what this file is; a %s holds a few hundred values" % what)
        if isinstance(value, dict):
            pending.extend(value.values())
            count += len(value)
        elif isinstance(value, list):
            pending.extend(value)
    return doc
