# SPDX-License-Identifier: GPL-3.0-or-later
"""Stand-ins for the node services the product manages: systemctl, the kubelet and containerd.

They run inside lab nodes (network + mount namespaces) in place of systemd, a real kubelet and
containerd.  The product never imports them.  Each reads the same files the real program reads;
for tests outside a lab node, ``GPUHARDEN_STANDIN_ROOT`` (default ``/``) relocates the node's
private trees ``/etc``, ``/run``, ``/var/lib``, ``/var/log`` (and, for executables only,
``/usr/local``) below another directory.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT_ENV = "GPUHARDEN_STANDIN_ROOT"
RELOCATED_PREFIXES = ("/etc", "/run", "/var/lib", "/var/log", "/var/run")


def standin_root() -> str:
    return os.environ.get(ROOT_ENV) or "/"


def rooted(path: str | os.PathLike) -> Path:
    """The real location of a node path: unchanged inside a lab node (root "/")."""
    p = str(path)
    root = standin_root()
    if root == "/" or not p.startswith("/"):
        return Path(p)
    if any(p == pre or p.startswith(pre + "/") for pre in RELOCATED_PREFIXES):
        return Path(root) / p.lstrip("/")
    return Path(p)


def rooted_exe(path: str) -> str:
    """An executable path: relocated when the relocated file exists (tests install fakes there)."""
    root = standin_root()
    if root != "/" and path.startswith("/"):
        cand = Path(root) / path.lstrip("/")
        if cand.exists():
            return str(cand)
    return path


def klog(level: str, where: str, msg: str, **kv: object) -> None:
    """Write one klog-style line to stderr, e.g. ``E0102 15:04:05.000000 1234 run.go:72] "msg" err="..."``."""
    now = time.time()
    lt = time.localtime(now)
    head = "%s%02d%02d %s.%06d %7d %s]" % (
        level,
        lt.tm_mon,
        lt.tm_mday,
        time.strftime("%H:%M:%S", lt),
        int((now % 1) * 1_000_000),
        os.getpid(),
        where,
    )
    parts = [head, go_quote(msg)]
    for k, v in kv.items():
        parts.append("%s=%s" % (k, go_quote(str(v)) if isinstance(v, str) else v))
    sys.stderr.write(" ".join(parts) + "\n")
    sys.stderr.flush()


def go_quote(s: str) -> str:
    """Go's strconv.Quote for the characters that occur in log messages."""
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append("\\x%02x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)
