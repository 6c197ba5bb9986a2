# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""The node side of the NVML post-check: NVML read as root and, in a forked child, as an unprivileged user.

Shared by nvml_check and node_audit; the findings themselves come from the pure ``_nvml_health``.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import select
import signal
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _findings, _host
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.nvml import _nvml, _nvml_health


def argument_spec():
    return {
        "root": {"type": "path", "default": "/"},
        "node_name": {"type": "str"},
        "check_unprivileged": {"type": "bool", "default": True},
        "unprivileged_user": {"type": "str", "default": "nobody"},
        "unprivileged_groups": {"type": "list", "elements": "str", "default": []},
        "unprivileged_timeout": {"type": "int", "default": 60},
        "expected_gpus": {"type": "int"},
        "expected_mig_devices": {"type": "int"},
        "fail_on": {"type": "str", "choices": list(_findings.FAIL_CHOICES), "default": "never"},
    }


def resolve_identity(user, groups):
    """(uid, gid, [gids]) of the unprivileged user; names or numbers."""
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, ValueError):
        raise GpuhardenError("nvml_check: option unprivileged_user=%r: no such user on the node" % user) from None
    if entry.pw_uid == 0:
        raise GpuhardenError("nvml_check: option unprivileged_user=%r is root, not an unprivileged user" % user)
    gids = []
    for group in groups:
        try:
            gids.append(grp.getgrgid(int(group)).gr_gid if str(group).isdigit() else grp.getgrnam(group).gr_gid)
        except (KeyError, ValueError):
            raise GpuhardenError("nvml_check: option unprivileged_groups: group %r does not exist on the node" % group) from None
    return entry.pw_uid, entry.pw_gid, gids


def run_unprivileged(function, uid, gid, groups, timeout):
    """function() in a forked child running as uid/gid; its JSON-able result, or {"child_error": text}.

    Everything the child needs is imported before the fork: after setuid it may not be able to read
    the module's own files.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into Ansible's code
        try:
            os.close(read_end)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            if os.geteuid() != uid or os.getegid() != gid:
                raise OSError("privileges not dropped")
            payload = json.dumps({"result": function()})
        except BaseException as error:  # report everything to the parent
            payload = json.dumps({"child_error": "%s: %s" % (type(error).__name__, error)})
        data = payload.encode("utf-8")
        while data:
            data = data[os.write(write_end, data):]
        os._exit(0)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    timed_out = False
    with os.fdopen(read_end, "rb") as pipe:
        while True:
            left = deadline - time.monotonic()
            ready, _w, _x = select.select([pipe], [], [], max(left, 0))
            if not ready:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.waitpid(pid, 0)
    if timed_out:
        return {"child_error": "the unprivileged NVML check did not finish within %d s" % timeout}
    try:
        payload = json.loads(b"".join(chunks).decode("utf-8"))
    except ValueError:
        return {"child_error": "the unprivileged NVML check died without a result"}
    return payload.get("result", payload)


def driver_mig_devices(root, minors):
    """Compute instances in the driver's MIG capability tree, or None when the driver shows no such tree."""
    base = "/proc/driver/nvidia/capabilities"
    if _host.list_node_dir(root, base) is None:
        return None
    total, seen = 0, False
    for minor in minors:
        mig = "%s/gpu%d/mig" % (base, minor)
        instances = _host.list_node_dir(root, mig)
        if instances is None:
            continue
        seen = True
        for gi in instances:
            if gi.startswith("gi") and os.path.isdir(_files.resolve_in_root(root, "%s/%s" % (mig, gi))):
                total += sum(1 for ci in _host.list_node_dir(root, "%s/%s" % (mig, gi)) or [] if ci.startswith("ci"))
    return total if seen else None


def check(params):
    root = params["root"]
    if not os.path.isdir(root):
        raise GpuhardenError("nvml_check: option root=%s is not a directory" % root)
    if params["unprivileged_timeout"] < 1:
        raise GpuhardenError("nvml_check: option unprivileged_timeout=%r must be at least 1 second" % params["unprivileged_timeout"])
    node = params["node_name"] or os.uname().nodename
    unprivileged = None
    probe = None
    if params["check_unprivileged"]:
        if os.geteuid() != 0:
            raise GpuhardenError("nvml_check: the unprivileged check needs root (become: true), or set check_unprivileged=false")
        uid, gid, groups = resolve_identity(params["unprivileged_user"], params["unprivileged_groups"])
        load_error = _nvml.load_library()
        if load_error is None:
            outcome = run_unprivileged(_nvml.probe_access, uid, gid, groups, params["unprivileged_timeout"])
        else:
            outcome = {"available": False, "reason": load_error, "gpu_count": None, "gpus": []}
        if "child_error" in outcome:
            outcome = {"available": False, "gpu_count": None, "gpus": [], "reason": {
                "code": "nvml_error", "nvml_return": None, "message": outcome["child_error"],
                "hint": "the forked unprivileged check failed outside NVML"}}
        probe = outcome
        unprivileged = dict(outcome, user=params["unprivileged_user"], uid=uid, gid=gid, groups=groups)
    reading = _nvml.collect_health(lambda bus_id: _host.numa_node(root, bus_id))
    driver_gpus = _host.driver_gpus(root)
    minors = sorted({gpu["minor"] for gpu in (driver_gpus or {}).values() if isinstance(gpu.get("minor"), int)})
    result = _nvml_health.evaluate(
        node, reading, probe=probe, user=params["unprivileged_user"], driver_gpus=driver_gpus,
        expected_gpus=params["expected_gpus"], expected_mig_devices=params["expected_mig_devices"],
        driver_mig_devices=driver_mig_devices(root, minors))
    result["unprivileged"] = unprivileged
    result["max_severity"] = _findings.max_severity(result["findings"])
    return result
