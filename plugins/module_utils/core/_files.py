# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""Reading a node's files safely; planned file changes and their atomic, checked application.

Reading (``read_text``): only regular files are opened (a FIFO, device, socket or directory is refused without being
opened, so nothing blocks and no driver's open runs), at most ``max_bytes`` are read, and the text must be UTF-8.
Paths below a node root (``root``, the option every node module has: "/" on the node itself, the image's directory
when hardening an image before boot) are resolved the way the node will see them (``resolve_in_root``): every
symbolic link, absolute or relative, and every ``..`` is resolved inside the root, as under chroot(2), so no path
leaves it.

Writing: planners (pure) return ``FileChange`` objects; modules apply them with ``apply_changes`` only outside check
mode.  Every change is checked before the first one is made (``check_change``): the target stays inside the root,
is a regular file or absent, is not a symbolic link (unless the caller asks to replace the link with a file), is not
immutable or append-only (chattr +i/+a), and still holds what the planner read (another writer's change between the
read and the write is refused, not lost).  Writes go to a temporary file in the target's directory, then
``module.atomic_move``, which keeps an existing file's owner, mode and SELinux context.  A failure leaves no
temporary file behind and ends in a one-line ``GpuhardenError``; files an earlier change of the same call wrote are
put back.  Nothing here opens a target for writing.
"""

from __future__ import annotations

import fcntl
import os
import stat
import sys
import tempfile

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

# _originals (the record of what a write replaced) is imported by the two functions that write, not here: a read-only
# run (every audit) never compiles it, nor hashlib and shutil that it brings.

# The most a config read reads: real kubelet, containerd and mig-parted files are a few KiB; 4 MiB leaves room for
# generated ones and stops a file that is an endless device, or a 20 MB scalar, before it costs memory and time.
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
# Symbolic links followed while resolving one path: the kernel's own limit (MAXSYMLINKS, include/linux/namei.h).
MAX_SYMLINKS = 40
TEMP_PREFIX = ".gpuharden-"
# chattr's flags as FS_IOC_GETFLAGS reports them (include/uapi/linux/fs.h): the kernel refuses a rename over or
# into an immutable inode and any write but an append to an append-only one, even for root.
_FS_IOC_GETFLAGS = 0x80086601
_FS_IMMUTABLE_FL = 0x00000010
_FS_APPEND_FL = 0x00000020


def shown(path):
    """A path as one line of text: control characters escaped, nothing else changed."""
    text = path.decode("utf-8", "backslashreplace") if isinstance(path, bytes) else str(path)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else "\\x%02x" % ord(char) if ord(char) < 256 else "\\u%04x" % ord(char)
                   for char in text)


_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISLNK, "a symbolic link"))


def kind_of(mode):
    """What a file mode is, in words for a message."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


# ---------------------------------------------------------------------------------------------------------------
# Paths below a node root


def _normal_root(root):
    return os.path.abspath(root or "/")


def node_path(root, path):
    """``path``, a path lexically below ``root`` as this process sees it, as the node sees it (``/etc/x``).

    Raises when it is not below the root: a node module never touches a path outside its root.
    """
    root = _normal_root(root)
    path = os.path.abspath(path) if not os.path.isabs(path) else path
    if root == "/":
        return path
    if path == root:
        return "/"
    if not path.startswith(root.rstrip("/") + "/"):
        raise GpuhardenError("%s: outside the node root %s: refusing to touch it" % (shown(path), shown(root)),
                             fix="name paths as the node sees them, below option root")
    return path[len(root.rstrip("/")):]


def resolve_in_root(root, path, follow_final=True):
    """The node path ``path`` as a path here, every link and ``..`` resolved as the node sees it, never leaving ``root``.

    Walks component by component (lstat, readlink): an absolute link target starts again at the root, a relative
    one at the link's directory, ``..`` at the root stays at the root, as under chroot(2).  ``follow_final=False``
    keeps a final link unresolved (the caller refuses it or replaces it).  Components that do not exist are kept as
    they are.  Raises on a link loop and on a component that is not a directory.
    """
    root = _normal_root(root)
    if "\x00" in str(path):
        raise GpuhardenError("%s: a path cannot hold a NUL byte" % shown(path)[:200], fix="fix the path")
    pending = [part for part in str(path).split("/") if part not in ("", ".")]
    resolved = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = os.path.join(root, *resolved, part)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            resolved.append(part)
            continue
        except NotADirectoryError:
            parent = os.path.join(root, *resolved)
            raise GpuhardenError("%s: is %s, expected a directory (on the way to %s)"
                                 % (shown(parent), kind_of(os.lstat(parent).st_mode), shown(path)),
                                 fix="make it a directory, or point the option at the right path") from None
        except OSError as error:  # ENAMETOOLONG, EACCES, ELOOP on the way
            raise GpuhardenError("%s: cannot look it up: %s (on the way to %s)" % (shown(candidate)[:300], error.strerror, shown(path)[:300]),
                                 fix="fix the path") from None
        if stat.S_ISLNK(info.st_mode) and (pending or follow_final):
            links += 1
            if links > MAX_SYMLINKS:
                raise GpuhardenError("%s: more than %d symbolic links (a loop?) on the way to %s"
                                     % (shown(candidate), MAX_SYMLINKS, shown(path)), fix="fix the links")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            pending = [part for part in target.split("/") if part not in ("", ".")] + pending
            continue
        resolved.append(part)
    return os.path.join(root, *resolved)


def host_path_in_root(root, path, follow_final=True):
    """``path``, lexically below ``root`` (how planners name files), resolved inside the root."""
    if root is None:
        return path
    return resolve_in_root(root, node_path(root, path), follow_final=follow_final)


# ---------------------------------------------------------------------------------------------------------------
# Reading


def _read_bounded(fd, path, max_bytes):
    chunks, size = [], 0
    while True:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise GpuhardenError("%s: larger than %d bytes, the most gpuharden reads of this file: refusing it"
                                 % (shown(path), max_bytes), fix="check what this file is; a config is a few KiB")


def decode_utf8(data, path):
    """``data`` as text; invalid UTF-8 is an error naming the file and the byte offset, never a guess."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise GpuhardenError("%s: not UTF-8 text (byte 0x%02x at offset %d): refusing to read it"
                             % (shown(path), data[error.start], error.start),
                             fix="convert the file to UTF-8") from None


def read_bytes(path, root=None, max_bytes=None, follow=True):
    """The bytes of a regular file, or None when it does not exist.

    ``root``: the node root ``path`` is below (resolved inside it, ``resolve_in_root``); None reads ``path`` as it is.
    ``follow=False`` refuses a final symbolic link.  A FIFO, socket, device or directory is refused before it is
    opened; the file must be at most ``max_bytes`` long (``DEFAULT_MAX_BYTES``).
    """
    limit = DEFAULT_MAX_BYTES if max_bytes is None else max_bytes
    if "\x00" in str(path):
        raise GpuhardenError("%s: a path cannot hold a NUL byte" % shown(path)[:200], fix="fix the path")
    here = host_path_in_root(root, path, follow_final=follow)
    resolved = root is not None
    try:
        info = os.stat(here) if follow and not resolved else os.lstat(here)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise GpuhardenError("%s: a part of this path is a file, not a directory" % shown(path),
                             fix="fix the path, or the entry that should be a directory") from None
    except OSError as error:
        raise GpuhardenError("%s: cannot read it: %s" % (shown(path), error.strerror)) from None
    if not stat.S_ISREG(info.st_mode):
        raise GpuhardenError("%s: is %s, expected a file: refusing to read it" % (shown(path), kind_of(info.st_mode)),
                             fix="replace it with a regular file" if stat.S_ISLNK(info.st_mode) or stat.S_ISFIFO(info.st_mode)
                             else "remove it or point the option at the file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if resolved or not follow else 0)
    try:
        fd = os.open(here, flags)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise GpuhardenError("%s: cannot read it: %s" % (shown(path), error.strerror)) from None
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            raise GpuhardenError("%s: replaced while gpuharden opened it: refusing to read it" % shown(path),
                                 fix="run again once whatever changes it is done")
        try:
            return _read_bounded(fd, path, limit)
        except OSError as error:
            raise GpuhardenError("%s: cannot read it: %s" % (shown(path), error.strerror)) from None
    finally:
        os.close(fd)


def read_text(path, root=None, max_bytes=None, follow=True):
    """The file's UTF-8 text, or None when it does not exist (see ``read_bytes`` for what is refused)."""
    data = read_bytes(path, root=root, max_bytes=max_bytes, follow=follow)
    return None if data is None else decode_utf8(data, path)


# ---------------------------------------------------------------------------------------------------------------
# Planned changes


class FileChange:
    """One file's planned content: ``after is None`` means remove the file."""

    def __init__(self, path, before, after, mode=None, reason="", restorable=True, replace_link=False):
        self.path = path
        self.before = before
        self.after = after
        self.mode = mode  # for new files only; existing files keep theirs
        self.reason = reason
        # False: the uninstall must never put ``before`` back (e.g. a kubelet checkpoint that was already stale: the
        # kubelet would refuse to start on it again).
        self.restorable = restorable
        # True: a symbolic link at ``path`` is replaced by a regular file (what the link pointed to stays as it is);
        # False: such a link is refused.
        self.replace_link = replace_link

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


def _inode_flags(path, directory=False):
    """chattr flags of ``path`` (0 where the filesystem has none, or they cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else 0))
    except OSError:
        return 0
    try:
        buffer = bytearray(8)
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buffer, True)
        return int.from_bytes(buffer[:4], sys.byteorder)
    except OSError:
        return 0
    finally:
        os.close(fd)


def refuse_immutable(path, file_path, directory=False):
    """Refuse to change ``file_path`` when ``path`` (the file, or the directory it goes in) is immutable or
    append-only."""
    flags = _inode_flags(path, directory)
    which = "immutable" if flags & _FS_IMMUTABLE_FL else ("append-only" if flags & _FS_APPEND_FL else None)
    if which:
        raise GpuhardenError("%s: %s is %s (chattr +%s): refusing to change it"
                             % (shown(file_path), "its directory %s" % shown(path) if directory else "the file", which, which[0]),
                             fix="clear the flag (chattr -%s %s) if gpuharden may change it, or leave this stage out"
                             % (which[0], shown(path)))


def _first_existing(path):
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


class Target:
    """Where a checked change goes: its directory and file here (resolved inside the root)."""

    def __init__(self, change, directory, path, exists):
        self.change = change
        self.directory = directory
        self.path = path
        self.exists = exists


def check_change(root, change, replace_links=False):
    """Everything that would stop ``change`` from being made as planned, checked before any change is made.

    Returns a ``Target``; raises a one-line GpuhardenError naming the file otherwise.
    """
    on_node = node_path(root, change.path)
    directory = resolve_in_root(root, os.path.dirname(on_node))
    target = os.path.join(directory, os.path.basename(on_node))
    existing = _first_existing(directory)
    if not os.path.isdir(existing):
        raise GpuhardenError("%s: is %s, expected a directory (for %s)"
                             % (shown(existing), kind_of(os.lstat(existing).st_mode), shown(change.path)),
                             fix="make it a directory")
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        if not (replace_links or change.replace_link):
            raise GpuhardenError("%s: is a symbolic link (to %s): gpuharden does not write through links"
                                 % (shown(change.path), shown(os.readlink(target))),
                                 fix="replace the link with a regular file holding the config, or ask the module to "
                                     "replace links")
    elif info is not None and not stat.S_ISREG(info.st_mode):
        raise GpuhardenError("%s: is %s, expected a file: refusing to %s it"
                             % (shown(change.path), kind_of(info.st_mode), "remove" if change.after is None else "replace"),
                             fix="remove it, or point the option at the file")
    now = read_text(target, root=None, follow=True) if info is not None else None
    if now != change.before:
        raise GpuhardenError("%s: changed by someone else since gpuharden read it: refusing to overwrite that change"
                             % shown(change.path), fix="run again: gpuharden plans from the file as it is now")
    if info is not None and not stat.S_ISLNK(info.st_mode):
        refuse_immutable(target, change.path)
    refuse_immutable(existing, change.path, directory=True)
    return Target(change, directory, target, info is not None)


def _write_temp(directory, content, mode):
    fd, temp_path = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_path, mode)
    except BaseException:
        _remove_quietly(temp_path)
        raise
    return temp_path


def _remove_quietly(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _module_root(module):
    return (getattr(module, "params", None) or {}).get("root") or "/"


def write_checked(module, target, content, mode):
    """``content`` into ``target.path``: temp file, atomic move; nothing left behind on failure."""
    change = target.change
    if not os.path.isdir(target.directory):
        try:
            os.makedirs(target.directory, 0o755)
        except OSError as error:
            raise GpuhardenError("%s: cannot create its directory: %s" % (shown(change.path), error.strerror)) from None
    try:
        temp_path = _write_temp(target.directory, content, mode)
    except OSError as error:
        raise GpuhardenError("%s: cannot write a temporary file beside it: %s" % (shown(change.path), error.strerror),
                             fix="make %s writable" % shown(target.directory)) from None
    try:
        # the last look before the rename: another writer since the check is refused, its change kept
        if read_text(target.path, follow=True) != (change.before if content == change.after else change.after):
            raise GpuhardenError("%s: changed by someone else while gpuharden wrote it: refusing to overwrite that change"
                                 % shown(change.path), fix="run again: gpuharden plans from the file as it is now")
        module.atomic_move(temp_path, target.path, unsafe_writes=False)
    except GpuhardenError:
        _remove_quietly(temp_path)
        raise
    except Exception as error:  # atomic_move raises plain Exception; OSError from the rename
        _remove_quietly(temp_path)
        cause = getattr(error.__cause__, "strerror", None) or getattr(error, "strerror", None) or "the rename failed"
        raise GpuhardenError("%s: cannot replace it: %s" % (shown(change.path), cause),
                             fix="check the file's and its directory's permissions and attributes (lsattr)") from None
    if not target.exists:
        os.chmod(target.path, mode)  # atomic_move gives new files the umask's mode


def _record_state(root, change):
    """The bytes of the originals record ``before_write`` will update (None: none yet), to put back on failure."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _originals

    record = _originals.record_file(root, _originals.node_path(root, change.path))
    try:
        with open(record, "rb") as handle:
            return record, handle.read()
    except FileNotFoundError:
        return record, None


def _restore_record(root, record, data, created_dirs):
    if data is None:
        _remove_quietly(record)
    else:
        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=os.path.dirname(record))
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temp, record)
    for directory in reversed(created_dirs):
        try:
            os.rmdir(directory)
        except OSError:
            break


def _missing_dirs(path):
    missing = []
    while not os.path.lexists(path):
        missing.insert(0, path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _apply_checked(module, target, backup):
    """Make one checked change; returns (backup file or None, undo) where ``undo()`` puts the file and its record back."""
    from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _originals

    change = target.change
    root = _module_root(module)
    record_path, record_data = _record_state(root, change)
    state_dirs = _missing_dirs(os.path.dirname(record_path))
    new_dirs = _missing_dirs(target.directory)
    record = _originals.before_write(module, change)

    def undo_record():
        _restore_record(root, record_path, record_data, state_dirs)

    backup_file = None
    try:
        if backup and change.before is not None:
            backup_file = module.backup_local(target.path)
            _originals.after_backup(module, change, record, backup_file)
        if change.after is None:
            if read_text(target.path, follow=False) != change.before:  # the last look, as before a rename
                raise GpuhardenError("%s: changed by someone else since gpuharden read it: refusing to remove it"
                                     % shown(change.path), fix="run again: gpuharden plans from the file as it is now")
            try:
                os.unlink(target.path)
            except OSError as error:
                raise GpuhardenError("%s: cannot remove it: %s" % (shown(change.path), error.strerror)) from None
        else:
            write_checked(module, target, change.after, change.mode if change.mode is not None else 0o644)
    except BaseException:
        if backup_file:
            _remove_quietly(backup_file)
        undo_record()
        raise

    def undo():
        if change.before is None:
            _remove_quietly(target.path)
            for directory in reversed(new_dirs):
                try:
                    os.rmdir(directory)
                except OSError:
                    break
        else:
            back = Target(change, target.directory, target.path, change.after is not None)
            write_checked(module, back, change.before, change.mode if change.mode is not None else 0o644)
        if backup_file:
            _remove_quietly(backup_file)
        undo_record()

    return backup_file, undo


def apply_change(module, change, backup=False, replace_links=False):
    """Apply one planned change; returns the backup file's path or None.

    The first change gpuharden makes to a file keeps its original for the uninstall (``_originals``), before the
    file is touched: a file whose original cannot be kept is not changed.
    """
    return apply_changes(module, [change], backup=backup, replace_links=replace_links).get(change.path)


def apply_changes(module, changes, backup=False, replace_links=False, undos_out=None):
    """Apply every changed entry, each checked before the first is made; returns {path: backup_file}.

    A change that fails puts back the files this call changed before it (their content, their originals records),
    then raises its one-line error: no half-applied set of files.  ``undos_out``, a dict, receives {path: undo()} of
    every change made, for a caller that puts them back later (kubelet_config's rollback).
    """
    root = _module_root(module)
    targets = [check_change(root, change, replace_links) for change in changes if change.changed]
    backups, undos = {}, []
    for target in targets:
        try:
            backup_file, undo = _apply_checked(module, target, backup)
        except GpuhardenError as error:
            _undo_all(undos)
            if undos:
                raise GpuhardenError("%s (the %d file(s) changed before it were put back)" % (error.msg, len(undos)),
                                     **error.result) from None
            raise
        undos.append(undo)
        if undos_out is not None:
            undos_out[target.change.path] = undo
        if backup_file:
            backups[target.change.path] = backup_file
    return backups


def _undo_all(undos):
    for undo in reversed(undos):
        try:
            undo()
        except (GpuhardenError, OSError):
            pass  # best effort: the error that stopped the run is the one to report


def diffs(changes):
    return [change.diff() for change in changes if change.changed]
