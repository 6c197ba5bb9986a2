# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""NVIDIA device nodes, their /dev/char links and what keeps their owner, group and mode.

``observe`` reads the node once; ``plan`` is pure and decides everything (node actions, link
actions, planned file changes, conflicts, whether the running driver still uses other values,
which parts of the policy cannot stick); ``apply_nodes`` carries out the node and link actions.
File changes go through ``_files``.

Numbers and defaults follow the driver and nvidia-modprobe: ``/dev/nvidia<minor>`` is 195:minor,
``/dev/nvidiactl`` 195:255, ``/dev/nvidia-modeset`` 195:254, ``/dev/nvidia-uvm`` and ``-uvm-tools``
are minors 0 and 1 of the ``nvidia-uvm`` major, ``/dev/nvidia-caps/nvidia-cap<m>`` minors of the
``nvidia-caps`` major (config 1 mode 0400, monitor 2 mode 0444).

Who sets the permissions (what this module predicts, and where it comes from):

* The kernel modules create no device node and send no uevent: nvidia, nvidia-uvm and nvidia-caps
  register their numbers with ``alloc_chrdev_region`` + ``cdev_add`` only, without ``device_create``
  (NVIDIA/open-gpu-kernel-modules ``kernel-open/nvidia/nv-caps.c``
  ``nv_cap_drv_init``; ``kernel-open/nvidia-uvm/uvm.c`` ``uvm_chardev_create``).  So udev never sees these
  devices and a udev rule for ``nvidia-uvm*`` or ``nvidia-cap*`` never fires.  Earlier versions of
  this module wrote such rules; ``plan_udev_cleanup`` now removes them.
* The nodes are made, and their owner/group/mode reset in place, by nvidia-modprobe's
  ``mknod_helper`` (NVIDIA/nvidia-modprobe ``modprobe-utils/nvidia-modprobe-utils.c``): a node with
  the right type and numbers is chmod/chown'ed back to the wanted values, one with the wrong type or
  numbers is removed and made again with mknod, a missing one is made.  libnvidia-container runs it
  for nvidiactl, every nvidia<N>, the MIG capabilities, nvidia-uvm* and nvidia-modeset at every
  container start (NVIDIA/libnvidia-container ``src/nvc.c`` ``load_kernel_modules``), and CUDA runs
  it when it opens UVM.  The values it uses:
    - nvidia<N>, nvidiactl, nvidia-modeset: ``DeviceFileUID/GID/Mode`` from
      ``/proc/driver/nvidia/params``, i.e. the ``NVreg_DeviceFile*`` options the module was loaded
      with (``nvidia_mknod``, ``nvidia_modeset_mknod``).  This part of a policy sticks, once the
      module runs with the options in ``modprobe_file``.
    - nvidia-uvm, nvidia-uvm-tools: always root:root 0666 (``nvidia_uvm_mknod`` passes no proc file,
      so the built-in defaults apply and no parameter, not even ``NVreg_ModifyDeviceFiles``, changes
      them).  No other owner, group or mode sticks.
    - nvidia-caps/nvidia-cap<m>: root:root and the ``DeviceFileMode`` of the capability's file under
      ``/proc/driver/nvidia/capabilities`` (``nvidia_cap_mknod``), which the driver fixes per
      capability; ``DeviceFileModify`` there comes from ``NVreg_ModifyDeviceFiles``
      (``nv_cap_alloc`` in nv-caps.c).  No other owner, group or mode sticks.
  Restricting nvidiactl and nvidia<N> still restricts the GPUs: UVM works only on a GPU registered
  with a file descriptor of /dev/nvidiactl (``UVM_REGISTER_GPU_PARAMS.rmCtrlFd``,
  ``kernel-open/nvidia-uvm/uvm_ioctl.h``), and a capability is only checked by the RM behind them.
  So uvm and caps are kept at nvidia-modprobe's values under every policy, and a policy that asks
  for others is reported (``not_persistable``) rather than applied until the next container start.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import stat

from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _host
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _gpu_operator

POLICIES = ("default", "restricted", "custom")
DRIVER_DEFAULT = {"uid": 0, "gid": 0, "mode": 0o666}
MAX_ID = 2**32 - 2  # (uid_t)-1 means "unchanged" to the kernel
UVM_NODES = (("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1))
CAPS_DIR = "/dev/nvidia-caps"
CHAR_DIR = "/dev/char"
# Capabilities the driver creates even without MIG instances: minor -> (name, driver mode).
CAP_DEFAULTS = {1: ("mig/config", 0o400), 2: ("mig/monitor", 0o444)}
# modprobe's search path, highest priority first; a file name found twice is read from the first.
MODPROBE_DIRS = ("/etc/modprobe.d", "/run/modprobe.d", "/usr/local/lib/modprobe.d", "/usr/lib/modprobe.d", "/lib/modprobe.d")
NVREG = (("NVreg_DeviceFileUID", "DeviceFileUID", "uid"), ("NVreg_DeviceFileGID", "DeviceFileGID", "gid"),
         ("NVreg_DeviceFileMode", "DeviceFileMode", "mode"))
NVREG_KEYS = {key: field for key, _param, field in NVREG}
MODPROBE_HEADER = (
    "# Managed by gpuharden.k8s (module nvidia_device_nodes, role device_permissions).\n"
    "# The NVIDIA driver (re)creates /dev/nvidia* with these values; a plain chmod does not last.\n"
)
# What nvidia-modprobe gives /dev/nvidia-uvm*, whatever the module parameters: its built-in defaults
# NV_DEVICE_FILE_UID/GID/MODE (NVIDIA/nvidia-modprobe modprobe-utils/nvidia-modprobe-utils.c,
# nvidia_uvm_mknod -> mknod_helper(..., NULL) -> init_device_file_parameters).
NVIDIA_MODPROBE_UVM = {"uid": 0, "gid": 0, "mode": 0o666}
KEPT_BY_NVREG = "NVreg_DeviceFileUID/GID/Mode (nvidia-modprobe reads them from /proc/driver/nvidia/params)"
KEPT_BY_UVM = "nvidia-modprobe: always root:root 0666 (no parameter changes it)"
KEPT_BY_CAP = "nvidia-modprobe: root:root and the DeviceFileMode of /proc/driver/nvidia/capabilities/%s"
KEPT_BY_NONE = "nothing: DeviceFileModify is 0, nvidia-modprobe leaves it alone"
# The lines earlier versions wrote to udev_rules_file (removed now: these devices send no uevent).
OLD_UDEV_HEADERS = (
    "# Managed by gpuharden.k8s (module nvidia_device_nodes, role device_permissions).",
    "# nvidia-uvm and nvidia-caps have no NVreg_ option: udev keeps their owner, group and mode.",
)
_OLD_UDEV_RULE = re.compile(
    r'^KERNEL=="(nvidia-uvm|nvidia-uvm-tools|nvidia-cap[0-9]+)", OWNER="[^"]*", GROUP="[^"]*", MODE="0[0-7]{3}"$')


# ---------------------------------------------------------------------------------------------
# Policy (pure, with the user/group lookups passed in)


def parse_mode(value, field="mode"):
    """A permission mode from a string of octal digits, or from YAML's int (0660 unquoted is 432)."""
    if isinstance(value, bool) or value is None:
        raise GpuhardenError("option %s=%r is not a mode: give octal digits such as '0660'" % (field, value))
    if isinstance(value, int):
        if value < 0 or value & ~0o777:
            raise GpuhardenError(
                "option %s=%d is not a permission mode (as an unquoted YAML number it is octal %o): "
                "quote it, e.g. '0660'" % (field, value, value))
        return value
    if not isinstance(value, str) or not re.fullmatch(r"0?[0-7]{3}", value.strip()):
        raise GpuhardenError(
            "option %s=%r is not a permission mode: give three octal digits with an optional leading 0, "
            "e.g. '0660' (no setuid/setgid/sticky bits)" % (field, value))
    return int(value.strip(), 8)


def parse_id(value, field, lookup):
    """A uid/gid from a number or a name resolved with ``lookup(name) -> id or None``."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise GpuhardenError("option %s=%r: give a name or a numeric id" % (field, value))
    text = str(value).strip()
    if re.fullmatch(r"[0-9]+", text):
        number = int(text)
        if number > MAX_ID:
            raise GpuhardenError("option %s=%s: ids go up to %d" % (field, text, MAX_ID))
        return number
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*\$?", text):
        raise GpuhardenError("option %s=%r is neither a numeric id nor a valid %s name" % (field, value, field))
    number = lookup(text)
    if number is None:
        raise GpuhardenError("option %s=%s: no such %s on the node" % (field, text, "user" if field == "owner" else "group"))
    return number


def resolve_policy(policy, owner=None, group=None, mode=None, lookup_user=None, lookup_group=None, name_of=None):
    """The wanted uid, gid and mode of /dev/nvidia<N>, nvidiactl and nvidia-modeset, from the module's options.

    ``default``: the driver's own default, root:root 0666; owner/group/mode must not be given.
    ``restricted``: mode (default 0660) without any bit for others, group read-write; ``group`` required.
    ``custom``: whatever owner (default root), group (default root) and mode (required) say.
    """
    if policy not in POLICIES:
        raise GpuhardenError("option policy=%r is not one of %s" % (policy, ", ".join(POLICIES)))
    lookup_user = lookup_user or (lambda name: 0 if name == "root" else None)
    lookup_group = lookup_group or (lambda name: 0 if name == "root" else None)
    name_of = name_of or (lambda kind, ident: "root" if ident == 0 else None)
    given = [name for name, value in (("owner", owner), ("group", group), ("mode", mode)) if value is not None]
    if policy == "default":
        if given:
            raise GpuhardenError(
                "option policy=default is the driver's default (root:root 0666) and takes no %s; "
                "use policy=restricted or policy=custom to set them" % "/".join(given))
        uid, gid, number = DRIVER_DEFAULT["uid"], DRIVER_DEFAULT["gid"], DRIVER_DEFAULT["mode"]
    elif policy == "restricted":
        if group is None:
            raise GpuhardenError(
                "option policy=restricted needs option group: the group whose members may use the GPUs "
                "(pods need it in securityContext.supplementalGroups)")
        number = parse_mode("0660" if mode is None else mode)
        if number & 0o007:
            raise GpuhardenError(
                "option mode=%04o with policy=restricted: a restricted mode gives others no access "
                "(last digit 0, e.g. 0660); use policy=custom for anything else" % number)
        if number & 0o060 != 0o060:
            raise GpuhardenError(
                "option mode=%04o with policy=restricted: the group needs read and write (NVML opens the "
                "device nodes read-write), e.g. 0660" % number)
        uid = parse_id("root" if owner is None else owner, "owner", lookup_user)
        gid = parse_id(group, "group", lookup_group)
    else:
        if mode is None:
            raise GpuhardenError("option policy=custom needs option mode (e.g. '0666')")
        number = parse_mode(mode)
        uid = parse_id("root" if owner is None else owner, "owner", lookup_user)
        gid = parse_id("root" if group is None else group, "group", lookup_group)
    return {"policy": policy, "uid": uid, "gid": gid, "mode": number,
            "owner": name_of("user", uid), "group": name_of("group", gid)}


def cap_mode(driver_mode, policy):
    """The mode a policy would give a capability node: never more than the driver's; under a group policy the
    group gets what others get by default, and others keep it only when the policy mode grants others anything.
    nvidia-modprobe resets the node to the driver's mode, so a different result is reported, not applied."""
    if policy["gid"] == DRIVER_DEFAULT["gid"] and policy["mode"] & 0o007:
        return driver_mode
    others = driver_mode & 0o007
    group = (driver_mode & 0o070) | (others << 3)
    return (driver_mode & 0o700) | group | (others if policy["mode"] & 0o007 else 0)


# ---------------------------------------------------------------------------------------------
# Reading the node (not pure: only reads)


# Bounds of the node's user database and of the driver's numbers: a larger or different value is not what the node or
# the driver wrote, and is refused before anything changes.
ETC_MAX_BYTES = _files.DEFAULT_MAX_BYTES  # 4 MiB: tens of thousands of entries; a node's files hold a few KiB
# Linux refuses a character-device major of 512 or more (fs/char_dev.c __register_chrdev_region, CHRDEV_MAJOR_MAX in
# include/linux/fs.h) and a minor needs at most 20 bits (MINORBITS, include/linux/kdev_t.h).
CHRDEV_MAJOR_MAX = 511
MINOR_MAX = (1 << 20) - 1
# nvidia-caps registers 8192 minors (alloc_chrdev_region(..., NV_CAP_DRV_MINOR_COUNT, ...) in
# NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv-caps.c): a capability's DeviceFileMinor is below that.
CAP_MINOR_MAX = 8191
# Each GPU owns one of the driver's regular minors 0-247 (nv-chardev-numbers.h NV_MINOR_DEVICE_NUMBER_REGULAR_MAX),
# so /proc/driver/nvidia/gpus never lists more than 248 of them; more is not the driver's directory.
GPU_DIRS_MAX = _host.GPU_MINOR_MAX + 1


def _etc_table(root, name):
    """name -> id from <root>/etc/passwd or <root>/etc/group, read inside the root (links never leave it; a FIFO,
    directory or device is refused), or None when the file does not exist."""
    text = _files.read_text(os.path.join(root, "etc", name), root=root, max_bytes=ETC_MAX_BYTES)
    if text is None:
        return None
    table = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit():
            table.setdefault(fields[0], int(fields[2]))
    return table


def _nss_lookups():
    def lookup(module):
        def find(name):
            try:
                return module.getpwnam(name).pw_uid if module is pwd else module.getgrnam(name).gr_gid
            except KeyError:
                return None
        return find

    def name_of(kind, ident):
        try:
            return pwd.getpwuid(ident).pw_name if kind == "user" else grp.getgrgid(ident).gr_name
        except (KeyError, TypeError, OverflowError):
            return None

    return lookup(pwd), lookup(grp), name_of


def id_lookups(root):
    """(lookup_user, lookup_group, name_of) for the node.

    On "/" the system's NSS is the node's.  Below another root (a host mounted at /host, an image's tree) names are
    resolved only from the tree's own /etc/passwd and /etc/group, never from the user database of the machine running
    the module: the node's ``video`` group may be 1234 where this machine's is 44.  Both files are read at once: one
    that is a FIFO, a directory, a device, too big or not UTF-8 is refused (one line naming it); one that does not
    exist is refused when a name has to be resolved from it, and leaves ids unnamed in the results otherwise.
    """
    if os.path.realpath(root) == "/":
        return _nss_lookups()
    tables = {"user": _etc_table(root, "passwd"), "group": _etc_table(root, "group")}
    files = {"user": "passwd", "group": "group"}

    def lookup(kind):
        def find(name):
            table = tables[kind]
            if table is None:
                path = os.path.join(root, "etc", files[kind])
                raise GpuhardenError("%s: does not exist, so the %s name %s cannot be resolved on the node (root=%s)"
                                     % (_files.shown(path), kind, _files.shown(name), _files.shown(root)),
                                     fix="give the numeric %s id, or restore the node's /etc/%s" % ("user" if kind == "user" else "group", files[kind]))
            if name not in table:
                raise GpuhardenError("option %s=%s: no such %s in %s, the node's user database (root=%s)"
                                     % ("owner" if kind == "user" else "group", _files.shown(name), kind,
                                        _files.shown(os.path.join(root, "etc", files[kind])), _files.shown(root)),
                                     fix="create it on the node, or give a numeric id")
            return table[name]
        return find

    by_id = {kind: {v: k for k, v in reversed(list((table or {}).items()))} for kind, table in tables.items()}
    return lookup("user"), lookup("group"), lambda kind, ident: by_id[kind].get(ident)


def _colon_table(text):
    table = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            table[key.strip()] = value.strip()
    return table


def _driver_number(table, key, where, low, high, default=None):
    """An integer field of a driver file within what the driver can write, else an error naming file, field and value."""
    text = table.get(key, default)
    if text is None:
        return None
    value = None
    if re.fullmatch(r"[0-9]{1,12}", str(text).strip()):
        value = int(str(text).strip())
    if value is None or not low <= value <= high:
        raise GpuhardenError("%s: %s %s is not a value the NVIDIA driver writes (%d-%d)"
                             % (_files.shown(where), key, _files.shown(str(text))[:40], low, high),
                             fix="this is not the NVIDIA driver's file: check what is mounted at /proc/driver/nvidia")
    return value


def read_caps(root):
    """Capabilities the driver announces under /proc/driver/nvidia/capabilities: minor -> {name, mode, modify}.

    Walked inside the root (a link never leads out of it); every file is read with ``_files.read_text`` (a FIFO,
    directory or device where a capability file belongs is refused).  DeviceFileMinor and DeviceFileMode are checked
    against what the driver can write (nv-caps.c: minors below NV_CAP_DRV_MINOR_COUNT, a permission mode)."""
    base = "/proc/driver/nvidia/capabilities"
    caps = {}
    pending = [base]
    while pending:
        directory = pending.pop(0)
        for name in _host.list_node_dir(root, directory) or []:
            node = directory + "/" + name
            here = _files.resolve_in_root(root or "/", node, follow_final=False)
            if os.path.isdir(here) and not os.path.islink(here):
                pending.append(node)
                continue
            where = _host.host_path(root, node)
            table = _colon_table(_host.read_node_text(root, node))
            if "DeviceFileMinor" not in table:
                continue
            minor = _driver_number(table, "DeviceFileMinor", where, 0, CAP_MINOR_MAX)
            mode = _driver_number(table, "DeviceFileMode", where, 0, 0o777, default="292")
            if minor in caps:
                raise GpuhardenError("%s: DeviceFileMinor %d is also the minor of capability %s: the driver gives each one its own"
                                     % (_files.shown(where), minor, caps[minor]["name"]),
                                     fix="this is not the NVIDIA driver's file: check what is mounted at /proc/driver/nvidia")
            caps[minor] = {"name": os.path.relpath(node, base), "mode": mode,
                           "modify": table.get("DeviceFileModify", "1") != "0"}
    return caps


def _modprobe_names(root, directory):
    """The config files modprobe reads from one directory: kmod's libkmod/libkmod-config.c conf_files_filter_out
    skips names starting with ".", names not ending in ".conf" or ".alias", and directories (following links, with
    "Directories inside directories are not supported"); anything else it reads.  A directory that is a regular file
    is itself read as one config (conf_files_list)."""
    here = _files.resolve_in_root(root or "/", directory)
    if os.path.isfile(here):
        return [(os.path.basename(directory), directory)]
    try:
        names = sorted(os.listdir(here))
    except OSError:
        return []
    found = []
    for name in names:
        if name.startswith(".") or not name.endswith((".conf", ".alias")):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(_files.resolve_in_root(root or "/", path)):
            continue
        found.append((name, path))
    return found


def _modprobe_files(root, own_path):
    """Every modprobe.d config file but ``own_path``, as [(node path, text)], in modprobe's reading order."""
    chosen = {}
    for directory in MODPROBE_DIRS:
        for name, path in _modprobe_names(root, directory):
            chosen.setdefault(name, path)
    files = []
    for name in sorted(chosen):
        path = chosen[name]
        if path == own_path:
            continue
        text = _host.read_node_text(root, path, max_bytes=_files.DEFAULT_MAX_BYTES)
        if text is not None:
            files.append((path, text))
    return files, chosen


def check_root(root):
    if not os.path.isdir(root):
        raise GpuhardenError("option root=%s is not a directory" % root)


def _gpus(root):
    """The driver's GPUs (``_host.driver_gpus``), refused where /proc/driver/nvidia/gpus holds more entries than the
    driver has minors or two GPUs claim one minor: neither is the driver's directory, and planning one node for each
    entry would never settle."""
    names = _host.list_node_dir(root, "/proc/driver/nvidia/gpus")
    if names is not None and len(names) > GPU_DIRS_MAX:
        raise GpuhardenError("/proc/driver/nvidia/gpus: %d entries, more than the %d GPUs the driver has minors for"
                             % (len(names), GPU_DIRS_MAX),
                             fix="this is not the NVIDIA driver's directory: check what is mounted at /proc/driver/nvidia")
    gpus = _host.driver_gpus(root)
    owners = {}
    for bdf, gpu in sorted((gpus or {}).items()):
        minor = gpu.get("minor")
        if minor is not None and minor in owners:
            raise GpuhardenError("/proc/driver/nvidia/gpus/%s/information: Device Minor %d is also GPU %s's: the driver "
                                 "gives each GPU its own" % (_files.shown(bdf), minor, _files.shown(owners[minor])),
                                 fix="this is not the NVIDIA driver's directory: check what is mounted at /proc/driver/nvidia")
        owners[minor] = bdf
    return gpus


def _majors(root):
    """/proc/devices' character majors, the NVIDIA ones checked against what Linux can register."""
    majors = _host.char_majors(root)
    for name in ("nvidia-uvm", "nvidia-caps"):
        if name in majors and not 1 <= majors[name] <= CHRDEV_MAJOR_MAX:
            raise GpuhardenError("/proc/devices: %s has major %d, which Linux never registers (1-%d)" % (name, majors[name], CHRDEV_MAJOR_MAX),
                                 fix="this is not the kernel's /proc/devices: check what is mounted at /proc")
    return majors


def observe(root, modprobe_file, udev_rules_file):
    """Everything ``plan`` needs, read from the node once.  Every file is read inside the root (``_files.read_text``:
    regular files only, bounded, links resolved inside the root) and every driver number is checked here, so that
    ``plan`` never meets a value that fails only when it is applied."""
    check_root(root)
    gpus = _gpus(root)
    params = _host.driver_params(root)
    majors = _majors(root)
    inventory = _host.device_node_inventory(root)
    caps = read_caps(root)
    paths = set(inventory) | {"/dev/nvidiactl", "/dev/nvidia-modeset"} | {path for path, _minor in UVM_NODES}
    paths |= {"/dev/nvidia%d" % gpu["minor"] for gpu in (gpus or {}).values() if isinstance(gpu.get("minor"), int)}
    paths |= {"%s/nvidia-cap%d" % (CAPS_DIR, minor) for minor in set(caps) | set(CAP_DEFAULTS)}
    nodes = {path: _host.describe_path(_host.host_path(root, path)) for path in sorted(paths)}
    links = {}
    char_dir = _host.host_path(root, CHAR_DIR)
    if os.path.isdir(char_dir) and not os.path.islink(char_dir):
        for name in _host.list_node_dir(root, CHAR_DIR) or []:
            if re.fullmatch(r"[0-9]+:[0-9]+", name):
                links[os.path.join(CHAR_DIR, name)] = _host.describe_path(os.path.join(char_dir, name))
    others, chosen = _modprobe_files(root, modprobe_file)
    return {
        "driver_loaded": gpus is not None or params is not None,
        "gpus": gpus or {},
        "params": params,
        "majors": majors,
        "caps": caps,
        "modeset_loaded": os.path.isdir(_host.host_path(root, "/sys/module/nvidia_modeset")),
        "nodes": nodes,
        "links": links,
        "dirs": {path: _host.describe_path(_host.host_path(root, path)) for path in (CAPS_DIR, CHAR_DIR)},
        "modprobe_text": _host.read_node_text(root, modprobe_file, max_bytes=_files.DEFAULT_MAX_BYTES),
        "udev_text": _host.read_node_text(root, udev_rules_file, max_bytes=_files.DEFAULT_MAX_BYTES),
        "modprobe_others": others,
        "modprobe_shadow": chosen.get(os.path.basename(modprobe_file)),
        "cmdline": _host.read_node_text(root, "/proc/cmdline") or "",
    }


# ---------------------------------------------------------------------------------------------
# Planning (pure)


def _ids(desc, name_of):
    """owner:group of a described path, named from the node's user database (``name_of``), never this machine's."""
    owner = name_of("user", desc.get("uid")) or str(desc.get("uid"))
    group = name_of("group", desc.get("gid")) or str(desc.get("gid"))
    return "%s:%s" % (owner, group)


def describe(desc, name_of=None):
    """One line for the diff: "char 195:0 root:root 0666", "link -> ../nvidia0", "absent"."""
    name_of = name_of or (lambda kind, ident: desc.get("owner") if kind == "user" else desc.get("group"))
    if not desc or not desc.get("exists"):
        return "absent"
    if desc["type"] == "link":
        return "link -> %s" % desc["target"]
    numbers = " %d:%d" % (desc["major"], desc["minor"]) if desc["type"] in ("char", "block") else ""
    return "%s%s %s %s" % (desc["type"], numbers, _ids(desc, name_of), desc["mode"])


def is_mig_capability(name):
    """Whether a capability file under /proc/driver/nvidia/capabilities is a MIG one (mig/config, mig/monitor,
    gpu<N>/mig/gi<G>[/ci<C>]/access): the nodes libnvidia-container makes for MIG devices, which this module makes too.

    The driver keeps the MIG capabilities in tables of their own and the others apart (open-gpu-kernel-modules
    ``kernel-open/nvidia/nv-caps.c``: ``g_nv_cap_mig_table`` and ``g_nv_cap_mig_gpu_table`` beside
    ``g_nv_cap_sys_table``, which holds fabric-imex-mgmt).  A real H200 (open kernel module 580.159.04, 2026-12-04)
    announced fabric-imex-mgmt (minor 4323, 0400) with no /dev node: whoever uses it makes it from its proc file
    (nvidia-modprobe's ``-f``, ``--nvidia-capability-device-file``).  Such a node is fixed where it exists, never
    created.  The MIG ones are wanted before anything asks for them: the toolkit's CDI generation lists only the
    capability nodes it finds ("Could not locate /dev/nvidia-caps/nvidia-cap66", kubernetes-sigs/dra-driver-nvidia-gpu
    #787; nvidia-container-toolkit v1.20.2 ``internal/discover/mounts.go`` skips a node it cannot locate, and
    tests/real/test_cdi_mig_caps.py shows it with the real ``nvidia-ctk cdi generate``, before and after this module
    made them), so without them a MIG pod gets no access to its instance; NVIDIA/mig-parted
    ``deployments/container/reconfigure-mig.sh`` runs nvidia-smi to make them before it regenerates its CDI spec (#82).
    """
    parts = name.split("/")
    return parts[0] == "mig" or (len(parts) > 2 and re.fullmatch(r"gpu[0-9]+", parts[0]) is not None and parts[1] == "mig")


def _wanted_nodes(observed, policy, warnings):
    """[(path, major, minor, uid, gid, mode, fix_permissions, kept_by, policy_wants)] the driver's state calls for.

    ``uid, gid, mode`` are what the node gets and keeps; ``policy_wants`` is (uid, gid, mode) the policy would give
    it, which differs only for nodes whose permissions no setting keeps (see the module docstring)."""
    if not observed["driver_loaded"]:
        return []
    base = (policy["uid"], policy["gid"], policy["mode"])
    wanted = []
    for bdf, gpu in sorted(observed["gpus"].items(), key=lambda item: (str(item[1].get("minor")), item[0])):
        if not isinstance(gpu.get("minor"), int):
            warnings.append("driver GPU %s has no Device Minor in /proc/driver/nvidia/gpus/%s/information: skipped" % (bdf, bdf))
            continue
        wanted.append(("/dev/nvidia%d" % gpu["minor"], _host.NVIDIA_MAJOR, gpu["minor"]) + base + (True, KEPT_BY_NVREG, base))
    wanted.append(("/dev/nvidiactl", _host.NVIDIA_MAJOR, _host.NVIDIACTL_MINOR) + base + (True, KEPT_BY_NVREG, base))
    if observed["modeset_loaded"] or observed["nodes"]["/dev/nvidia-modeset"].get("exists"):
        wanted.append(("/dev/nvidia-modeset", _host.NVIDIA_MAJOR, _host.NVIDIA_MODESET_MINOR) + base + (True, KEPT_BY_NVREG, base))
    uvm_major = observed["majors"].get("nvidia-uvm")
    uvm = (NVIDIA_MODPROBE_UVM["uid"], NVIDIA_MODPROBE_UVM["gid"], NVIDIA_MODPROBE_UVM["mode"])
    if uvm_major is not None:
        wanted.extend((path, uvm_major, minor) + uvm + (True, KEPT_BY_UVM, base) for path, minor in UVM_NODES)
    elif any(observed["nodes"][path].get("exists") for path, _minor in UVM_NODES):
        warnings.append("nvidia-uvm has no major in /proc/devices (module not loaded?): /dev/nvidia-uvm* left as they are")
    caps = dict(observed["caps"])
    for minor, (name, mode) in CAP_DEFAULTS.items():
        if minor not in caps and observed["nodes"]["%s/nvidia-cap%d" % (CAPS_DIR, minor)].get("exists"):
            caps[minor] = {"name": name, "mode": mode, "modify": True}
    caps_major = observed["majors"].get("nvidia-caps")
    if caps and caps_major is None:
        warnings.append("nvidia-caps has no major in /proc/devices: /dev/nvidia-caps/* left as they are")
    elif caps:
        for minor, cap in sorted(caps.items()):
            path = "%s/nvidia-cap%d" % (CAPS_DIR, minor)
            if not is_mig_capability(cap["name"]) and not observed["nodes"][path].get("exists"):
                continue  # made on demand by whoever uses it (nvidia-modprobe -f); its absence is no drift
            kept_by = KEPT_BY_CAP % cap["name"] if cap["modify"] else KEPT_BY_NONE
            wanted.append((path, caps_major, minor, 0, 0, cap["mode"], cap["modify"],
                           kept_by, (0, policy["gid"], cap_mode(cap["mode"], policy))))
    return wanted


def not_persistable(wanted, name_of=None):
    """[{path, wanted, kept, kept_by}] for the nodes where the policy asks for what nothing keeps."""
    name_of = name_of or (lambda kind, ident: "root" if ident == 0 else None)

    def text(uid, gid, mode):
        return "%s:%s %04o" % (name_of("user", uid) or uid, name_of("group", gid) or gid, mode)

    def access(uid, gid, mode):  # the group does not matter when the mode gives it nothing
        return uid, gid if mode & 0o070 else None, mode

    return [{"path": path, "wanted": text(*wants), "kept": text(uid, gid, mode), "kept_by": kept_by}
            for path, _major, _minor, uid, gid, mode, fix, kept_by, wants in wanted
            if fix and access(*wants) != access(uid, gid, mode)]


def _node_action(path, current, major, minor, uid, gid, mode, fix, create_missing):
    if not current.get("exists"):
        return "create" if create_missing else "missing"
    if current["type"] == "directory":
        raise GpuhardenError(
            "%s: is a directory where the character device %d:%d belongs; refusing to replace it" % (path, major, minor))
    if current["type"] == "link":  # never replaced (nor written through) unasked: someone put it there
        raise GpuhardenError(
            "%s: is a symbolic link (to %s) where the character device %d:%d belongs; refusing to replace it"
            % (path, _files.shown(current["target"]), major, minor),
            fix="remove the link: this module (or nvidia-modprobe) then makes the device node")
    if current["type"] != "char" or (current["major"], current["minor"]) != (major, minor):
        return "replace"
    if fix and (current["uid"], current["gid"], int(current["mode"], 8)) != (uid, gid, mode):
        return "fix"
    return "ok"


def _link_target(node_path):
    return os.path.relpath(node_path, CHAR_DIR)


def _link_ok(link_path, desc, node_path):
    if not desc.get("exists") or desc["type"] != "link":
        return False
    target = desc["target"]
    resolved = target if target.startswith("/") else os.path.normpath(os.path.join(os.path.dirname(link_path), target))
    return resolved == node_path


def _nvreg_value(text, path, number, key):
    try:
        return int(text, 0) if not re.fullmatch(r"0[0-7]+", text) else int(text, 8)
    except ValueError:
        raise GpuhardenError("%s line %d: %s=%r is not a number" % (path, number, key, text)) from None


def _options_nvidia(line):
    tokens = line.split()
    return tokens if len(tokens) >= 2 and tokens[0] == "options" and tokens[1].replace("-", "_") == "nvidia" else None


def desired_nvreg(policy):
    return {"NVreg_DeviceFileUID": "%d" % policy["uid"], "NVreg_DeviceFileGID": "%d" % policy["gid"],
            "NVreg_DeviceFileMode": "%04o" % policy["mode"]}


# The commands kmod reads in a modprobe.d file; it skips any other line with "ignoring bad line starting with"
# (kmod libkmod/libkmod-config.c kmod_config_parse).  A parameter is NAME or NAME=VALUE (the kernel's
# kernel/params.c parse_args and next_arg).
KMOD_COMMANDS = ("alias", "blacklist", "options", "install", "remove", "softdep", "weakdep")
_MODULE_PARAMETER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*(=\S*)?$")


def refuse_lines_kmod_ignores(path, lines):
    """Refuse to edit a modprobe.d file with a line kmod ignores or a parameter the kernel cannot read: whoever wrote
    it meant something the node does not do, and gpuharden's edit would look like it works."""
    continued = False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        was_continued, continued = continued, stripped.endswith("\\")
        if was_continued or not stripped or stripped.startswith("#"):
            continue
        words = stripped.split()
        if words[0] not in KMOD_COMMANDS:
            raise GpuhardenError("%s line %d: %s is not a modprobe.d command: kmod ignores the line"
                                 % (_files.shown(path), number, _files.shown(words[0])[:80]),
                                 fix="fix or remove the line (commands: %s)" % ", ".join(KMOD_COMMANDS))
        if words[0] == "options":
            for word in words[2:]:
                if not continued and not _MODULE_PARAMETER.match(word):
                    raise GpuhardenError("%s line %d: %s is not a module parameter (NAME or NAME=VALUE) of options %s"
                                         % (_files.shown(path), number, _files.shown(word)[:80], _files.shown(words[1])[:80]),
                                         fix="fix or remove it")


def plan_modprobe(path, text, policy):
    """The options file with NVreg_DeviceFileUID/GID/Mode set; other lines and parameters kept."""
    desired = desired_nvreg(policy)
    if text is None:
        return MODPROBE_HEADER + "options nvidia %s\n" % " ".join("%s=%s" % item for item in desired.items())
    if "\x00" in text:  # kmod reads a line as a C string: a NUL ends it, and what follows on that line is lost
        raise GpuhardenError("%s line %d: holds a NUL byte: not a modprobe.d text file, refusing to edit it"
                             % (_files.shown(path), text[:text.index("\x00")].count("\n") + 1),
                             fix="remove the NUL bytes from the file")
    lines = text.split("\n")
    refuse_lines_kmod_ignores(path, lines)
    seen = set()
    first_options = None
    for index, line in enumerate(lines):
        tokens = _options_nvidia(line)
        if tokens is None:
            continue
        if line.rstrip().endswith("\\"):
            raise GpuhardenError("%s line %d: a continued 'options nvidia' line; join it into one line first" % (path, index + 1))
        first_options = index if first_options is None else first_options
        changed = False
        for position, token in enumerate(tokens[2:], start=2):
            key, sep, value = token.partition("=")
            if key not in desired:
                continue
            if not sep or not value:
                raise GpuhardenError("%s line %d: %s has no value (expected %s=<number>)" % (path, index + 1, key, key))
            number = _nvreg_value(value, path, index + 1, key)
            if NVREG_KEYS[key] == "mode" and not 0 <= number <= 0o777:
                raise GpuhardenError("%s line %d: %s=%s is not a permission mode (0-0777)" % (path, index + 1, key, value))
            seen.add(key)
            if number != int(desired[key], 8 if NVREG_KEYS[key] == "mode" else 10):
                tokens[position] = "%s=%s" % (key, desired[key])
                changed = True
        if changed:
            lines[index] = " ".join(tokens)
    missing = [key for key in desired if key not in seen]
    if missing and first_options is not None:
        lines[first_options] = lines[first_options].rstrip() + "".join(" %s=%s" % (key, desired[key]) for key in missing)
    elif missing:
        body = "\n".join(lines)
        if body and not body.endswith("\n"):
            body += "\n"
        return body + "options nvidia %s\n" % " ".join("%s=%s" % (key, desired[key]) for key in missing)
    return "\n".join(lines)


def plan_udev_cleanup(text):
    """The rules file without the header and rules earlier versions wrote (``None``: remove the file).

    Only lines exactly as those versions wrote them go; every other line, a site's own rules for these
    devices included, is kept as it is.  (Those never fire either: the devices send no uevent.)"""
    if text is None:
        return None
    lines = text.split("\n")
    keep = [line for line in lines if line not in OLD_UDEV_HEADERS and not _OLD_UDEV_RULE.match(line)]
    if len(keep) == len(lines):
        return text
    if not "".join(keep).strip():
        return None
    return "\n".join(keep)


def find_conflicts(others, own_path, shadow, cmdline, policy):
    """Settings elsewhere that fight ours: [{file, line, parameter, value, expected, overrides}]."""
    desired = {key: int(value, 8 if NVREG_KEYS[key] == "mode" else 10) for key, value in desired_nvreg(policy).items()}
    own_name = os.path.basename(own_path)
    conflicts = []
    if shadow and shadow != own_path:
        conflicts.append({"file": shadow, "line": None, "parameter": "file", "value": shadow, "expected": own_path,
                          "overrides": True, "message": "%s is read instead of %s (same name, higher priority directory)" % (shadow, own_path)})

    def check(path, number, key, value, overrides):
        if key == "NVreg_ModifyDeviceFiles":
            if value.strip() not in ("1", "0x1", "01"):
                conflicts.append({"file": path, "line": number, "parameter": key, "value": value, "expected": "1",
                                  "overrides": True,
                                  "message": "the driver never touches /dev: nodes keep whatever mode they get"})
            return
        try:
            found = int(value, 8) if re.fullmatch(r"0[0-7]+", value) else int(value, 0)
        except ValueError:
            found = None
        if found != desired[key]:
            expected = "%04o" % desired[key] if NVREG_KEYS[key] == "mode" else "%d" % desired[key]
            conflicts.append({"file": path, "line": number, "parameter": key, "value": value, "expected": expected,
                              "overrides": overrides,
                              "message": "read after %s: wins" % own_path if overrides else "read before %s: overridden" % own_path})

    for path, text in others:
        overrides = os.path.basename(path) > own_name
        logical, start = "", None
        for number, line in enumerate(text.split("\n"), start=1):
            start = number if start is None else start
            if line.rstrip().endswith("\\"):
                logical += line.rstrip()[:-1] + " "
                continue
            logical += line
            tokens = _options_nvidia(logical)
            for token in (tokens or [])[2:]:
                key, sep, value = token.partition("=")
                if sep and (key in NVREG_KEYS or key == "NVreg_ModifyDeviceFiles"):
                    check(path, start, key, value, overrides)
            logical, start = "", None
    for token in cmdline.split():
        key, sep, value = token.partition("=")
        module, dot, parameter = key.partition(".")
        if sep and dot and module.replace("-", "_") == "nvidia" and (parameter in NVREG_KEYS or parameter == "NVreg_ModifyDeviceFiles"):
            check("/proc/cmdline", None, parameter, value, True)
    return conflicts


def plan(observed, policy, *, create_missing=True, char_links=True, persist=True,
         modprobe_file="/etc/modprobe.d/zz-gpuharden-nvidia.conf",
         udev_rules_file="/etc/udev/rules.d/70-gpuharden-nvidia.rules", root="/", name_of=None):
    """Decide every change. Returns a dict: nodes, links, dirs, actions, changes (FileChange list; udev_cleanup
    is the one removing old udev rules, or None), conflicts, reboot_or_reload_required, driver_params,
    unknown_nodes, not_persistable, warnings, diff_before/after."""
    name_of = name_of or (lambda kind, ident: "root" if ident == 0 else None)
    warnings = []
    wanted = _wanted_nodes(observed, policy, warnings)
    nodes, node_actions, lines_before, lines_after, actions = {}, [], [], [], []
    dirs = []
    for path, major, minor, uid, gid, mode, fix, kept_by, _wants in wanted:
        current = observed["nodes"].get(path) or {"exists": False}
        action = _node_action(path, current, major, minor, uid, gid, mode, fix, create_missing)
        after = {"exists": True, "type": "char", "major": major, "minor": minor, "uid": uid, "gid": gid,
                 "owner": name_of("user", uid), "group": name_of("group", gid), "mode": "%04o" % mode}
        if action in ("ok", "missing"):
            after = dict(current)
        nodes[path] = {"action": action, "before": describe(current, name_of), "after": describe(after, name_of),
                       "kept_by": kept_by}
        if action in ("create", "replace", "fix"):
            node_actions.append({"path": path, "action": action, "major": major, "minor": minor, "uid": uid, "gid": gid,
                                 "mode": mode, "chown": (current.get("uid"), current.get("gid")) != (uid, gid),
                                 "chmod": current.get("mode") != "%04o" % mode})
            lines_before.append("%s: %s" % (path, nodes[path]["before"]))
            lines_after.append("%s: %s" % (path, nodes[path]["after"]))
            actions.append("%s: %s -> %s" % (path, nodes[path]["before"], nodes[path]["after"]))
            if path.startswith(CAPS_DIR + "/") and not observed["dirs"][CAPS_DIR].get("exists") and CAPS_DIR not in dirs:
                dirs.append(CAPS_DIR)
        elif action == "missing":
            warnings.append("%s is missing (%d:%d) and create_missing is false" % (path, major, minor))
    for path in (CAPS_DIR, CHAR_DIR):
        desc = observed["dirs"][path]
        needed = any(p.startswith(CAPS_DIR + "/") for p in nodes) if path == CAPS_DIR else char_links
        if desc.get("exists") and desc["type"] != "directory" and needed:
            raise GpuhardenError("%s: exists and is not a directory (%s); refusing to replace it" % (path, describe(desc, name_of)))
    links, link_actions = {}, []
    if char_links:
        for path, major, minor, *_rest in wanted:
            if nodes[path]["action"] == "missing":
                continue
            link = "%s/%d:%d" % (CHAR_DIR, major, minor)
            current = observed["links"].get(link) or {"exists": False}
            if current.get("exists") and current["type"] not in ("link",):
                raise GpuhardenError("%s: exists and is not a symlink (%s); refusing to replace it" % (link, describe(current, name_of)))
            target = _link_target(path)
            ok = _link_ok(link, current, path)
            links[link] = {"action": "ok" if ok else ("replace" if current.get("exists") else "create"),
                           "before": describe(current, name_of), "after": "link -> %s" % target if not ok else describe(current, name_of)}
            if not ok:
                link_actions.append({"path": link, "target": target})
                lines_before.append("%s: %s" % (link, links[link]["before"]))
                lines_after.append("%s: %s" % (link, links[link]["after"]))
                actions.append("%s: %s -> %s" % (link, links[link]["before"], links[link]["after"]))
                if not observed["dirs"][CHAR_DIR].get("exists") and CHAR_DIR not in dirs:
                    dirs.append(CHAR_DIR)
    changes, udev_cleanup = [], None
    if persist:
        changes.append(_files.FileChange(_host.host_path(root, modprobe_file), observed["modprobe_text"],
                                         plan_modprobe(modprobe_file, observed["modprobe_text"], policy), mode=0o644,
                                         reason="NVreg_DeviceFile* options for the nvidia module"))
        if observed["udev_text"] is not None:
            udev_cleanup = _files.FileChange(_host.host_path(root, udev_rules_file), observed["udev_text"],
                                             plan_udev_cleanup(observed["udev_text"]), mode=0o644,
                                             reason="udev rules for nvidia-uvm*/nvidia-cap* that never fire (the devices "
                                                    "send no uevent): removed")
            changes.append(udev_cleanup)
    kept = not_persistable(wanted, name_of)
    if kept:
        warnings.append(
            "policy %s cannot stick for %s: nvidia-modprobe resets them to %s at every container start, whatever the "
            "module parameters; they are kept at that, and access stays limited through /dev/nvidiactl and "
            "/dev/nvidia<N>" % (policy["policy"], ", ".join(sorted(entry["path"] for entry in kept)),
                                " / ".join(sorted({entry["kept"] for entry in kept}))))
    params = observed["params"]
    running = None
    if params is not None:
        running = {param: params.get(param) for _key, param, _field in NVREG}
    desired_params = {param: policy[field] for _key, param, field in NVREG}
    reload_required = running is not None and any(running[param] != desired_params[param] for param in running)
    known = set(nodes)
    unknown = sorted(path for path, desc in observed["nodes"].items()
                     if desc.get("exists") and path not in known and desc.get("type") != "directory"
                     and path not in ("/dev/nvidia-modeset",) and not path.startswith(CHAR_DIR))
    return {
        "nodes": nodes,
        "links": links,
        "dirs": dirs,
        "node_actions": node_actions,
        "link_actions": link_actions,
        "actions": actions,
        "changes": changes,
        "udev_cleanup": udev_cleanup,
        "conflicts": find_conflicts(observed["modprobe_others"], modprobe_file, observed["modprobe_shadow"],
                                    observed["cmdline"], policy),
        "reboot_or_reload_required": reload_required,
        "driver_params": {"running": running, "desired": desired_params},
        "driver_loaded": observed["driver_loaded"],
        "unknown_nodes": unknown,
        "not_persistable": kept,
        "warnings": warnings,
        "diff_before": "".join(line + "\n" for line in lines_before),
        "diff_after": "".join(line + "\n" for line in lines_after),
    }


def changed(planned):
    return bool(planned["dirs"] or planned["node_actions"] or planned["link_actions"]
                or any(change.changed for change in planned["changes"]))


# ---------------------------------------------------------------------------------------------
# Applying node and link actions (only outside check mode)


def _temp_name(path):
    return os.path.join(os.path.dirname(path), ".gpuharden-%s-%d" % (os.path.basename(path).replace(":", "_"), os.getpid()))


def preflight(planned, root):
    """Refuse, before the first change, what would stop a change half-way: each file change as ``_files.check_change``
    sees it (a link, a special file, an immutable file or directory, a change made since the read), and an immutable
    or append-only directory a node or link goes in (the kernel refuses mknod, rename and unlink there, even for root).
    A device node itself cannot carry those flags: chattr's FS_IOC_SETFLAGS on a device node reaches its driver, not
    the filesystem (chattr answers "Operation not supported while reading flags")."""
    for change in planned["changes"]:
        if change.changed:
            _files.check_change(root, change)
    directories = {os.path.dirname(action["path"]) for action in planned["node_actions"] + planned["link_actions"]}
    directories |= {os.path.dirname(path) for path in planned["dirs"]}
    for directory in sorted(directories):
        here = _host.host_path(root, directory)
        if os.path.isdir(here) and not os.path.islink(here):
            _files.refuse_immutable(here, directory, directory=True)


def apply_nodes(planned, root, label=None):
    """Carry out dirs, node and link actions; ``label(path)`` may set an SELinux context on new nodes.
    Returns the actions done; raises GpuhardenError (with ``applied``) on the first failure."""
    done = []
    try:
        for path in planned["dirs"]:
            target = _host.host_path(root, path)
            os.makedirs(target, 0o755, exist_ok=True)
            os.chmod(target, 0o755)
            done.append("%s: directory created" % path)
        for action in planned["node_actions"]:
            target = _host.host_path(root, action["path"])
            if action["action"] == "fix":
                if action["chown"]:
                    os.chown(target, action["uid"], action["gid"])
                if action["chmod"] or action["chown"]:  # chown clears setuid/setgid; set the mode last
                    os.chmod(target, action["mode"])
            else:
                temp = _temp_name(target)
                os.mknod(temp, stat.S_IFCHR | action["mode"], os.makedev(action["major"], action["minor"]))
                try:
                    os.chown(temp, action["uid"], action["gid"])
                    os.chmod(temp, action["mode"])  # mknod applied the umask
                    if label:
                        label(temp)
                    os.rename(temp, target)
                except BaseException:
                    os.unlink(temp)
                    raise
            done.append("%s: %s" % (action["path"], action["action"]))
        for action in planned["link_actions"]:
            target = _host.host_path(root, action["path"])
            temp = _temp_name(target)
            os.symlink(action["target"], temp)
            try:
                os.rename(temp, target)
            except BaseException:
                os.unlink(temp)
                raise
            done.append("%s: link -> %s" % (action["path"], action["target"]))
    except OSError as error:
        raise GpuhardenError("%s: %s (after: %s)" % (error.filename or "device node", error.strerror, "; ".join(done) or "nothing"),
                             applied=done) from None
    return done


# ---------------------------------------------------------------------------------------------
# Options and the whole decision, shared by nvidia_device_nodes and node_audit


def argument_spec():
    return {
        "root": {"type": "path", "default": "/"},
        "policy": {"type": "str", "choices": list(POLICIES), "default": "default"},
        "owner": {"type": "raw"},
        "group": {"type": "raw"},
        "mode": {"type": "raw"},
        "create_missing": {"type": "bool", "default": True},
        "char_links": {"type": "bool", "default": True},
        "persist": {"type": "bool", "default": True},
        "modprobe_file": {"type": "path", "default": "/etc/modprobe.d/zz-gpuharden-nvidia.conf"},
        "udev_rules_file": {"type": "path", "default": "/etc/udev/rules.d/70-gpuharden-nvidia.rules"},
        "on_conflict": {"type": "str", "choices": ["warn", "fail"], "default": "warn"},
        "backup": {"type": "bool", "default": False},
        "gpu_operator": _gpu_operator.argument(),
    }


def check_paths(params):
    for option, suffix in (("modprobe_file", ".conf"), ("udev_rules_file", ".rules")):
        value = params[option]
        if not value.startswith("/") or not value.endswith(suffix) or value.endswith("/" + suffix):
            raise GpuhardenError("option %s=%s: give an absolute path ending in %s (other names are ignored by %s)"
                                 % (option, _files.shown(value)[:300], suffix, "modprobe" if suffix == ".conf" else "udev"))


# The node stage this planner serves, as gpuharden_operator_takeover names it
STAGE = "device_permissions"


def deferred_plan(root, policy, refused):
    """The plan of a node whose driver the GPU Operator's driver container serves: nothing to change (plan's keys)."""
    params = _host.driver_params(root)
    return {"nodes": {}, "links": {}, "dirs": [], "node_actions": [], "link_actions": [], "actions": [], "changes": [],
            "udev_cleanup": None, "conflicts": [], "reboot_or_reload_required": False,
            "driver_params": {"running": None, "desired": {param: policy[field] for _key, param, field in NVREG}},
            "driver_loaded": _host.driver_gpus(root) is not None or params is not None, "unknown_nodes": [],
            "not_persistable": [], "warnings": [], "diff_before": "", "diff_after": "", "refused": refused}


def decide(params):
    """Parse the options, read the node, plan everything (nothing changes here).  Where the GPU Operator's driver
    container serves the driver (the controller's ClusterPolicy reading, or its driver root on the node) and the stage
    is not taken over, the plan changes nothing and ``refused`` says why."""
    check_paths(params)
    root = params["root"]
    check_root(root)
    lookup_user, lookup_group, name_of = id_lookups(root)
    policy = resolve_policy(params["policy"], params["owner"], params["group"], params["mode"],
                            lookup_user, lookup_group, name_of)
    operator = _gpu_operator.options(params)
    what = "the NVIDIA device nodes, their /dev/char links and %s" % params["modprobe_file"]
    refused, not_checked, warnings = _gpu_operator.decide(STAGE, what, _gpu_operator.driver_layout(root, operator["driver_root"]), params)
    if refused:
        planned = deferred_plan(root, policy, refused)
    else:
        observed = observe(root, params["modprobe_file"], params["udev_rules_file"])
        planned = plan(
            observed, policy, create_missing=params["create_missing"], char_links=params["char_links"],
            persist=params["persist"], modprobe_file=params["modprobe_file"],
            udev_rules_file=params["udev_rules_file"], root=root, name_of=name_of)
        planned["warnings"] = warnings + planned["warnings"]
        planned["refused"] = []
        effective = [conflict for conflict in planned["conflicts"] if conflict["overrides"]]
        if effective and params["on_conflict"] == "fail":
            raise GpuhardenError(
                "conflicting NVIDIA device-file settings (on_conflict=fail, nothing changed): %s" % "; ".join(
                    "%s%s: %s=%s (wanted %s)" % (c["file"], "" if c["line"] is None else " line %d" % c["line"],
                                                 c["parameter"], c["value"], c["expected"]) for c in effective),
                conflicts=planned["conflicts"])
    planned["not_checked"] = not_checked
    return policy, planned
