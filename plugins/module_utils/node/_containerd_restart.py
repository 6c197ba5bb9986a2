# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Restart containerd after containerd_nvidia_runtime wrote its files, and wait until it serves again, in the same run.

containerd is back when systemd calls it active and it listens on its gRPC socket again. It creates that socket anew
when it starts (containerd v2.4.2 pkg/sys/socket_unix.go CreateUnixSocket: unlink, then listen), after it has read its
configuration, so a socket file that is new since the restart and accepts a connection is the restarted daemon's.
A configuration the daemon cannot load makes it exit before that (the unit ends "failed"). Where no socket was there
before the restart (containerd listens elsewhere, for example k3s's own address), it must stay active for
STABLE_SECONDS instead, the settle time the role waited before.
"""

from __future__ import annotations

import os
import socket
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._host import host_path
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _service_restart

RESTART_SPEC = {
    # never: only write (restart_required tells the caller); if_required: restart when this run changed a file
    "restart": {"type": "str", "default": "never", "choices": ["never", "if_required"]},
    "service": {"type": "str", "default": "containerd"},
    "ready_timeout": {"type": "int", "default": 30},
}
STABLE_SECONDS = 2.0
CONNECT_SECONDS = 1.0
GONE_STATES = ("failed", "inactive")


def wanted(params, changed, check_mode):
    return not check_mode and params["restart"] == "if_required" and changed


def _identity(path):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_ctime_ns)


def _accepts(path):
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(CONNECT_SECONDS)
    try:
        connection.connect(path)
    except OSError:
        return False
    finally:
        connection.close()
    return True


def restart_and_wait(run_command, service, root, address, timeout, clock=time.monotonic, sleep=time.sleep):
    """``systemctl restart service``, then wait until it is active and serves on ``address`` (a node path) again.

    Returns _service_restart's result; its "status" is the last ``systemctl is-active`` answer."""
    socket_path = host_path(root, address)
    before = _identity(socket_path)
    active_since = []

    def serving(_deadline):
        try:
            _rc, out, _err = run_command(["systemctl", "is-active", service])
        except OSError as error:
            return False, None, "systemctl is-active %s: %s" % (service, error), True
        state = out.strip()
        if state in GONE_STATES:
            return False, state, "%s is %s after the restart (see its log: a configuration it cannot load?)" % (service, state), True
        if state != "active":
            del active_since[:]
            return False, state, "%s is %s" % (service, state or "unknown"), False
        if before is None:
            active_since[:] = active_since or [clock()]
            steady = clock() - active_since[0] >= STABLE_SECONDS
            return steady, state, None if steady else "%s active for less than %gs" % (service, STABLE_SECONDS), False
        now = _identity(socket_path)
        if now is None or now == before:
            return False, state, "%s is active but has not created %s again" % (service, address), False
        if not _accepts(socket_path):
            return False, state, "%s is active but %s does not accept connections" % (service, address), False
        return True, state, None, False

    waited = _service_restart.restart_and_wait(run_command, service, serving, timeout, clock, sleep)
    if waited["timed_out"]:
        waited["error"] = "not serving %d s after the restart: %s" % (timeout, waited["error"])
    waited["address"] = address
    return waited
