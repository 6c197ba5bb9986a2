# SPDX-License-Identifier: GPL-3.0-or-later
"""Render the roles' options maps with Ansible's own Templar, the way a play sees them, from the roles' defaults and
either their vars/main.yml now (``new``: each map a lookup of gpuharden.k8s.role_options) or the vars/main.yml Jinja they
replaced (``old``: tests/unit/fixtures/role_options_before/, copies of the files at fcdf087).

Run as a script (tests/unit/test_role_options.py does), so that the collection loader this installs to find the lookup
stays out of the test process.  Reads {"vars": "old"|"new", "names": [...], "cases": {case: {variable: value}}} as JSON
on stdin; writes {case: {name: typed value | {"error": message}}}, each value with its Python type spelt out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = ("cgroup_limits", "container_runtime", "device_permissions", "device_plugin", "kubelet_topology", "mig", "runtime_class")
BEFORE = REPO / "tests" / "unit" / "fixtures" / "role_options_before"


def typed(value):
    """The value with each scalar's type named, so that 1, 1.0, True and "1" differ."""
    if isinstance(value, dict):
        return {"dict": {str(key): typed(item) for key, item in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"list": [typed(item) for item in value]}
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return {kind.__name__: kind(value)}
    if value is None:
        return None
    return {"other": "%s %r" % (type(value).__name__, value)}


def main():
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar, trust_as_template

    init_plugin_loader([str(REPO / "build" / "collections")])

    def trusted(value):
        if isinstance(value, str):
            return trust_as_template(value)
        if isinstance(value, dict):
            return {key: trusted(item) for key, item in value.items()}
        if isinstance(value, list):
            return [trusted(item) for item in value]
        return value

    request = json.load(sys.stdin)
    base = {"inventory_hostname": "gpu-1"}
    for role in ROLES:
        base.update(yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()))
    if request["vars"] == "old":
        # the defaults whose follows Jinja resolved then (the new lookup resolves them in Python, core/_role_options.py followed)
        base.update(yaml.safe_load((BEFORE / "followed_defaults.yml").read_text()))
    for role in ROLES:
        path = BEFORE / ("%s.yml" % role) if request["vars"] == "old" else REPO / "roles" / role / "vars" / "main.yml"
        base.update(yaml.safe_load(path.read_text()))
    if request["vars"] == "new":
        # the maps the stage actions build where they read them, with the lookup's own builder (core/_role_options.py built)
        base.update({name: "{{ lookup('gpuharden.k8s.role_options', '%s') }}" % name for name in request.get("built", ())})
    rendered = {}
    for case, values in request["cases"].items():
        templar = Templar(loader=DataLoader(), variables=trusted(dict(base, **values)))
        rendered[case] = {}
        for name in request["names"]:
            try:
                rendered[case][name] = typed(templar.template(trust_as_template("{{ %s }}" % name)))
            except Exception as error:  # noqa: BLE001 (recorded: the test compares where the old Jinja failed too)
                rendered[case][name] = {"error": str(error).splitlines()[0]}
    json.dump(rendered, sys.stdout)


if __name__ == "__main__":
    main()
