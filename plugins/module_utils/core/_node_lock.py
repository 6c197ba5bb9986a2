# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""A run lock on the node, so that two gpuharden runs (a scheduled drift check and a harden from a pipeline,
say, from different controllers) never work on one node at the same time.

The lock is a small JSON file created with O_EXCL: ``{owner, acquired_at, stale_after, run}``.  The decision is pure
(``decide``, ``holder_gone``); the module does the file operations.

A run that died (Ctrl-C, a killed CI job) leaves its lock behind.  Another run takes it over, with a warning that names
the holder, when that run is provably gone, or else when the lock is older than its ``stale_after``:

- provably gone: the lock names the controller process of its run (``run``: host name, boot id, PID namespace, the
  ansible-playbook process's PID and its start time in clock ticks since boot, ``controller_identity``), the run now
  taking the lock comes from the same controller (same host, boot and PID namespace) and that process is not among
  the ansible-playbook processes alive there (``controller``'s ``live``), although it started before they were listed.
  PID and start time together name one process for the whole boot (proc(5), /proc/<pid>/stat field 22), so a PID used
  again by another process is not mistaken for the holder.
- a run from another controller cannot be proven gone from here: its lock waits for ``stale_after``.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

from ansible.module_utils.common.warnings import warn
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._waiter import wait_until

DEFAULT_PATH = "/run/gpuharden/run.lock"
DEFAULT_STALE_AFTER = 7200
POLL_SECONDS = 1.0
# What names the controller a run comes from, and its ansible-playbook process there.
SAME_CONTROLLER = ("host", "boot_id", "pid_ns")
RUN_KEYS = SAME_CONTROLLER + ("pid", "start")
PLAYBOOK_COMMANDS = ("ansible-playbook",)
# A lock file is one small JSON object; anything bigger is not gpuharden's.
MAX_LOCK_BYTES = 64 * 1024


def parse(text):
    """The lock file's content, or None when it cannot be understood (treated as stale)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("owner"), str) or not isinstance(data.get("acquired_at"), (int, float)):
        return None
    return data


def check_controller(controller, where="node_lock: option controller"):
    """The ``controller`` option (controller_identity() with ``live`` and ``checked``), checked; None when not given."""
    if controller is None:
        return None
    problem = None
    if not isinstance(controller, dict):
        problem = "is not a dictionary"
    elif any(not isinstance(controller.get(key), str) or not controller[key] for key in SAME_CONTROLLER):
        problem = "needs the strings %s" % ", ".join(SAME_CONTROLLER)
    elif any(isinstance(controller.get(key), bool) or not isinstance(controller.get(key), int) for key in ("pid", "start", "checked")):
        problem = "needs the integers pid, start and checked"
    elif not isinstance(controller.get("live"), list) or any(
            not isinstance(entry, (list, tuple)) or len(entry) != 2 or not all(isinstance(part, int) for part in entry)
            for entry in controller["live"]):
        problem = "needs live, a list of [pid, start] pairs"
    if problem:
        raise GpuhardenError("%s=%r %s (what the lookup gpuharden.k8s.controller_run returns)" % (where, controller, problem))
    return controller


def holder_gone(holder, controller):
    """Why the holder's run is provably gone (see the module docstring), or None when it cannot be proven."""
    run = (holder or {}).get("run")
    if not controller or not isinstance(run, dict) or any(run.get(key) != controller[key] for key in SAME_CONTROLLER):
        return None
    pid, start = run.get("pid"), run.get("start")
    if not isinstance(pid, int) or not isinstance(start, int) or start >= controller["checked"]:
        return None  # started after the controller's processes were listed: it may well be alive
    if [pid, start] in [list(entry) for entry in controller["live"]]:
        return None
    return "its run is gone: ansible-playbook PID %d (started %d ticks after boot) no longer runs on %s" % (pid, start, run["host"])


def decide(current, owner, now, state, gone=None):
    """What to do about the lock: 'create', 'keep' (ours already), 'take_over' (its run is gone, it is stale or
    unreadable), 'wait' (another run holds it), 'remove', 'absent' (nothing to release) or 'foreign' (someone else's:
    leave it).  ``gone``: holder_gone()'s answer for ``current``."""
    if state == "released":
        if current is False:
            return "absent"
        if current is None or current["owner"] == owner:
            return "remove"
        return "foreign"
    if current is False:
        return "create"
    if current is None:
        return "take_over"
    if current["owner"] == owner:
        return "keep"
    if gone or now - current["acquired_at"] > current.get("stale_after", 0):
        return "take_over"
    return "wait"


def takeover_reason(current, now, gone):
    if current is None:
        return "the lock file is unreadable"
    if gone:
        return gone
    return "it is older than its stale_after (%d s): held for %d s" % (current.get("stale_after", 0), now - current["acquired_at"])


def describe_holder(holder):
    """``owner`` since <UTC time> [(ansible-playbook PID p on host)]: who holds a lock, for a message."""
    text = "%s since %s" % (holder["owner"], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(holder["acquired_at"])))
    run = holder.get("run")
    if isinstance(run, dict) and run.get("host"):
        text += " (ansible-playbook PID %s on %s)" % (run.get("pid"), run["host"])
    return text


def read(path):
    """False when there is no lock file, None when it is unreadable garbage, else its content.

    Only a regular file is read, never through a link (``_files.read_text``): a FIFO or a link at the lock's path is
    an error naming it, not a hang or someone else's file taken for the lock.
    """
    try:
        text = _files.read_text(path, follow=False, max_bytes=MAX_LOCK_BYTES)
    except GpuhardenError as error:
        raise GpuhardenError("node_lock: %s" % error.msg, fix="remove %s if no gpuharden run holds it" % path) from None
    return False if text is None else parse(text)


def create(path, content):
    """O_EXCL create; False when somebody else created it first."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    except OSError as error:
        raise GpuhardenError("node_lock: cannot create %s: %s" % (_files.shown(path), error.strerror)) from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(content, sort_keys=True))
    return True


def take_over(path, content):
    """Replace a stale lock atomically (a new temporary file in the same directory, then rename)."""
    _files.refuse_immutable(path, path)  # before the temporary file: a refusal leaves the directory as it was
    _files.refuse_immutable(os.path.dirname(path), path, directory=True)
    temp = None
    try:
        fd, temp = tempfile.mkstemp(prefix=_files.TEMP_PREFIX, dir=os.path.dirname(path))
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(content, sort_keys=True))
        os.chmod(temp, 0o644)
        os.rename(temp, path)
    except OSError as error:
        if temp:
            try:
                os.unlink(temp)
            except OSError:
                pass
        raise GpuhardenError("node_lock: cannot replace the stale lock %s: %s" % (_files.shown(path), error.strerror)) from None


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise GpuhardenError("node_lock: cannot remove %s: %s" % (_files.shown(path), error.strerror)) from None


def run(params):
    path, owner, state = params["path"], params["owner"], params["state"]
    if not os.path.isabs(path) or os.path.basename(path) in ("", ".", ".."):
        raise GpuhardenError("node_lock: option path=%s is not an absolute path to a file" % _files.shown(path)[:200],
                             fix="give the lock file's absolute path (default %s)" % DEFAULT_PATH)
    if params["timeout"] < 0 or params["stale_after"] < 1:
        raise GpuhardenError("node_lock: timeout must be >= 0 and stale_after >= 1 (got %d, %d)" % (params["timeout"], params["stale_after"]))
    controller = check_controller(params.get("controller"))

    def attempt():
        """One try at the lock: (True, the result) when it is decided, (False, the holder) while another run holds it."""
        while True:  # a race lost (another run created or took the lock over between our read and our write): decide again
            current = read(path)
            now = time.time()
            gone = holder_gone(current, controller) if current else None
            action = decide(current, owner, now, state, gone)
            content = {"owner": owner, "acquired_at": now, "stale_after": params["stale_after"]}
            if controller:
                content["run"] = {key: controller[key] for key in RUN_KEYS}
            if action == "create" and not create(path, content):
                continue
            if action == "take_over":
                take_over(path, content)
                if (read(path) or {}).get("owner") != owner:
                    continue
            if action == "remove":
                remove(path)
            if action == "wait":
                return False, current
            result = {"action": action, "holder": current or None, "taken_over": None}
            if action == "take_over":
                reason = takeover_reason(current, now, gone)
                result["taken_over"] = reason
                warn("node_lock: took over the run lock %s from %s: %s" % (
                    path, describe_holder(current) if current else "an unknown run", reason))
            return True, result

    waited = wait_until("the run lock %s" % path, attempt, time.monotonic() + params["timeout"], POLL_SECONDS, final_look=True)
    if waited.done:
        return waited.detail
    current = waited.detail
    raise GpuhardenError(
        "node_lock: the node is locked by %s (another gpuharden run); waited %d s. It is taken over once that run "
        "is provably gone (same controller, its ansible-playbook process ended) or after stale_after (%d s); remove %s "
        "if that run is gone" % (describe_holder(current), params["timeout"], current.get("stale_after", 0), path),
        holder=current)

# ---------------------------------------------------------------------------------------------
# The controller's side: which run this is, and which runs are alive on this controller (the lookup
# gpuharden.k8s.controller_run reads them; the node side above only compares them).


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def process_start(pid, proc="/proc"):
    """The process's start time in clock ticks after boot (/proc/<pid>/stat field 22), None when it is gone."""
    try:
        stat = _read("%s/%d/stat" % (proc, pid)).decode("utf-8", "replace")
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or parentheses: split after its last ")"
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def _parent(pid, proc):
    stat = _read("%s/%d/stat" % (proc, pid)).decode("utf-8", "replace")
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _cmdline(pid, proc):
    try:
        return _read("%s/%d/cmdline" % (proc, pid)).split(b"\0")
    except OSError:
        return []


def is_playbook(argv):
    """An ansible-playbook process: the command, or the script an interpreter runs (python .../ansible-playbook)."""
    return any(os.path.basename(part.decode("utf-8", "replace")) in PLAYBOOK_COMMANDS for part in argv[:2])


def playbook_process(pid, proc="/proc"):
    """The ansible-playbook process ``pid`` belongs to: its topmost ancestor (itself included) with the same command
    line. Ansible's workers are forks of it, so they share its command line; a lookup runs in one of them."""
    argv = _cmdline(pid, proc)
    while True:
        try:
            parent = _parent(pid, proc)
        except (OSError, ValueError, IndexError):
            return pid
        if parent <= 1 or _cmdline(parent, proc) != argv:
            return pid
        pid = parent


def live_playbooks(proc="/proc"):
    """[[pid, start]] of every ansible-playbook process alive now."""
    live = []
    for name in os.listdir(proc):
        if name.isdigit() and is_playbook(_cmdline(int(name), proc)):
            start = process_start(int(name), proc)
            if start is not None:
                live.append([int(name), start])
    return sorted(live)


def controller_identity(proc="/proc", pid=None):
    """This run on this controller, as a lock records it, with the ansible-playbook processes alive now (``live``) and
    when they were listed (``checked``, clock ticks after boot)."""
    main = playbook_process(pid or os.getpid(), proc)
    # the time first: a process that starts while the list is made is then never taken for one that has ended
    checked = int(float(_read("%s/uptime" % proc).split()[0]) * os.sysconf("SC_CLK_TCK"))
    return {"host": socket.gethostname(), "boot_id": _read("%s/sys/kernel/random/boot_id" % proc).decode().strip(),
            "pid_ns": os.readlink("%s/self/ns/pid" % proc), "pid": main, "start": process_start(main, proc),
            "live": live_playbooks(proc), "checked": checked}
