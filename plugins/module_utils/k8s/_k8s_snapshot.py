# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Objects one controller module LISTed, handed to a later module run of the same play, so it need not LIST again.

``write`` puts the (already cut-down) objects in a new private directory (0700) in the controller's temp directory, in
one file (0600); ``take`` reads them and removes both: a snapshot is read once.  A run that ends before the reader
leaves its snapshot behind; ``write`` removes this user's snapshots older than STALE_SECONDS first.  Controller side
only: nodes never import this file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

PREFIX = "gpuharden-snapshot-"
FILE = "objects.json"
STALE_SECONDS = 6 * 3600  # far longer than any run between the writer and the reader


def _ours(directory):
    """True for a snapshot directory this user made: named PREFIX..., a real directory, ours, 0700."""
    try:
        info = os.lstat(directory)
    except OSError:
        return False
    return (os.path.basename(directory).startswith(PREFIX) and os.path.isdir(directory) and not os.path.islink(directory)
            and info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700)


def _remove_stale(now):
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        directory = os.path.join(base, name)
        if name.startswith(PREFIX) and _ours(directory) and now - os.lstat(directory).st_mtime > STALE_SECONDS:
            shutil.rmtree(directory, ignore_errors=True)


def write(kind, items):
    """Write ``items`` (a list of plain dicts) as a snapshot of ``kind``; returns the file's path."""
    _remove_stale(time.time())
    directory = tempfile.mkdtemp(prefix=PREFIX)  # 0700
    path = os.path.join(directory, FILE)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump({"kind": kind, "items": items}, handle, separators=(",", ":"))
    return path


def take(module, option, path, kind):
    """The items of the snapshot of ``kind`` at ``path`` (``module``'s ``option``), which is then removed."""
    where = "%s: option %s=%s" % (module, option, path)
    directory = os.path.dirname(path)
    if os.path.basename(path) != FILE or not _ours(directory):
        raise GpuhardenError("%s is not a snapshot this user wrote (%s in a directory %s* of mode 0700)" % (where, FILE, PREFIX))
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as error:
        raise GpuhardenError("%s: cannot read the snapshot: %s" % (where, error)) from None
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if not isinstance(data, dict) or data.get("kind") != kind or not isinstance(data.get("items"), list):
        raise GpuhardenError("%s: not a snapshot of %s" % (where, kind))
    return data["items"]
