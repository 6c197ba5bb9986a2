# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The uninstall's decisions on one node: which files come back in this pass, which services restart, which unit
runs the kubelet.

playbooks/unharden_gpu_nodes.yml made them in Jinja (a read-only plan, a set_fact, a second pass, a unit listing, a
name, two conditional restarts); unharden_files makes them here in one run, and the unit tests reach them.

- Passes: the first pass (every node at once) undoes what needs no drain. Where gpuharden changed a kubelet manager
  policy (it removed a checkpoint), the kubelet's files wait for the drained pass (``checkpoints``: the kubelet
  stopped on a drained node), so the first pass leaves the kubelet_config writer out and says so (``deferred``).
- Restarts: a service whose configuration came back restarts, containerd before the kubelet (the kubelet talks to
  containerd's socket at start); a kubelet this run stopped starts again whatever happened.
- The kubelet's unit: the first of the units it is known to run as that systemd lists (kubeadm's ``kubelet``, k3s,
  rke2), else ``kubelet``, as kubelet_config's ``service=auto`` looks for them.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.node._kubelet import SERVICES

KUBELET_WRITER = "kubelet_config"
# every unit the kubelet runs as, in the order kubelet_config looks for them (module_utils/node/_kubelet.py SERVICES)
KUBELET_UNITS = tuple(name for names in SERVICES.values() for name in names)
# containerd first: the kubelet connects to the runtime's socket when it starts
RESTART_ORDER = ("containerd", "kubelet")


def requested_writers(writers, kubelet):
    """The writers to undo: ``writers``, without the kubelet's when ``kubelet`` is false (its files stay as gpuharden
    wrote them: no restart, no drain)."""
    return [writer for writer in writers if kubelet or writer != KUBELET_WRITER]


def writers_now(writers, disruptive, defer_disruptive):
    """(the writers this pass undoes, the writers it leaves for the drained pass).

    ``disruptive``: the plan over ``writers`` needs the kubelet stopped on a drained node (a removed checkpoint)."""
    writers = list(writers)
    if defer_disruptive and disruptive and KUBELET_WRITER in writers:
        return [writer for writer in writers if writer != KUBELET_WRITER], [KUBELET_WRITER]
    return writers, []


def restarts(restored_services, restart, stop_kubelet, check_mode):
    """The services this run restarts, in order: with ``restart=if_required`` those whose configuration came back;
    with ``stop_kubelet`` the kubelet (this run stopped it). None in check mode."""
    if check_mode:
        return []
    wanted = set(restored_services) if restart == "if_required" else set()
    if stop_kubelet:
        wanted.add("kubelet")
    return [service for service in RESTART_ORDER if service in wanted]


def kubelet_unit_listing_argv():
    """``systemctl list-unit-files`` for every unit the kubelet runs as (read-only, also in check mode)."""
    return ["systemctl", "list-unit-files", "--no-legend"] + ["%s.service" % name for name in KUBELET_UNITS]


def kubelet_unit(option, listing):
    """The kubelet's systemd service: ``option`` unless it is ``auto``; else the first of KUBELET_UNITS that the
    listing (``systemctl list-unit-files --no-legend`` output: the unit name first on each line) names, else
    ``kubelet``."""
    if option != "auto":
        return option
    listed = {line.split()[0] for line in (listing or "").splitlines() if line.split()}
    return next((name for name in KUBELET_UNITS if "%s.service" % name in listed), "kubelet")
