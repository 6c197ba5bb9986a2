# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""A run lock on the node, so that two gpuharden runs (a scheduled drift check and a harden from a pipeline,
say, from different controllers) never work on one node at the same time.

The lock is a small JSON file created with O_EXCL: ``{owner, acquired_at, stale_after}``.  The decision is pure
(``decide``); the module does the file operations.  A lock older than its ``stale_after`` is taken over: a run
that died must not block the node forever.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

DEFAULT_PATH = "/run/gpuharden/run.lock"
DEFAULT_STALE_AFTER = 7200
POLL_SECONDS = 1.0
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


def decide(current, owner, now, state):
    """What to do about the lock: 'create', 'keep' (ours already), 'take_over' (stale or unreadable), 'wait'
    (another run holds it), 'remove', 'absent' (nothing to release) or 'foreign' (someone else's: leave it)."""
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
    if now - current["acquired_at"] > current.get("stale_after", 0):
        return "take_over"
    return "wait"


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
    deadline = time.monotonic() + params["timeout"]
    while True:
        current = read(path)
        now = time.time()
        action = decide(current, owner, now, state)
        content = {"owner": owner, "acquired_at": now, "stale_after": params["stale_after"]}
        holder = current or None
        if action == "create" and not create(path, content):
            continue  # another run created it between our read and our create: decide again
        if action == "take_over":
            take_over(path, content)
            if (read(path) or {}).get("owner") != owner:
                continue  # another run took it over at the same moment and won
        if action == "remove":
            remove(path)
        if action != "wait":
            return {"action": action, "holder": holder}
        if time.monotonic() >= deadline:
            raise GpuhardenError(
                "node_lock: the node is locked by %s since %s (another gpuharden run); waited %d s. Remove %s if that run is gone"
                % (current["owner"], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(current["acquired_at"])), params["timeout"], path),
                holder=current)
        time.sleep(POLL_SECONDS)
