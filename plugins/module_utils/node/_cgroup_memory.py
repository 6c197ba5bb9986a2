# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""memory.high for GPU pods' cgroups on cgroup v2: what a kubelet with MemoryQoS would have set.

Three layers, so that the decision is testable without a kernel:

* ``check_hierarchy`` (pure): is ``cgroup_root`` a cgroup v2 hierarchy with the memory controller?
  Decided from the text of its ``cgroup.controllers`` and of ``/proc/self/mounts``.
* ``scan_pods`` (reads only): the kubelet's pod cgroups under ``cgroup_root`` for the wanted pod UIDs,
  with the text of their ``memory.max``/``memory.high`` and those of their container cgroups.
  Both cgroup drivers: systemd (``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/
  <container>.scope``, guaranteed pods directly below ``kubepods.slice``) and cgroupfs
  (``kubepods/<qos>/pod<uid>/<container>``).
* ``plan`` (pure): from that snapshot, the writes (``FileChange`` objects, ``memory.high`` =
  floor(``memory.max`` x factor / page) x page where ``memory.max`` is a number and ``memory.high`` is
  ``max``), the pods without any memory limit and the pods not found.

cgroup files are kernel interfaces: they are written in place (``write_values``), never through a
temporary file and a rename, which the kernel does not support there.  cgroupfs has no symbolic links, FIFOs or
devices: a memory file that is one is refused, never read (a FIFO would block) nor written through.  Every file is
checked before the first write; a cgroup that vanishes before its write (the pod ended) is reported, not an error;
a write the kernel refuses puts the values already written back.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from decimal import ROUND_FLOOR, Decimal

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _host
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._files import FileChange, read_text
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._findings import finding

MEMORY_FILES = ("memory.max", "memory.high")
QOS_CLASSES = ("guaranteed", "burstable", "besteffort")
# Kubernetes pod UIDs: UUIDs from the apiserver; static pods' UIDs are the md5 hex of their manifest.
_UID_RE = re.compile(r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$")
_SYSTEMD_POD_RE = re.compile(r"^kubepods(?:-(burstable|besteffort))?-pod([0-9a-f_]+)\.slice$")
_CGROUPFS_POD_RE = re.compile(r"^pod([0-9a-f-]+)$")
_BYTES_RE = re.compile(r"[0-9]{1,20}")
# memory.max and memory.high hold one number or "max"; cgroup.controllers a few words.
CGROUP_FILE_MAX_BYTES = 4096
# (top-level cgroup, QoS sub-cgroups by class, driver)
_LAYOUTS = (
    ("kubepods.slice", {"burstable": "kubepods-burstable.slice", "besteffort": "kubepods-besteffort.slice"}, "systemd"),
    ("kubepods", {"burstable": "burstable", "besteffort": "besteffort"}, "cgroupfs"),
)
FINDING_MEMORY_HIGH = "gpu-pod-memory-high-unset"
FINDING_UNLIMITED = "gpu-pod-no-memory-limit"


# ---------------------------------------------------------------------------------------------
# Input validation (pure)


def normalize_uids(uids):
    """Lower-cased, de-duplicated pod UIDs in input order; anything else than a pod UID is an error."""
    seen = []
    for position, uid in enumerate(uids):
        value = uid.strip().lower() if isinstance(uid, str) else uid
        if not isinstance(value, str) or not _UID_RE.match(value):
            raise GpuhardenError(
                "cgroup_memory: option pod_uids[%d]=%r is not a Kubernetes pod UID (expected a UUID such as "
                "0f3c2a1e-5b7d-4c8e-9a6f-1d2e3f405162, or the 32-hex-digit UID of a static pod)" % (position, uid)
            )
        if value not in seen:
            seen.append(value)
    return seen


def check_factor(factor):
    try:
        ok = 0 < factor <= 1
    except TypeError:
        ok = False
    if not ok:
        raise GpuhardenError(
            "cgroup_memory: option factor=%r is out of range: it must be greater than 0 and at most 1 "
            "(the kubelet's memoryThrottlingFactor, default 0.9)" % (factor,)
        )
    return Decimal(repr(float(factor)))


def check_page_size(page_size):
    if not isinstance(page_size, int) or page_size <= 0 or page_size & (page_size - 1):
        raise GpuhardenError("cgroup_memory: option page_size=%r is not a positive power of two (bytes)" % (page_size,))
    return page_size


# ---------------------------------------------------------------------------------------------
# cgroup v2 detection (pure)


def _unescape_mount_field(field):
    # /proc/self/mounts escapes space, tab, newline and backslash as octal.
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def parse_mounts(mounts_text):
    """[(mount point, fstype, options)] from the text of /proc/self/mounts."""
    mounts = []
    for line in (mounts_text or "").splitlines():
        fields = line.split()
        if len(fields) >= 4:
            mounts.append((os.path.normpath(_unescape_mount_field(fields[1])), fields[2], fields[3].split(",")))
    return mounts


def check_hierarchy(cgroup_root, controllers_text, mounts_text, where=None):
    """Refuse unless ``cgroup_root`` is cgroup v2 with the memory controller; returns the controllers.

    ``controllers_text`` is the content of ``<cgroup_root>/cgroup.controllers`` (None if absent): it
    exists only on cgroup v2.  Without it, the mount at or above ``where`` (the path as this process sees
    it, default ``cgroup_root``) tells cgroup v1 (a tmpfs of per-controller ``cgroup`` mounts, or one of
    those mounts) from anything else.
    """
    if controllers_text is not None:
        controllers = controllers_text.split()
        if "memory" not in controllers:
            raise GpuhardenError(
                "cgroup_memory: %s is cgroup v2 but %s (%s) has no memory controller, so no "
                "cgroup has memory.max or memory.high: enable the memory controller (it may be bound to a cgroup v1 "
                "hierarchy, see cgroup_no_v1= / systemd.unified_cgroup_hierarchy=1 on the kernel command line)"
                % (cgroup_root, os.path.join(cgroup_root, "cgroup.controllers"), " ".join(controllers)[:200] or "empty")
            )
        return controllers
    where = os.path.normpath(where or cgroup_root)
    mounts = parse_mounts(mounts_text)
    below = [(point, fstype, options) for point, fstype, options in mounts if point.startswith(where.rstrip("/") + "/")]
    containing = [entry for entry in mounts if where == entry[0] or where.startswith(entry[0].rstrip("/") + "/")]
    fstype = max(containing, key=lambda entry: len(entry[0]))[1] if containing else None
    v1 = [point for point, kind, _options in below if kind == "cgroup"]
    if fstype == "cgroup" or v1:
        controllers = sorted({os.path.basename(point) for point in v1}) or [os.path.basename(where)]
        raise GpuhardenError(
            "cgroup_memory: %s is a cgroup v1 hierarchy (%s): memory.high and the kubelet's MemoryQoS exist only on "
            "cgroup v2. Move the node to the unified hierarchy (systemd.unified_cgroup_hierarchy=1 on the kernel command "
            "line, then reboot) before hardening its memory limits" % (cgroup_root, ", ".join(controllers)),
            fix="move the node to cgroup v2, or leave its memory limits alone: cgroup_limits_immediate=false and "
                "cgroup_limits_memory_qos_feature_gate=false for this node (its other checks still run)",
        )
    if fstype == "cgroup2":
        raise GpuhardenError(
            "cgroup_memory: %s is on a cgroup2 mount but has no cgroup.controllers: point cgroup_root at the root of the "
            "cgroup v2 hierarchy the kubelet uses" % cgroup_root
        )
    raise GpuhardenError(
        "cgroup_memory: %s is not a cgroup v2 hierarchy (no cgroup.controllers, mounted as %s): set cgroup_root to where "
        "cgroup2 is mounted (usually /sys/fs/cgroup)" % (cgroup_root, fstype or "nothing known")
    )


# ---------------------------------------------------------------------------------------------
# Reading the node


def pod_dir_uid(name, driver):
    """(uid, qos) for a pod cgroup's directory name, or None."""
    if driver == "systemd":
        match = _SYSTEMD_POD_RE.match(name)
        if match:
            return match.group(2).replace("_", "-"), match.group(1) or "guaranteed"
        return None
    match = _CGROUPFS_POD_RE.match(name)
    return (match.group(1), None) if match else None


def _subdirs(path):
    try:
        with os.scandir(path) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as error:
        raise GpuhardenError("cgroup_memory: cannot list %s: %s" % (path, error.strerror)) from None


def _read_cgroup_file(path):
    """A cgroup file's text (None when absent); never through a link, never a FIFO or device (``_files.read_text``)."""
    try:
        return read_text(path, follow=False, max_bytes=CGROUP_FILE_MAX_BYTES)
    except GpuhardenError as error:
        raise GpuhardenError("cgroup_memory: %s: this is not a cgroup file" % error.msg,
                             fix="point cgroup_root at the node's cgroup v2 hierarchy") from None


def _read_memory_files(base, cgroup):
    directory = os.path.join(base, cgroup.lstrip("/"))
    return {name: _read_cgroup_file(os.path.join(directory, name)) for name in MEMORY_FILES}


def scan_pods(base, wanted):
    """{uid: [pod cgroup]} for the wanted UIDs, read below ``base`` (cgroup_root as this process sees it).

    A pod cgroup is ``{"cgroup", "driver", "qos", "files": {name: text or None}, "containers": [{"cgroup",
    "files"}]}``; ``cgroup`` is relative to cgroup_root, with a leading slash.  Only the wanted pods' files
    are read, each once.
    """
    wanted = set(wanted)
    found = {}
    for top, qos_dirs, driver in _LAYOUTS:
        top_dir = os.path.join(base, top)
        if not os.path.isdir(top_dir):
            continue
        candidates = [("/" + top, name, "guaranteed") for name in _subdirs(top_dir)]
        for qos, qos_dir in qos_dirs.items():
            candidates.extend(("/%s/%s" % (top, qos_dir), name, qos) for name in _subdirs(os.path.join(top_dir, qos_dir)))
        for parent, name, qos in candidates:
            parsed = pod_dir_uid(name, driver)
            if not parsed or parsed[0] not in wanted:
                continue
            uid, named_qos = parsed
            cgroup = "%s/%s" % (parent, name)
            containers = [
                {"cgroup": "%s/%s" % (cgroup, child), "files": _read_memory_files(base, "%s/%s" % (cgroup, child))}
                for child in _subdirs(os.path.join(base, cgroup.lstrip("/")))
            ]
            found.setdefault(uid, []).append(
                {"cgroup": cgroup, "driver": driver, "qos": named_qos or qos, "files": _read_memory_files(base, cgroup), "containers": containers}
            )
    return found


# ---------------------------------------------------------------------------------------------
# The plan (pure)


def parse_memory_value(text, path):
    """``max`` or a byte count from a memory.max/memory.high file's text; None when the file is absent."""
    if text is None:
        return None
    value = text.strip()
    if value == "max":
        return "max"
    if _BYTES_RE.fullmatch(value):
        return int(value)
    raise GpuhardenError(
        "cgroup_memory: %s holds %r, expected \"max\" or a byte count: refusing to touch this node's cgroups" % (path, text[:80])
    )


def memory_high_for(memory_max, factor, page_size):
    """floor(memory_max x factor / page) x page; ``factor`` a Decimal for exact arithmetic."""
    pages = (Decimal(memory_max) * factor / page_size).to_integral_value(rounding=ROUND_FLOOR)
    return int(pages) * page_size


def _cgroup_plan(cgroup_root, cgroup, files, factor, page_size, changes):
    path_max = "%s%s/memory.max" % (cgroup_root.rstrip("/"), cgroup)
    path_high = "%s%s/memory.high" % (cgroup_root.rstrip("/"), cgroup)
    memory_max = parse_memory_value(files.get("memory.max"), path_max)
    memory_high = parse_memory_value(files.get("memory.high"), path_high)
    entry = {"cgroup": cgroup, "memory_max": memory_max, "memory_high": memory_high, "action": "none"}
    if memory_max is None:
        entry["action"] = "no_memory_files"
    elif memory_max == "max":
        entry["action"] = "unlimited"
    elif memory_high is None:
        entry["action"] = "no_memory_files"
    elif memory_high != "max":
        entry["action"] = "already_set"
    else:
        desired = memory_high_for(memory_max, factor, page_size)
        if desired <= 0:
            entry["action"] = "limit_below_one_page"
        else:
            entry["action"] = "set"
            entry["memory_high"] = desired
            entry["memory_high_before"] = "max"
            changes.append(FileChange(path_high, files["memory.high"], "%d\n" % desired, reason="memory.high for memory.max=%d" % memory_max))
    return entry


def plan(cgroup_root, uids, snapshot, factor, page_size):
    """Decide every write before any is made.

    Returns ``{"changes": [FileChange], "pods": [...], "unlimited_pods": [uid], "not_found": [uid],
    "findings": [...]}``.  A file that holds neither ``max`` nor a number stops the whole plan.
    """
    changes = []
    pods = []
    unlimited = []
    not_found = []
    findings = []
    for uid in uids:
        candidates = snapshot.get(uid) or []
        if not candidates:
            not_found.append(uid)
            continue
        if len(candidates) > 1:
            raise GpuhardenError(
                "cgroup_memory: pod %s has more than one pod cgroup under %s (%s): the kubelet's cgroup driver changed "
                "without a drain? Refusing to guess which one is live"
                % (uid, cgroup_root, ", ".join(candidate["cgroup"] for candidate in candidates))
            )
        found = candidates[0]
        first_change = len(changes)
        pod_entry = _cgroup_plan(cgroup_root, found["cgroup"], found["files"], factor, page_size, changes)
        containers = [_cgroup_plan(cgroup_root, child["cgroup"], child["files"], factor, page_size, changes) for child in found["containers"]]
        pod = {
            "uid": uid,
            "cgroup": found["cgroup"],
            "driver": found["driver"],
            "qos": found["qos"],
            "memory_max": pod_entry["memory_max"],
            "memory_high": pod_entry["memory_high"],
            "action": pod_entry["action"],
            "containers": containers,
            "changed": len(changes) > first_change,
        }
        pods.append(pod)
        limited = [entry for entry in [pod_entry] + containers if isinstance(entry["memory_max"], int)]
        if pod_entry["memory_max"] == "max" and not limited:
            unlimited.append(uid)
            findings.append(finding(
                FINDING_UNLIMITED, "warning", "memory limit on the GPU pod's containers",
                "%s%s/memory.max = max" % (cgroup_root.rstrip("/"), found["cgroup"]),
                "a GPU pod without a memory limit can take the node's memory", subject=uid))
        for change in changes[first_change:]:
            findings.append(finding(
                FINDING_MEMORY_HIGH, "error", "memory.high = %s" % change.after.strip(), change.path + " = max",
                "cgroup_limits sets memory.high below memory.max", subject=uid))
    return {"changes": changes, "pods": pods, "unlimited_pods": unlimited, "not_found": not_found, "findings": findings}


# ---------------------------------------------------------------------------------------------
# Applying (cgroup files only)


def _open_cgroup_file(target, path):
    """An O_WRONLY descriptor of the cgroup file ``target`` (``path`` as reported), or None when it vanished.

    Never creates it, never follows a link, never blocks (a FIFO is refused before it is opened).
    """
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise GpuhardenError("cgroup_memory: %s: is %s, not a cgroup file: refusing to write it"
                             % (_files.shown(path), _files.kind_of(info.st_mode)),
                             fix="point cgroup_root at the node's cgroup v2 hierarchy")
    try:
        return os.open(target, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


def _check_targets(changes, root, host_path):
    """(change, target) of every write, each checked before the first: a cgroup file, still holding what was read."""
    checked = []
    for change in changes:
        if not change.changed:
            continue
        target = host_path(root, change.path) if host_path else change.path
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            checked.append((change, target))  # vanished: reported when its turn comes
            continue
        if not stat.S_ISREG(info.st_mode):
            raise GpuhardenError("cgroup_memory: %s: is %s, not a cgroup file: refusing to write it"
                                 % (_files.shown(change.path), _files.kind_of(info.st_mode)),
                                 fix="point cgroup_root at the node's cgroup v2 hierarchy")
        try:  # cgroupfs has no such flags; a tree that has them is refused before the first write
            _files.refuse_immutable(target, change.path)
        except GpuhardenError as error:
            raise GpuhardenError("cgroup_memory: %s" % error.msg, **error.result) from None
        now = _read_cgroup_file(target)
        if now is not None and (now.strip() != (change.before or "").strip()):
            raise GpuhardenError("cgroup_memory: %s: now %s, was %s when read: someone else set it; refusing to overwrite it"
                                 % (_files.shown(change.path), now.strip()[:40], (change.before or "").strip()[:40]),
                                 fix="run again: the plan is made from the values as they are now")
        checked.append((change, target))
    return checked


def _write_one(target, value):
    """Write ``value`` in place and read it back; False when the cgroup vanished first."""
    fd = _open_cgroup_file(target, target)
    if fd is None:
        return False, None
    try:
        os.write(fd, value.encode("ascii"))
    finally:
        os.close(fd)
    return True, _read_cgroup_file(target)


def write_values(changes, root="/", host_path=None):
    """Write each planned value into its cgroup file in place and read it back.

    cgroup files are kernel interfaces: a temporary file and a rename would replace the interface, so
    this is the one place where a target is opened for writing.  Every target is checked first
    (``_check_targets``).  Returns (the changes written, the changes whose cgroup vanished before their
    write).  When the kernel refuses a value, the values already written are put back and the error
    names the file; ``written`` lists what could not be put back.
    """
    written, vanished = [], []
    for change, target in _check_targets(changes, root, host_path):
        try:
            done, back = _write_one(target, change.after)
        except OSError as error:
            left = _put_back(written, root, host_path)
            raise GpuhardenError(
                "cgroup_memory: writing %s to %s failed: %s%s" % (
                    change.after.strip(), _files.shown(change.path), error.strerror,
                    " (the %d value(s) written before it were put back)" % len(written) if written and not left else ""),
                changed=bool(left),
                written=[change_record(done) for done in left],
            ) from None
        if not done:
            vanished.append(change)
            continue
        written.append(change)
        if (back or "").strip() != change.after.strip():
            raise GpuhardenError(
                "cgroup_memory: %s reads %r after writing %s" % (_files.shown(change.path), (back or "").strip()[:40], change.after.strip()),
                changed=True,
                written=[change_record(done) for done in written],
            )
    return written, vanished


def _put_back(written, root, host_path):
    """Write the old values back, newest first; returns the changes that could not be put back."""
    left = []
    for change in reversed(written):
        target = host_path(root, change.path) if host_path else change.path
        try:
            _write_one(target, change.before)  # a cgroup that vanished meanwhile has nothing to put back
        except OSError as error:
            if error.errno != errno.ENOENT:
                left.append(change)
    return list(reversed(left))


def change_record(change):
    return {"path": change.path, "before": (change.before or "").strip(), "after": (change.after or "").strip()}


# ---------------------------------------------------------------------------------------------
# Options and the whole decision, shared by cgroup_memory and node_audit


def argument_spec():
    return {
        "root": {"type": "path", "default": "/"},
        "cgroup_root": {"type": "path", "default": "/sys/fs/cgroup"},
        "pod_uids": {"type": "list", "elements": "str", "default": []},
        "factor": {"type": "float", "default": 0.9},
        "page_size": {"type": "int"},
    }


def decide(params, mounts_text=None):
    """Everything up to the plan: validation, the hierarchy check, one read of the wanted pods' files."""
    root = params["root"]
    cgroup_root = os.path.normpath(params["cgroup_root"])
    uids = normalize_uids(params["pod_uids"] or [])
    factor = check_factor(params["factor"])
    page_size = params["page_size"] if params["page_size"] is not None else os.sysconf("SC_PAGE_SIZE")
    check_page_size(page_size)
    if not os.path.isdir(root):
        raise GpuhardenError("cgroup_memory: option root=%s is not a directory" % root)
    base = _files.resolve_in_root(root, cgroup_root)  # inside the root, as the node sees it
    if not os.path.isdir(base):
        raise GpuhardenError("cgroup_memory: option cgroup_root=%s is not a directory on the node" % cgroup_root)
    if mounts_text is None:
        mounts_text = _host.read_text("/proc/self/mounts") or ""
    controllers = _read_cgroup_file(os.path.join(base, "cgroup.controllers"))
    check_hierarchy(cgroup_root, controllers, mounts_text, where=os.path.realpath(base))
    snapshot = scan_pods(base, uids) if uids else {}
    planned = plan(cgroup_root, uids, snapshot, factor, page_size)
    planned.update(cgroup_root=cgroup_root, page_size=page_size)
    return planned
