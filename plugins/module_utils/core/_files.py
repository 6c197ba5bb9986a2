# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Planned file changes and their atomic application.

Planners (pure) return ``FileChange`` objects; modules apply them with ``apply_changes`` only outside
check mode.  Writes go to a temporary file in the target's directory, then ``module.atomic_move``, which
keeps an existing file's owner, mode and SELinux context.  Nothing here opens a target for writing.
"""

from __future__ import annotations

import os
import tempfile

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _originals
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError


class FileChange:
    """One file's planned content: ``after is None`` means remove the file."""

    def __init__(self, path, before, after, mode=None, reason="", restorable=True):
        self.path = path
        self.before = before
        self.after = after
        self.mode = mode  # for new files only; existing files keep theirs
        self.reason = reason
        # False: the uninstall must never put ``before`` back (e.g. a kubelet checkpoint that was already stale: the
        # kubelet would refuse to start on it again).
        self.restorable = restorable

    @property
    def changed(self):
        return self.before != self.after

    def diff(self):
        return {
            "before": self.before or "",
            "after": self.after or "",
            "before_header": "%s (before)" % self.path,
            "after_header": "%s (after)" % self.path,
        }

    def as_dict(self):
        return {"path": self.path, "changed": self.changed, "reason": self.reason,
                "action": "remove" if self.after is None else ("create" if self.before is None else "update")}


def read_text(path):
    """The file's text, or None when it does not exist. Undecodable bytes are an error, not a guess."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise GpuhardenError("%s: is a directory, expected a file" % path) from None
    except OSError as error:
        raise GpuhardenError("%s: cannot read: %s" % (path, error.strerror)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise GpuhardenError("%s: not UTF-8 text (byte %d): refusing to edit it" % (path, error.start)) from None


def _write_temp(directory, content, mode):
    fd, temp_path = tempfile.mkstemp(prefix=".gpuharden-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_path, mode)
    except BaseException:
        os.unlink(temp_path)
        raise
    return temp_path


def apply_change(module, change, backup=False):
    """Apply one planned change; returns the backup file's path or None.

    The first change gpuharden makes to a file keeps its original for the uninstall (``_originals``), before the
    file is touched: a file whose original cannot be kept is not changed.
    """
    if not change.changed:
        return None
    record = _originals.before_write(module, change)
    backup_file = None
    if backup and change.before is not None:
        backup_file = module.backup_local(change.path)
        _originals.after_backup(module, change, record, backup_file)
    if change.after is None:
        os.unlink(change.path)
        return backup_file
    directory = os.path.dirname(os.path.realpath(change.path))
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    mode = change.mode if change.mode is not None else 0o644
    temp_path = _write_temp(directory, change.after, mode)
    target = os.path.realpath(change.path) if change.before is not None else change.path
    module.atomic_move(temp_path, target, unsafe_writes=module.params.get("unsafe_writes", False))
    if change.before is None:
        os.chmod(target, mode)  # atomic_move gives new files the umask's mode
    return backup_file


def apply_changes(module, changes, backup=False):
    """Apply every changed entry; returns {path: backup_file} for the files that were backed up."""
    backups = {}
    for change in changes:
        backup_file = apply_change(module, change, backup=backup)
        if backup_file:
            backups[change.path] = backup_file
    return backups


def diffs(changes):
    return [change.diff() for change in changes if change.changed]
