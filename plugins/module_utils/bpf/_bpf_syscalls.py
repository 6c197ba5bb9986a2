# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""bpf(2) through ctypes: which BPF_CGROUP_DEVICE programs apply to a cgroup, and their instructions.

No compiler, no kernel headers, no bcc: ``syscall(NR_bpf, cmd, &attr, size)`` with ``union bpf_attr``
and ``struct bpf_prog_info`` laid out by hand (offsets of the 6.1 uapi; the kernel accepts any attr
size as long as the unused tail is zero).

* ``query_programs``: BPF_PROG_QUERY, with or without BPF_F_QUERY_EFFECTIVE (own programs first, then
  the ancestors' ALLOW_MULTI programs).
* ``dump_program``: BPF_PROG_GET_FD_BY_ID, then BPF_OBJ_GET_INFO_BY_FD for the translated (xlated)
  instructions.  A program the kernel will not dump (constant blinding with raw dumps restricted:
  ``xlated_prog_insns`` comes back 0; no CAP_BPF: ``xlated_prog_len`` 0) is returned with
  ``insns=None`` and the reason, never guessed.
* ``load_program``, ``attach_program``, ``detach_program``: BPF_PROG_LOAD / PROG_ATTACH / PROG_DETACH,
  for tests and benchmarks that need programs shaped like other generators' (the audit never writes).

Reading needs root on the node (CAP_SYS_ADMIN, or CAP_BPF with CAP_NET_ADMIN): EPERM says so.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

NR_BPF = {"x86_64": 321, "amd64": 321, "aarch64": 280, "arm64": 280}

BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
COMMAND_NAMES = {
    BPF_PROG_LOAD: "BPF_PROG_LOAD", BPF_PROG_ATTACH: "BPF_PROG_ATTACH", BPF_PROG_DETACH: "BPF_PROG_DETACH",
    BPF_PROG_GET_FD_BY_ID: "BPF_PROG_GET_FD_BY_ID", BPF_OBJ_GET_INFO_BY_FD: "BPF_OBJ_GET_INFO_BY_FD",
    BPF_PROG_QUERY: "BPF_PROG_QUERY",
}  # fmt: skip

BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_OVERRIDE = 1
BPF_F_ALLOW_MULTI = 2
BPF_F_REPLACE = 4
BPF_F_QUERY_EFFECTIVE = 1

ATTR_SIZE = 144  # sizeof(union bpf_attr), 6.1
INFO_SIZE = 232  # sizeof(struct bpf_prog_info), 6.1
DUMP_BUFFER_INSNS = 512  # first try (runc and crun emit tens of instructions); grown to the real size when larger

_PRIVILEGE_HINT = "reading device-cgroup programs needs root on the node (CAP_SYS_ADMIN, or CAP_BPF and CAP_NET_ADMIN)"


class BpfError(GpuhardenError):
    """A bpf(2) call failed; ``errno`` is the error number."""

    def __init__(self, msg, errno_=None):
        super().__init__(msg)
        self.errno = errno_


_syscall = None


def _libc_syscall():
    global _syscall
    if _syscall is None:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syscall
        function.restype = ctypes.c_long
        _syscall = function
    return _syscall


def syscall_number(machine=None):
    machine = machine or platform.machine()
    try:
        return NR_BPF[machine]
    except KeyError:
        raise BpfError("bpf(2): unsupported machine %r (known: x86_64, aarch64)" % machine) from None


_nr_bpf = None


def bpf(cmd, attr, what=""):
    """Call bpf(cmd, attr); returns the result (an fd for some commands) or raises BpfError."""
    global _nr_bpf
    if _nr_bpf is None:
        _nr_bpf = syscall_number()
    ret = _libc_syscall()(ctypes.c_long(_nr_bpf), ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        name = COMMAND_NAMES.get(cmd, "command %d" % cmd)
        msg = "bpf(%s)%s failed: %s" % (name, " on " + what if what else "", os.strerror(err))
        if err == errno.EPERM:
            msg += "; " + _PRIVILEGE_HINT
        elif err == errno.ENOSYS:
            msg += "; the kernel has no bpf(2)"
        raise BpfError(msg, err)
    return ret


def _u32(buf, offset, value=None):
    field = ctypes.c_uint32.from_buffer(buf, offset)
    if value is not None:
        field.value = value
    return field.value


def _u64(buf, offset, value=None):
    field = ctypes.c_uint64.from_buffer(buf, offset)
    if value is not None:
        field.value = value
    return field.value


def open_cgroup(path):
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        raise BpfError("cannot open cgroup %s: %s" % (path, error.strerror), error.errno) from None


def query_programs(cgroup, effective=True, attach_type=BPF_CGROUP_DEVICE):
    """Program IDs attached to ``cgroup`` (a path or an open directory fd) for ``attach_type``.

    ``effective``: BPF_F_QUERY_EFFECTIVE, the programs that run for the cgroup's processes (its own
    first, then its ancestors' ALLOW_MULTI ones).  Returns (ids, attach_flags).
    """
    fd = cgroup if isinstance(cgroup, int) else open_cgroup(cgroup)
    what = cgroup if isinstance(cgroup, str) else "cgroup fd %d" % fd
    try:
        count = 8
        while True:
            ids = (ctypes.c_uint32 * count)()
            attr = ctypes.create_string_buffer(ATTR_SIZE)
            _u32(attr, 0, fd)
            _u32(attr, 4, attach_type)
            _u32(attr, 8, BPF_F_QUERY_EFFECTIVE if effective else 0)
            _u64(attr, 16, ctypes.addressof(ids))
            _u32(attr, 24, count)
            try:
                bpf(BPF_PROG_QUERY, attr, what)
            except BpfError as error:
                if error.errno == errno.ENOSPC and _u32(attr, 24) > count:
                    count = _u32(attr, 24)
                    continue
                raise
            return list(ids[: _u32(attr, 24)]), _u32(attr, 12)
    finally:
        if not isinstance(cgroup, int):
            os.close(fd)


def prog_fd_by_id(prog_id):
    attr = ctypes.create_string_buffer(ATTR_SIZE)
    _u32(attr, 0, prog_id)
    return bpf(BPF_PROG_GET_FD_BY_ID, attr, "program %d" % prog_id)


def prog_info(prog_fd, dump=True, buffer_insns=DUMP_BUFFER_INSNS):
    """``struct bpf_prog_info`` of a program fd: type, id, tag, name, and (``dump``) the xlated bytes.

    Returns a dict; ``xlated`` is bytes, or None with ``unauditable`` saying why.
    """
    size = buffer_insns * 8
    while True:
        info = ctypes.create_string_buffer(INFO_SIZE)
        insns = ctypes.create_string_buffer(size) if dump else None
        if dump:
            _u32(info, 20, size)
            _u64(info, 32, ctypes.addressof(insns))
        attr = ctypes.create_string_buffer(ATTR_SIZE)
        _u32(attr, 0, prog_fd)
        _u32(attr, 4, INFO_SIZE)
        _u64(attr, 8, ctypes.addressof(info))
        bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "program fd %d" % prog_fd)
        length = _u32(info, 20)
        if dump and length > size:
            size = length
            continue
        result = {
            "type": _u32(info, 0),
            "id": _u32(info, 4),
            "tag": info.raw[8:16].hex(),
            "name": info.raw[64:80].split(b"\0", 1)[0].decode("ascii", "replace"),
            "xlated_len": length,
            "xlated": None,
            "unauditable": None,
        }
        if dump:
            if length == 0:
                result["unauditable"] = "the kernel returned no translated instructions (the caller lacks CAP_BPF/CAP_SYS_ADMIN)"
            elif _u64(info, 32) == 0:
                result["unauditable"] = "the kernel will not dump the program: constant blinding (net.core.bpf_jit_harden) with raw dumps restricted"
            else:
                result["xlated"] = ctypes.string_at(insns, length)  # not .raw: that copies the whole buffer
        return result


def dump_program(prog_id):
    """``prog_info`` (with the xlated instructions) of a program by ID; None if it no longer exists."""
    try:
        fd = prog_fd_by_id(prog_id)
    except BpfError as error:
        if error.errno == errno.ENOENT:
            return None
        raise
    try:
        return prog_info(fd)
    finally:
        os.close(fd)


def load_program(insns, prog_type=BPF_PROG_TYPE_CGROUP_DEVICE, name="", license_="GPL"):
    """BPF_PROG_LOAD of raw instruction bytes; returns the program fd (the verifier log is in the error)."""
    code = ctypes.create_string_buffer(bytes(insns), len(insns))
    lic = ctypes.create_string_buffer(license_.encode())
    log = ctypes.create_string_buffer(65536)
    attr = ctypes.create_string_buffer(ATTR_SIZE)
    _u32(attr, 0, prog_type)
    _u32(attr, 4, len(insns) // 8)
    _u64(attr, 8, ctypes.addressof(code))
    _u64(attr, 16, ctypes.addressof(lic))
    _u32(attr, 24, 1)
    _u32(attr, 28, len(log))
    _u64(attr, 32, ctypes.addressof(log))
    ctypes.memmove(ctypes.addressof(attr) + 48, name.encode()[:15], len(name.encode()[:15]))
    try:
        return bpf(BPF_PROG_LOAD, attr)
    except BpfError as error:
        raise BpfError("%s\n%s" % (error.msg, log.value.decode("utf-8", "replace")), error.errno) from None


def attach_program(cgroup, prog_fd, flags=BPF_F_ALLOW_MULTI, attach_type=BPF_CGROUP_DEVICE, replace_fd=0):
    _cgroup_prog_command(BPF_PROG_ATTACH, cgroup, prog_fd, attach_type, flags, replace_fd)


def detach_program(cgroup, prog_fd, attach_type=BPF_CGROUP_DEVICE):
    _cgroup_prog_command(BPF_PROG_DETACH, cgroup, prog_fd, attach_type)


def _cgroup_prog_command(command, cgroup, prog_fd, attach_type, flags=0, replace_fd=0):
    """BPF_PROG_ATTACH and BPF_PROG_DETACH read the same attr: target_fd, attach_bpf_fd, attach_type, attach_flags,
    replace_bpf_fd (zero where detach has no use for them).  ``cgroup`` is a path, opened and closed here, or an fd
    the caller keeps."""
    fd = cgroup if isinstance(cgroup, int) else open_cgroup(cgroup)
    try:
        attr = ctypes.create_string_buffer(ATTR_SIZE)
        _u32(attr, 0, fd)
        _u32(attr, 4, prog_fd)
        _u32(attr, 8, attach_type)
        _u32(attr, 12, flags)
        _u32(attr, 16, replace_fd)
        bpf(command, attr, cgroup if isinstance(cgroup, str) else "")
    finally:
        if not isinstance(cgroup, int):
            os.close(fd)
