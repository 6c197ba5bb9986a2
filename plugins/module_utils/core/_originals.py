# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""What a node's files were before gpuharden first changed them, and how to put them back (the uninstall).

Recording (``before_write``/``after_backup``, called by ``_files.apply_change`` for every file a gpuharden module
writes or removes): the first time gpuharden changes a file, its content (or its absence), mode and owner are kept
in a record under ``<root>/var/lib/gpuharden/originals/`` (one JSON file per path, mode 0600: configs may hold
secrets).  Every write also stores the sha256 of what gpuharden wrote, so the uninstall can tell "still what
gpuharden wrote" from "changed by someone since".  A write that finds the file in a state gpuharden did not leave
notes that in the record (``others``): the file was changed by someone else in between.

Restoring (``plan_restore``, pure, then ``apply_restore``): per record,
  * the file holds the original already -> nothing to do (the record goes);
  * the file holds what gpuharden last wrote -> the original content, mode and owner come back (a file gpuharden
    created is removed, and the directories it created for it when they are empty);
  * anything else (changed since, or changed by someone between two gpuharden writes) -> a conflict: left as it is
    and reported, the record kept; with ``force`` the current content is kept as a backup next to the file and the
    original restored.
  * a kubelet CPU/Memory Manager checkpoint gpuharden removed (it changed a manager policy): the kubelet has written
    its own since, so the plan is "disruptive": only with the kubelet stopped on a drained node
    (``allow_checkpoints``) does the removed checkpoint come back (or the kubelet's go, when there was none).
The backups gpuharden's modules made (option ``backup``) of a restored file are removed with it unless asked to keep
them (they hold the original or gpuharden's own earlier writes); those of a conflicting file are always kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

STATE_DIR = "var/lib/gpuharden/originals"
RECORD_VERSION = 1
# The kubelet's CPU and Memory Manager checkpoints: gpuharden removes them when a policy change makes them stale.
# Putting such a change back needs a drained node and a stopped kubelet (the record says so: kind checkpoint).
CHECKPOINTS = ("cpu_manager_state", "memory_manager_state")
# Which service reads the files a module writes: what must be restarted after they are restored.
SERVICES = {"containerd_nvidia_runtime": "containerd", "kubelet_config": "kubelet", "nvidia_device_nodes": None}
ABSENT = "absent"


def digest(text):
    """sha256 of a file's text; ``absent`` for no file."""
    if text is None:
        return ABSENT
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def node_path(root, path):
    """The path as the node sees it (``path`` is below ``root``)."""
    root = root or "/"
    if root == "/":
        return os.path.normpath(path)
    return "/" + os.path.relpath(path, root)


def host_path(root, path):
    """A node path as seen from here: its directories resolved inside the root, a final link kept (to be refused)."""
    if os.path.abspath(root or "/") == "/":
        return os.path.join("/", path.lstrip("/"))
    return _files.resolve_in_root(root, path, follow_final=False)


def state_dir(root):
    return host_path(root, STATE_DIR)


def record_file(root, path):
    """The record of one node path (named by a hash of the path: no escaping, no nesting)."""
    return os.path.join(state_dir(root), hashlib.sha256(path.encode("utf-8")).hexdigest()[:32] + ".json")


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_text(path, root=None):
    """A file's text for its record (``_files.read_text``: regular files only, bounded, UTF-8, links resolved inside
    ``root`` when given), None when absent."""
    try:
        return _files.read_text(path, root=root)
    except GpuhardenError as error:
        raise GpuhardenError("%s (gpuharden keeps a file's original before it changes it)" % error.msg, **error.result) from None


def _read_record(target, what):
    """A record file's JSON (never through a link: records are gpuharden's own files), None when absent."""
    try:
        text = _files.read_text(target, follow=False)
        return None if text is None else json.loads(text)
    except GpuhardenError as error:
        raise GpuhardenError("%s (%s)" % (error.msg, what), **error.result) from None
    except ValueError as error:
        raise GpuhardenError("%s: %s cannot be read: not JSON (%s)" % (target, what, " ".join(str(error).split()))) from None


# A record's fields and what each must hold; a record that says otherwise was not written by gpuharden (or was edited)
# and is refused before anything is restored from it.
_TEXT = (str,)
_RECORD_FIELDS = {
    "path": _TEXT, "writer": _TEXT, "kind": _TEXT, "recorded": _TEXT, "original": (str, type(None)),
    "original_stat": (dict, type(None)), "created_dirs": (list,), "written": (str, type(None)), "previous": (str, type(None)),
    "others": (list,), "backups": (list,),
}


def check_record(target, record):
    """Refuse a record whose fields do not hold what gpuharden writes there (one line: record file, field, value)."""
    def wrong(field, value):
        return GpuhardenError("%s: field %s holds %s, not what gpuharden records: refusing to restore from it"
                              % (target, field, _files.shown(json.dumps(value))[:80]),
                              fix="restore %s by hand, then remove the record" % record.get("path"))

    for field, types in _RECORD_FIELDS.items():
        if field in record and (not isinstance(record[field], types) or isinstance(record[field], bool)):
            raise wrong(field, record[field])
    stat = record.get("original_stat")
    if stat is not None:
        for key in ("mode", "uid", "gid"):
            value = stat.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (key == "mode" and value > 0o7777) \
                    or value > 2 ** 32 - 1:
                raise wrong("original_stat.%s" % key, value)
    for field in ("created_dirs", "backups"):
        for value in record.get(field) or []:
            if not isinstance(value, str) or not value.startswith("/"):
                raise wrong(field, value)
    if record.get("kind", "file") not in ("file", "checkpoint"):
        raise wrong("kind", record.get("kind"))
    return record


def load_record(root, path):
    target = record_file(root, path)
    record = _read_record(target, "the record of %s's original" % path)
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("path") != path:
        raise GpuhardenError("%s: not the record of %s" % (target, path))
    return check_record(target, record)


def load_records(root):
    """Every record under the root's state directory, sorted by path."""
    directory = state_dir(root)
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(".json"))
    except FileNotFoundError:
        return []
    records = []
    for name in names:
        target = os.path.join(directory, name)
        record = _read_record(target, "a record of gpuharden's originals")
        if not isinstance(record, dict) or not isinstance(record.get("path"), str) or record.get("version") != RECORD_VERSION:
            raise GpuhardenError("%s: not a gpuharden record (version %s)" % (target, RECORD_VERSION))
        if os.path.basename(target) != os.path.basename(record_file(root, record["path"])):
            raise GpuhardenError("%s: its name does not match the path it records (%s)" % (target, record["path"]))
        records.append(check_record(target, record))
    return sorted(records, key=lambda record: record["path"])


def _save_record(root, record):
    directory = state_dir(root)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    fd, temp = tempfile.mkstemp(prefix=".gpuharden-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, 0o600)
        os.replace(temp, record_file(root, record["path"]))
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


def _missing_dirs(root, path):
    """The directories above ``path`` that do not exist yet, the outermost first (node paths)."""
    missing = []
    directory = os.path.dirname(path)
    while directory and not os.path.isdir(directory):
        missing.insert(0, node_path(root, directory))
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return missing


def _writer(module):
    """The module's short name (``kubelet_config``), whatever way it was called."""
    return (getattr(module, "_name", "") or "gpuharden").rsplit(".", 1)[-1]


def _root(module):
    return (getattr(module, "params", None) or {}).get("root") or "/"


def before_write(module, change):
    """Keep the file's original the first time gpuharden changes it; note what this write leaves. Returns the record."""
    root = _root(module)
    path = node_path(root, change.path)
    current = read_text(change.path)
    record = load_record(root, path)
    if record is None:
        stat = None
        if current is not None:
            info = os.stat(change.path)
            stat = {"mode": info.st_mode & 0o7777, "uid": info.st_uid, "gid": info.st_gid}
        record = {"version": RECORD_VERSION, "path": path, "writer": _writer(module),
                  "kind": "checkpoint" if os.path.basename(path) in CHECKPOINTS else "file",
                  "recorded": _now(), "original": current, "original_stat": stat,
                  "created_dirs": _missing_dirs(root, change.path) if current is None else [],
                  "written": None, "previous": None, "others": [], "backups": []}
        if not getattr(change, "restorable", True):
            record["not_restorable"] = change.reason or "not to be put back"
    elif digest(current) not in (record.get("written"), record.get("previous"), digest(record.get("original"))):
        record["others"].append({"seen": _now(), "sha256": digest(current)})
    record["previous"] = record.get("written")
    record["written"] = digest(change.after)
    _save_record(root, record)
    return record


def after_backup(module, change, record, backup_file):
    """Remember a backup gpuharden's module made of the file, so the uninstall can clean it up."""
    if not backup_file or record is None:
        return
    record["backups"].append(node_path(_root(module), backup_file))
    _save_record(_root(module), record)


# ---------------------------------------------------------------------------------------------------------------
# The uninstall: plan (pure) and apply.

def plan_restore(records, current, force=False, writers=None, keep_backups=False, allow_checkpoints=False):
    """What to do with each record.

    ``current`` maps a node path to its current text (None: no file).  ``writers`` limits the plan to the records of
    these modules (None: all).  Returns a dict: ``entries`` (one per record: path, writer, kind, action, reason,
    before, after, and what else goes with it), ``conflicts``, ``services`` (to restart), ``disruptive``.
    Actions: ``restore`` (write the original back), ``remove`` (gpuharden created the file), ``forget`` (the file is
    the original already: only the record goes), ``conflict`` (left as it is), ``skip`` (not in ``writers``).
    """
    entries = []
    for record in records:
        path = record["path"]
        now = current.get(path)
        entry = {"path": path, "writer": record.get("writer"), "kind": record.get("kind", "file"),
                 "before": now, "after": now, "backups_removed": [], "backups_kept": list(record.get("backups") or []),
                 "dirs_removed": [], "forced": False}
        original = record.get("original")
        gpuharden_wrote = digest(now) in (record.get("written"), record.get("previous"))
        changed_between = bool(record.get("others"))
        if writers is not None and record.get("writer") not in writers:
            entry.update(action="skip", reason="left: written by %s, which is not being undone" % record.get("writer"))
        elif record.get("kind") == "checkpoint":
            # The kubelet rewrites its checkpoint at start: what matters is that gpuharden removed one, so the
            # manager policy changed; the uninstall removes the kubelet's new one while the kubelet is stopped.
            if not allow_checkpoints:
                entry.update(action="conflict", reason="gpuharden removed this stale kubelet checkpoint when it changed "
                             "the CPU or Memory Manager policy; putting the policy back needs a drained node and a "
                             "stopped kubelet, and removes the kubelet's current checkpoint")
            elif record.get("not_restorable"):
                # It stopped the kubelet before gpuharden removed it: putting it back would stop the kubelet again.
                if now is None:
                    entry.update(action="forget", reason="the checkpoint gpuharden removed was already stale (%s); it is "
                                 "not put back" % record["not_restorable"])
                else:
                    entry.update(action="remove", after=None, reason="the checkpoint gpuharden removed was already stale "
                                 "(%s) and is not put back; the kubelet writes a new one for the restored policy at start"
                                 % record["not_restorable"])
            elif now == original:
                entry.update(action="forget", reason="already the original checkpoint")
            elif original is None:
                entry.update(action="remove", after=None, reason="the checkpoint of the policy gpuharden set: the kubelet "
                             "writes a new one for the restored policy at start")
            else:
                entry.update(action="restore", after=original, reason="the checkpoint of the policy gpuharden set gives way "
                             "to the one gpuharden removed, which belongs to the restored configuration")
        elif now == original:
            entry.update(action="forget", reason="already the original" if original is not None else "absent, as before gpuharden")
        elif (gpuharden_wrote and not changed_between) or force:
            entry.update(action="remove" if original is None else "restore", after=original, forced=not (gpuharden_wrote and not changed_between),
                         reason=("gpuharden created it" if original is None else "gpuharden changed it; the original comes back"))
            if entry["forced"]:
                entry["reason"] += " (forced over a change by someone else: the current content is kept as a backup)"
        else:
            why = ("someone changed it between two gpuharden runs (%s)" % ", ".join(o.get("seen", "?") for o in record["others"])
                   if changed_between else "changed since gpuharden wrote it")
            entry.update(action="conflict", reason="left as it is: %s; restore by hand from the record %s, or force" % (why, path))
        if entry["action"] in ("restore", "remove") and not keep_backups:  # they hold the original, back in place now
            entry["backups_removed"], entry["backups_kept"] = entry["backups_kept"], []
        if entry["action"] == "remove" and entry["kind"] == "file":
            entry["dirs_removed"] = list(reversed(record.get("created_dirs") or []))
        entry["original_stat"] = record.get("original_stat")
        entry["changed"] = entry["action"] in ("restore", "remove")
        entries.append(entry)
    conflicts = [entry for entry in entries if entry["action"] == "conflict"]
    services = sorted({SERVICES.get(entry["writer"]) for entry in entries
                       if entry["action"] in ("restore", "remove") and SERVICES.get(entry["writer"])})
    disruptive = any(entry["kind"] == "checkpoint" and entry["action"] != "skip" for entry in entries)
    return {"entries": entries, "conflicts": conflicts, "services": services, "disruptive": disruptive}


def diff(entries):
    return [{"before": entry["before"] or "", "after": entry["after"] or "",
             "before_header": "%s (before)" % entry["path"], "after_header": "%s (after)" % entry["path"]}
            for entry in entries if entry["action"] in ("restore", "remove") and entry["before"] != entry["after"]]


def _backup_current(module, target):
    """Keep someone else's content next to the file before a forced restore overwrites it."""
    backup = "%s.%s.gpuharden-unharden~" % (target, time.strftime("%Y-%m-%d@%H:%M:%S"))
    shutil.copy2(target, backup)
    return backup


def _remove_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def apply_restore(module, root, plan):
    """Carry the plan out (never in check mode). Returns the backups made of forced-over files.

    Every file is checked before the first is touched (``_files.check_change``: inside the root, no link, not
    immutable, still what the plan read); a restored file gets its original content, mode and owner.
    """
    made = []
    checked = {}
    for entry in plan["entries"]:
        if entry["action"] in ("restore", "remove") and entry["before"] != entry["after"]:
            change = _files.FileChange(host_path(root, entry["path"]), entry["before"], entry["after"])
            checked[entry["path"]] = _files.check_change(root, change)
        if entry["action"] not in ("conflict", "skip"):  # its record goes: a record that cannot go stops the run here
            record = record_file(root, entry["path"])
            _files.refuse_immutable(record, record)
            _files.refuse_immutable(os.path.dirname(record), record, directory=True)
    for entry in plan["entries"]:
        action = entry["action"]
        if action in ("conflict", "skip"):
            continue
        target = host_path(root, entry["path"])
        if action in ("restore", "remove") and entry["forced"] and entry["before"] is not None:
            made.append(node_path(root, _backup_current(module, target)))
        if action == "restore" and entry["path"] in checked:
            stat = entry.get("original_stat") or {"mode": 0o644, "uid": 0, "gid": 0}
            written = checked[entry["path"]]
            _files.write_checked(module, written, entry["after"], stat["mode"])
            os.chmod(written.path, stat["mode"])  # atomic_move keeps the replaced file's mode and owner: take the original's
            os.chown(written.path, stat["uid"], stat["gid"])
        elif action == "remove":
            _remove_quietly(target)
            for directory in entry["dirs_removed"]:
                try:
                    os.rmdir(host_path(root, directory))
                except OSError:
                    break  # not empty (someone else's files): it stays, and so do the ones above it
        for backup in entry["backups_removed"]:
            _remove_quietly(host_path(root, backup))
        _remove_quietly(record_file(root, entry["path"]))
    directory = state_dir(root)
    for path in (directory, os.path.dirname(directory)):
        try:
            os.rmdir(path)
        except OSError:
            break
    return made
