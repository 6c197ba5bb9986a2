# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Role node_prerequisites' decisions, in Python since issue 45 (its tasks made them in Jinja): whether the wheels are
copied and where, the arguments of gpuharden.k8s.node_venv, and which Python runs the node modules.  The action gpuharden.k8s.node_prerequisites calls these.

Pure: plain values in, plain values out.  The role's variables are checked before (role_preflight's rules).
"""

from __future__ import annotations

# The role's variables, as its defaults and argument spec name them.
READ = ("node_prerequisites_venv", "node_prerequisites_packages", "node_prerequisites_system_python", "node_prerequisites_index_url",
        "node_prerequisites_wheels", "node_prerequisites_wheels_dest")


def plan(values, host_python=None):
    """What the role does on one node. ``values``: the role's variables (READ); ``host_python``: the host's own Python
    where the play names one (vars/node_python.yml's __gpuharden_host_python), else None (the task's own)."""
    wheels = values.get("node_prerequisites_wheels") or ""
    venv_args = {"path": values["node_prerequisites_venv"], "packages": list(values["node_prerequisites_packages"]),
                 "index_url": values.get("node_prerequisites_index_url") or ""}
    if values.get("node_prerequisites_system_python"):
        venv_args["python"] = values["node_prerequisites_system_python"]
    copy = None
    if wheels:
        # the trailing slashes copy the directory's content, not the directory (ansible.builtin.copy's src/dest rule)
        copy = {"src": wheels.rstrip("/") + "/", "dest": values["node_prerequisites_wheels_dest"].rstrip("/") + "/", "owner": "root",
                "group": "root", "mode": "0644", "directory_mode": "0755"}
        venv_args["find_links"] = values["node_prerequisites_wheels_dest"]
    # The node modules run with the host's own Python: the play's node-task Python may be the very venv this creates
    # (gpuharden_node_python pointing at it, for the runs after the bootstrap).
    return {"copy": copy, "venv_args": venv_args, "interpreter": host_python or None}
