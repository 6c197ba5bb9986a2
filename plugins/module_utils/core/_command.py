# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""External commands with a deadline: a program that hangs (a ``k3s --version`` that never answers, a ``systemctl
restart`` whose start job never ends) ends the command, not the run.

``AnsibleModule.run_command`` has no timeout (ansible-core 2.19), so node modules pass ``runner(timeout)`` where a
planner takes a ``run_command(argv) -> (rc, stdout, stderr)``.  The command runs in the C locale in a session of its
own, with stdin closed; at the deadline the whole session is killed and the answer is rc 124 (timeout(1)'s) with a
message saying so.  Output beyond ``MAX_OUTPUT`` bytes per stream is read and dropped, so an endless writer cannot
fill the module's memory.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

DEFAULT_TIMEOUT = 30
TIMED_OUT_RC = 124
MAX_OUTPUT = 1024 * 1024


def run(argv, timeout=DEFAULT_TIMEOUT, env_update=None):
    """(rc, stdout, stderr) of ``argv``; rc 124 when it did not end within ``timeout`` seconds, 127 when it cannot
    start (the error in stderr)."""
    env = dict(os.environ, LANG="C", LC_ALL="C", **(env_update or {}))
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=env, start_new_session=True, close_fds=True)
    except OSError as error:
        return 127, "", "%s: %s" % (argv[0], error.strerror or error)
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    open_fds = set(kept)
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _w, _x = select.select(list(open_fds), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.discard(fd)
                elif len(kept[fd]) < MAX_OUTPUT:
                    kept[fd].extend(chunk[:MAX_OUTPUT - len(kept[fd])])
        if not timed_out:
            try:
                process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        if timed_out or process.poll() is None:
            _kill_session(process)
        process.stdout.close()
        process.stderr.close()
    out, err = kept[out_fd].decode("utf-8", "replace"), kept[err_fd].decode("utf-8", "replace")
    if timed_out:
        return TIMED_OUT_RC, out, "%s did not finish within %s s (killed)" % (argv[0], timeout)
    return process.returncode, out, err


def _kill_session(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        pass


def runner(timeout=DEFAULT_TIMEOUT):
    """A ``run_command(argv)`` for planners and restarts, every command bounded by ``timeout`` seconds."""
    return lambda argv: run(argv, timeout=timeout)
