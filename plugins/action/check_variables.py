# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Controller-side action gpuharden.k8s.check_variables: refuse misspelt or invalid gpuharden variables before a run.

Ansible ignores a variable nobody reads, so `kubelet_topology_tppology_manager_policy: none` in a host_vars file
leaves the role default in force and the run reports success; and a role checks its variables' types and choices
(its meta/argument_specs.yml) only when it starts, after earlier stages have changed nodes.  This action, the first
task of every playbook, checks on the controller, before any task contacts a node:

* the names: each variable with the collection's prefixes (``gpuharden_`` and each role's name plus ``_``) must be
  one the collection knows, else the failure names the closest known name;
* the values: each role option (roles/*/meta/argument_specs.yml) and each playbook variable (meta/variables.yml),
  templated as the role would see it (the host's value, else the role default), must fit its type and choices
  (Ansible's own ArgumentSpecValidator, as the role's validate_argument_spec task would run it) and, for a few
  playbook variables, its format (a count or a percentage).  A value that cannot be templated yet (it uses a
  variable set later in the run) is reported as not validated, never guessed;
* the play keywords: a variable that feeds a play keyword (hosts, serial, max_fail_percentage) is read before any
  host's variables exist (ansible-core 2.19 ``executor/playbook_executor.py`` and ``executor/task_queue_manager.py``
  template the play with ``VariableManager.get_vars(play=play)``: role defaults, play vars, vars_files, extra vars
  and magic vars, no inventory), so an inventory value would be silently ignored: it is refused, with where to set it.

It runs once for the play (``run_once``, delegated to localhost: no connection to a node is opened): the first serial
batch's run checks every host of every batch, so that a later batch's mistake stops the run before the first batch
is changed, and the later batches' runs rely on it.  It reads the collection's own files next to this plugin, so it
works from an installed tarball:

* ``roles/*/meta/argument_specs.yml`` (every option of every entry point, with its type and choices),
* ``roles/*/defaults/main.yml`` and ``roles/*/vars/main.yml`` (their keys; the defaults are what a role sees when the
  host sets nothing),
* ``meta/variables.yml`` (the playbooks' own gpuharden_* variables, with their type, choices, format and play keyword),
* the names the collection's tasks set themselves (``register:`` and ``set_fact`` keys in ``roles/*/tasks``,
  ``roles/*/handlers``, ``playbooks/`` and ``playbooks/tasks/``), which later plays of a run still see.

The functions above ActionModule are pure (a ``load(path)`` callable reads YAML), for the unit tests.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import os
import re
from collections import namedtuple

import jinja2
import jinja2.meta
import yaml
from ansible.errors import AnsibleActionFail, AnsibleError, AnsibleUndefinedVariable
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._role_options import FOLLOWED

try:  # where a value was read (file:line:col): ansible-core 2.19 tags what its loader reads; not a public API yet
    from ansible._internal._datatag._tags import Origin
except ImportError:  # pragma: no cover (another ansible-core: the messages name no file)
    Origin = None

COLLECTION_PREFIX = "gpuharden_"
ALLOW_VARIABLE = "gpuharden_allow_unknown_variables"
EXTRA_VARIABLE = "gpuharden_known_extra_variables"
# A name without one of the prefixes is still reported when it is this close to a known name: a typo in the
# prefix itself (kubelet_toplogy_cpu_manager_policy).  High, so that a site's own variables do not trip it.
PREFIX_TYPO_CUTOFF = 0.9
SUGGESTION_CUTOFF = 0.6
SET_FACT_ACTIONS = ("set_fact", "ansible.builtin.set_fact", "ansible.legacy.set_fact")
# Hosts named in the failure message per variable before "and N more".
HOSTS_SHOWN = 5
# Keys of an option's spec that are no type check: a role option's `required` holds for the role's own entry point
# (checked when it starts), and the check looks only at values that are there; `format` and `play_keyword` are
# meta/variables.yml's own (below).
NOT_VALIDATED_KEYS = ("description", "default", "required", "version_added", "format", "play_keyword")

Collection = namedtuple("Collection", "prefixes known option_specs option_defaults variable_specs play_keywords")


def _count(text, most=None):
    match = re.match(r"^\s*([0-9]+)\s*(%?)\s*$", text)
    return bool(match) and not (match.group(2) and most is not None and int(match.group(1)) > most)


def _scalar_text(value):
    """str(value) for a number or a string, None for anything else (a bool is no count)."""
    return str(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else None


def _is_count_or_percent(value):
    # the disruption budget's own reading: plugins/module_utils/cluster/_disruption.py resolve_budget
    text = _scalar_text(value)
    return text is not None and _count(text, most=100)


def _is_serial(value):
    # ansible-core 2.19 playbook/play.py: serial is a list (a scalar becomes one), each item a count or "N%"
    # (utils/helpers.py pct_to_int)
    items = value if isinstance(value, list) else [value]
    return all(_scalar_text(item) is not None and _count(_scalar_text(item)) for item in items)


def _is_percentage(value):
    # ansible-core 2.19 playbook/base.py: a "percent" attribute (max_fail_percentage) drops one "%" and reads a float
    text = _scalar_text(value)
    try:
        number = float(text.strip().removesuffix("%")) if text is not None else None
    except ValueError:
        return False
    return number is not None and 0 <= number <= 100


# format name (meta/variables.yml) -> (test, what a valid value looks like)
FORMATS = {
    "count_or_percent": (_is_count_or_percent, "a number of nodes (1) or a percentage of the GPU fleet up to 100% (25%)"),
    "serial": (_is_serial, "a number of hosts (2), a percentage of them (25%) or a list of those ([1, '50%'])"),
    "percentage": (_is_percentage, "a percentage from 0 to 100 (0, 50 or '50%')"),
}


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """Safe YAML that reads Ansible's !unsafe and !vault values as plain data (only the names matter here)."""


def _untagged(loader, _suffix, node):
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_scalar(node)


_Loader.add_multi_constructor("!", _untagged)


def load_yaml(path):
    # Ansible's own DataLoader takes ~7x longer for the ~40 files.
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_Loader)  # noqa: S506 (a safe loader)


def collection_root():
    """The collection's top directory: plugins/action/<this file> -> ../.."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _yaml_files(directory):
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory) if name.endswith((".yml", ".yaml")))


def _load_mapping(load, path):
    if not os.path.isfile(path):
        return {}
    data = load(path)
    return data if isinstance(data, dict) else {}


def names_set_by_tasks(data):
    """Variable names a task file or playbook sets itself: register: targets and set_fact keys, at any depth."""
    names = set()
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if isinstance(item.get("register"), str):
                names.add(item["register"])
            for action in SET_FACT_ACTIONS:
                if isinstance(item.get(action), dict):
                    names.update(key for key in item[action] if key != "cacheable")
            stack.extend(value for value in item.values() if isinstance(value, list | dict))
    return names


def role_names(root):
    roles = os.path.join(root, "roles")
    if not os.path.isdir(roles):
        return []
    return sorted(name for name in os.listdir(roles) if os.path.isdir(os.path.join(roles, name)) and not name.startswith("."))


def variable_entry(entry):
    """A meta/variables.yml entry as a spec: a mapping (description, type, choices, elements, format, play_keyword),
    or a plain description string (no type: nothing to validate)."""
    return dict(entry) if isinstance(entry, dict) else {"description": entry}


def read_collection(root, load):
    """The collection below ``root`` (``load(path)`` returns a YAML file's data): a Collection of

    prefixes, known (every name the collection knows), option_specs ({role option: [distinct specs over the entry
    points]}), option_defaults ({role default: raw value}), variable_specs ({meta/variables.yml name: spec}),
    play_keywords ({meta/variables.yml name: the play keyword it feeds}).
    """
    roles = role_names(root)
    prefixes = (COLLECTION_PREFIX,) + tuple(role + "_" for role in roles)
    variables = _load_mapping(load, os.path.join(root, "meta", "variables.yml")).get("variables") or {}
    variable_specs = {name: variable_entry(entry) for name, entry in variables.items()}
    known = set(variable_specs)
    option_specs, option_defaults = {}, {}
    task_files = _yaml_files(os.path.join(root, "playbooks")) + _yaml_files(os.path.join(root, "playbooks", "tasks"))
    for role in roles:
        base = os.path.join(root, "roles", role)
        specs = _load_mapping(load, os.path.join(base, "meta", "argument_specs.yml")).get("argument_specs") or {}
        for entry in specs.values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                distinct = option_specs.setdefault(name, [])
                if spec not in distinct:
                    distinct.append(spec)
        defaults = _load_mapping(load, os.path.join(base, "defaults", "main.yml"))
        option_defaults.update(defaults)
        known.update(option_specs, defaults, _load_mapping(load, os.path.join(base, "vars", "main.yml")))
        task_files += _yaml_files(os.path.join(base, "tasks")) + _yaml_files(os.path.join(base, "handlers"))
    for path in task_files:
        known.update(names_set_by_tasks(load(path)))
    play_keywords = {name: spec["play_keyword"] for name, spec in variable_specs.items() if spec.get("play_keyword")}
    return Collection(prefixes, frozenset(known), option_specs, option_defaults, variable_specs, play_keywords)


def known_variables(root, load):
    """(prefixes, known names) of the collection below ``root``."""
    collection = read_collection(root, load)
    return collection.prefixes, collection.known


def _is_extra(name, extra):
    return any(name == pattern or fnmatch.fnmatchcase(name, pattern) for pattern in extra)


def unknown_variables(names, prefixes, known, extra=()):
    """[(name, suggestion or None)] for the names in ``names`` the collection does not know.

    A name counts when it has one of ``prefixes``, or when it is within PREFIX_TYPO_CUTOFF of a known name (the
    prefix itself misspelt).  Names starting with ``_`` (internal) or ``ansible_`` never count, nor those ``extra``
    (names or shell patterns) allows.
    """
    found = []
    for name in sorted(set(names)):
        if name in known or name.startswith(("_", "ansible_")) or _is_extra(name, extra):
            continue
        prefixed = name.startswith(prefixes)
        match = _closest(name, known, SUGGESTION_CUTOFF if prefixed else PREFIX_TYPO_CUTOFF)
        if match or prefixed:
            found.append((name, match))
    return found


@functools.lru_cache(maxsize=4096)
def _closest(name, known, cutoff):
    # the hosts of a play share most names (group_vars, magic variables): one search per name for the run
    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=cutoff)
    return match[0] if match else None


_JINJA = jinja2.Environment()  # parses only, to find the names a template reads; Ansible's own engine renders
# values a key is built from: plain data (a HostVars or another lazy view has no stable repr)
_PLAIN = (str, int, float, bool, type(None), list, dict)


def _strings(value):
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())


@functools.lru_cache(maxsize=4096)
def template_names(text):
    """The variable names a template string reads, None when it does not parse (Ansible's templating then says why)."""
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(_JINJA.parse(text)))
    except jinja2.TemplateError:
        return None


def template_key(raw, variables):
    """A key equal for two hosts whenever ``raw`` templates to the same value for both: ``raw`` and the raw values of
    every variable its templates read, followed through those variables' own templates; None when that cannot be told
    (a template that does not parse, or an input that is no plain data).  Templating costs a Jinja compile per value
    and host; hosts that share their group_vars share the result."""
    seen, inputs, stack = set(), [], [raw]
    while stack:
        for text in _strings(stack.pop()):
            names = template_names(text) if "{{" in text or "{%" in text else frozenset()
            if names is None:
                return None
            for name in sorted(names - seen):
                seen.add(name)
                value = variables.get(name, _strings)  # _strings: a marker no variable holds
                if value is not _strings and not isinstance(value, _PLAIN):
                    return None
                inputs.append((name, "-" if value is _strings else repr(value)))
                stack.append(value if value is not _strings else None)
    return repr(raw), tuple(inputs)


def validator_spec(spec):
    """An option's spec as ArgumentSpecValidator takes it: type, choices, elements, options (with their own
    ``required``) and the like, without the keys that are no check of a value that is there."""
    return {key: value for key, value in spec.items() if key not in NOT_VALIDATED_KEYS}


def value_errors(name, value, specs):
    """The errors of ``value`` for variable ``name`` against each of its ``specs`` (type and choices with Ansible's
    ArgumentSpecValidator, as a role's validate_argument_spec task runs it; then the spec's ``format``), [] if none."""
    errors = []
    for spec in specs:
        result = ArgumentSpecValidator({name: validator_spec(spec)}).validate({name: value})
        messages = list(result.error_messages)
        fmt = spec.get("format")
        if not messages and fmt and value is not None:
            if fmt not in FORMATS:
                messages.append("%s has an unknown format %r in the collection's meta/variables.yml" % (name, fmt))
            elif not FORMATS[fmt][0](result.validated_parameters.get(name)):
                messages.append("%s must be %s, got %r" % (name, FORMATS[fmt][1], value))
        errors.extend(message for message in messages if message not in errors)
    return errors


def origin_text(value):
    """Where Ansible read ``value`` (path:line:col), or None (an extra var given as key=value, a default)."""
    origin = Origin.get_tag(value) if Origin is not None else None
    return str(origin) if origin is not None and getattr(origin, "path", None) else None


def _distinct(items):
    found = []
    for item in items:
        if item not in found:
            found.append(item)
    return found


def play_keyword_refusals(host_values, play_names, play_keywords):
    """[(name, keyword, [hosts], [distinct values], [distinct origins])] for each variable that feeds a play keyword and
    that a host has while the play (extra vars, play vars: what the keyword sees) has not: an inventory value the
    keyword never reads.  ``host_values`` is {host: {name: (value, origin or None)}} of the names each host has."""
    refusals = []
    for name in sorted(play_keywords):
        hosts = sorted(host for host, values in host_values.items() if name in values)
        if hosts and name not in play_names:
            found = [host_values[host][name] for host in hosts]
            refusals.append((name, play_keywords[name], hosts, _distinct(value for value, _origin in found),
                             _distinct(origin for _value, origin in found if origin)))
    return refusals


def _hosts_text(hosts):
    hosts = sorted(hosts)
    return ", ".join(hosts[:HOSTS_SHOWN]) + (" and %d more" % (len(hosts) - HOSTS_SHOWN) if len(hosts) > HOSTS_SHOWN else "")


def failure_message(unknown_by_host, lead="unknown variables, nothing was changed"):
    """One line per unknown name: the suggestion and the hosts that have it."""
    hosts_by_name, suggestion = {}, {}
    for host, unknown in unknown_by_host.items():
        for name, match in unknown:
            hosts_by_name.setdefault(name, []).append(host)
            suggestion[name] = match
    lines = []
    for name in sorted(hosts_by_name):
        hint = "did you mean %s?" % suggestion[name] if suggestion[name] else "no gpuharden.k8s variable is close"
        lines.append("%s (%s) on %s" % (name, hint, _hosts_text(hosts_by_name[name])))
    return (
        "%s: %s. The collection reads none of them, so its defaults would apply. Fix the name, or list your own "
        "variables in %s (names or patterns), or set %s=true to only warn."
        % (lead, "; ".join(lines), EXTRA_VARIABLE, ALLOW_VARIABLE)
    )


def invalid_message(invalid_by_host):
    """One part per (variable, error, origin): the error (Ansible's words, which name the variable), the hosts and the
    file the value was read from, where Ansible knows it."""
    hosts_by_error = {}
    for host, errors in invalid_by_host.items():
        for name, error, origin in errors:
            hosts_by_error.setdefault((name, error, origin or ""), []).append(host)
    parts = ["%s (on %s%s)" % (error, _hosts_text(hosts), "; set in %s" % origin if origin else "")
             for (_name, error, origin), hosts in sorted(hosts_by_error.items())]
    return ("invalid variable values, nothing was changed: %s. Fix the value where it is set (inventory, group_vars, "
            "host_vars or -e); the roles' and playbooks' variables are listed with their types in the collection's "
            "roles/*/meta/argument_specs.yml and meta/variables.yml." % "; ".join(parts))


def play_keyword_message(refusals):
    parts = ["%s is set to %s in the inventory of %s%s, but only the play keyword %s reads it"
             % (name, " or ".join(repr(value) for value in values), _hosts_text(hosts),
                " (%s)" % ", ".join(origins) if origins else "", keyword)
             for name, keyword, hosts, values, origins in refusals]
    example = " ".join("-e %s=%s" % (name, values[0]) for name, _keyword, _hosts, values, _origins in refusals)
    return ("variables the run would ignore, nothing was changed: %s. Ansible templates a play's hosts, serial and "
            "max_fail_percentage once for the play, before any host's variables exist, so an inventory value "
            "(group_vars, host_vars, the hosts file) never reaches them. Give them as extra vars instead (%s, with "
            "ansible-playbook or gpuharden drift) and remove them from the inventory." % ("; ".join(parts), example))


def _as_list(value, where):
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return list(value)
    raise AnsibleActionFail("%s on %s must be a list of variable names or patterns, got %r" % (EXTRA_VARIABLE, where, value))


def _as_bool(value, where):
    if isinstance(value, bool) or value is None:
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0", ""):
        return False
    raise AnsibleActionFail("%s on %s must be a boolean, got %r" % (ALLOW_VARIABLE, where, value))


def _trusted(value):
    """A role default read by this plugin, trusted as a template as Ansible trusts the role's own files."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    return value


class ActionModule(ActionBase):
    """Thin shell: gather each host's variables as its tasks would see them, and what the play keywords see; the pure
    functions above decide."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def _play_view(self):
        """(a callable host name -> that host's variables as a task of this play sees them, the names the play keywords
        see), from the play's VariableManager, as the strategy and PlaybookExecutor compute them; (None, None) where
        ansible-core does not hand them to the worker."""
        manager = self._task.get_variable_manager()
        inventory = getattr(manager, "_inventory", None)
        play = self._task.play
        if manager is None or inventory is None or play is None:
            return None, None

        def host_variables(name):
            host = inventory.get_host(name)
            return manager.get_vars(play=play, host=host, task=self._task) if host is not None else None

        return host_variables, set(manager.get_vars(play=play))

    def _template(self, templar, raw, variables):
        """("value", templated) or ("undefined" or "error", the first line of why), shared by the hosts whose inputs
        to ``raw`` are the same (template_key)."""
        key = template_key(raw, variables)
        if key is not None and key in self._templated:
            return self._templated[key]
        try:
            outcome = ("value", templar.template(raw))
        except AnsibleUndefinedVariable as error:
            outcome = ("undefined", str(error).splitlines()[0])
        except AnsibleError as error:
            outcome = ("error", str(error).splitlines()[0])
        if key is not None:
            self._templated[key] = outcome
        return outcome

    def _values(self, variables, collection):
        """({name: templated value}, {name: error}, {name: why not validated}) of every role option and playbook
        variable this host has or (role options) gets from the role's default, templated as the role would see it."""
        templar = self._templar.copy_with_new_env(available_variables=variables)
        values, errors, not_validated = {}, {}, {}
        for name in sorted(set(collection.option_specs) | set(collection.variable_specs)):
            if name in variables:
                raw, own = variables[name], variables[name] != collection.option_defaults.get(name, ...)
            elif name in collection.option_defaults:
                raw, own = _trusted(collection.option_defaults[name]), False
            elif any(follow in variables for follow in FOLLOWED.get(name, ((),))[0]):
                # left unset in the role's defaults: its readers take the first of its follows that is set (core/_role_options.py followed)
                raw, own = variables[next(follow for follow in FOLLOWED[name][0] if follow in variables)], False
            else:
                continue
            kind, outcome = self._template(templar, raw, variables)
            if kind == "value":
                values[name] = outcome
            elif kind == "error":
                errors[name] = "%s cannot be templated: %s" % (name, outcome)
            elif own:
                # it uses a variable the run sets later (a fact, a registered result): said for a value the inventory or
                # -e set, not for the collection's own defaults
                not_validated[name] = "%s; its role checks it when it starts" % outcome
        return values, errors, not_validated

    def _value_errors(self, name, value, specs):
        key = (name, repr(value))
        if key not in self._checked:
            self._checked[key] = value_errors(name, value, specs)
        return self._checked[key]

    def _check_host(self, host, variables, collection):
        """(unknown names, whether they are only warnings, value errors, {name: why not validated}, {play keyword
        variable: value}) of one host."""
        values, errors, not_validated = self._values(variables, collection)
        unknown = unknown_variables(set(variables), collection.prefixes, collection.known, _as_list(values.get(EXTRA_VARIABLE), host))
        allowed = bool(unknown) and _as_bool(values.get(ALLOW_VARIABLE), host)
        origins = {name: origin_text(variables[name]) for name in set(values) | set(errors) if name in variables}
        invalid = [(name, error, origins.get(name)) for name, error in sorted(errors.items())]
        for name, value in values.items():
            specs = collection.option_specs.get(name, []) + ([collection.variable_specs[name]] if name in collection.variable_specs else [])
            invalid.extend((name, error, origins.get(name)) for error in self._value_errors(name, value, specs))
        keyword_values = {name: (values.get(name), origins.get(name)) for name in collection.play_keywords if name in variables}
        return unknown, allowed, invalid, not_validated, keyword_values

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        self.validate_argument_spec(argument_spec={})
        me = task_vars.get("inventory_hostname")
        play_hosts = task_vars.get("ansible_play_hosts_all") or []
        if play_hosts and play_hosts[0] not in (task_vars.get("ansible_play_batch") or [play_hosts[0]]):
            # a later serial batch: the first batch's run checked every host of the play (a mistake anywhere failed it,
            # and any_errors_fatal ended the play), and nothing since changed an inventory or extra var
            result.update(changed=False, checked_hosts=[], unknown={}, invalid={}, play_keyword_in_inventory=[], not_validated=[],
                          msg="every host of the play was checked with its first batch (%s)" % play_hosts[0])
            return result
        self._templated, self._checked = {}, {}  # per run: outcomes shared by hosts with the same inputs
        collection = read_collection(collection_root(), load_yaml)
        host_variables, play_names = self._play_view()

        # This host with everything it sees (inventory, extra vars, the play's vars), then every other host of the play,
        # in every serial batch, as a task of this play would see it, so that a mistake in a later batch's host_vars
        # stops the run before the first batch is changed.  One run for the play (run_once).
        hosts = {me: task_vars}
        hostvars = task_vars.get("hostvars") or {}
        for host in task_vars.get("ansible_play_hosts_all") or []:
            if host != me and host in hostvars:
                hosts[host] = (host_variables(host) if host_variables else None) or hostvars.raw_get(host)

        failing, allowed, invalid, not_validated, keyword_values = {}, {}, {}, {}, {}
        for host, variables in hosts.items():
            unknown, allow, errors, not_templated, keyword_values[host] = self._check_host(host, variables, collection)
            if unknown:
                (allowed if allow else failing)[host] = unknown
            if errors:
                invalid[host] = errors
            for name, cause in not_templated.items():
                not_validated.setdefault((name, cause), []).append(host)
        refusals = []
        if play_names is None:
            cause = "ansible-core did not hand this task its play's variables, so an inventory value of them is not refused"
            not_validated[(", ".join(sorted(collection.play_keywords)), cause)] = list(hosts)
        else:
            refusals = play_keyword_refusals(keyword_values, play_names, collection.play_keywords)

        result.update(
            changed=False,
            checked_hosts=sorted(hosts),
            unknown={host: [{"name": name, "suggestion": match} for name, match in names]
                     for host, names in sorted({**failing, **allowed}.items())},
            invalid={host: [{"name": name, "error": error, "origin": origin} for name, error, origin in errors]
                     for host, errors in sorted(invalid.items())},
            play_keyword_in_inventory=[{"name": name, "keyword": keyword, "hosts": where, "values": values, "origins": origins}
                                       for name, keyword, where, values, origins in refusals],
            not_validated=[{"name": name, "cause": cause, "hosts": sorted(where)} for (name, cause), where in sorted(not_validated.items())],
        )
        warnings = [failure_message(allowed, lead="unknown variables (allowed by %s)" % ALLOW_VARIABLE)] if allowed else []
        warnings += ["%s was not validated before the run on %s: %s" % (entry["name"], _hosts_text(entry["hosts"]), entry["cause"])
                     for entry in result["not_validated"]]
        if warnings:
            result["warnings"] = warnings
        messages = ([failure_message(failing)] if failing else []) + ([invalid_message(invalid)] if invalid else []) \
            + ([play_keyword_message(refusals)] if refusals else [])
        if messages:
            result.update(failed=True, msg=" ".join(messages))
        else:
            result["msg"] = "the gpuharden variables of %s are known and valid" % ", ".join(result["checked_hosts"])
        return result
