# SPDX-License-Identifier: GPL-3.0-or-later
"""A containerd stand-in for lab nodes (config loading only, no CRI).

Like containerd it loads ``/etc/containerd/config.toml`` (or ``--config``/``-c``), follows the
top-level ``imports`` globs (relative to the importing file's directory) and refuses to start on
invalid TOML or an unsupported ``version``; otherwise it idles until SIGTERM.

Usage: ``python -m gpuharden_lab.standins.containerd [--config FILE] [--version]``
"""

from __future__ import annotations

import glob
import os
import signal
import sys
import threading
import time
import tomllib

from gpuharden_lab.standins import rooted, standin_root

VERSION = "v2.1.4"
REVISION = "gpuharden-standin"
DEFAULT_CONFIG = "/etc/containerd/config.toml"
SUPPORTED_VERSIONS = (1, 2, 3)


def log(level: str, msg: str) -> None:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".000000000Z"
    sys.stderr.write('time="%s" level=%s msg="%s"\n' % (ts, level, msg.replace('"', '\\"')))
    sys.stderr.flush()


class ConfigError(Exception):
    pass


def load_config(path: str, seen: set[str] | None = None) -> dict:
    """Load a config file and its imports as containerd does: the file first, then each import over it.

    containerd 2.x (config version 3) merges imports key by key; containerd 1.x (version 2) replaces
    each top-level plugin section that an import defines as a whole (containerd#5837).
    """
    seen = set() if seen is None else seen
    real = rooted(path)
    if str(real) in seen:
        return {}
    seen.add(str(real))
    try:
        data = tomllib.loads(real.read_text())
    except FileNotFoundError as e:
        raise ConfigError("failed to load TOML: %s: open %s: no such file or directory" % (path, path)) from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("failed to load TOML from %s: %s" % (path, e)) from e
    version = data.get("version", 1)
    if not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
        raise ConfigError("unsupported config version %r in %s (containerd %s supports 1-3)" % (version, path, VERSION))
    merged: dict = {}
    imported: list[dict] = []
    imports = data.get("imports", [])
    if not isinstance(imports, list):
        raise ConfigError("failed to load TOML from %s: imports must be a list of strings" % path)
    for pattern in imports:
        pat = pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(path), pattern)
        matches = sorted(glob.glob(str(rooted(pat))))
        for m in matches:
            root = standin_root()
            node_path = m if root == "/" else "/" + os.path.relpath(m, root)
            log("info", "loading config import %s" % node_path)
            imp = load_config(node_path, seen)
            # containerd migrates older imports; a newer version in an import is rejected
            if "version" in imp and imp["version"] > version:
                raise ConfigError("unsupported config version %r in %s (importing file has version %r)"
                                  % (imp["version"], node_path, version))
            imported.append(imp)
    _merge(merged, data)
    for imp in imported:
        if version >= 3:
            _merge(merged, imp)
            continue
        for key, value in imp.items():
            if key == "plugins" and isinstance(value, dict):
                merged.setdefault("plugins", {}).update(value)  # whole plugin sections replaced
            elif key not in ("version", "imports"):
                merged[key] = value
    return merged


def _merge(dst: dict, src: dict) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    config = DEFAULT_CONFIG
    it = iter(args)
    for a in it:
        if a in ("--version", "-v"):
            print("containerd github.com/containerd/containerd/v2 %s %s" % (VERSION, REVISION))
            return 0
        if a in ("--config", "-c"):
            config = next(it, config)
        elif a.startswith("--config="):
            config = a.split("=", 1)[1]
        elif a.startswith("-"):
            log("info", "ignoring flag %s" % a)
    log("info", "starting containerd (gpuharden stand-in) revision=%s version=%s" % (REVISION, VERSION))
    if not rooted(config).exists() and config == DEFAULT_CONFIG:
        log("info", "no config file %s, using defaults" % config)
        cfg: dict = {"version": 1}
    else:
        try:
            cfg = load_config(config)
        except ConfigError as e:
            log("error", str(e))
            sys.stderr.write("containerd: failed to load TOML: %s\n" % e)
            return 1
    runtimes = _runtimes(cfg)
    log("info", "loaded config version=%s runtimes=%s" % (cfg.get("version", 1), ",".join(sorted(runtimes)) or "-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log("info", "containerd successfully booted")
    while not stop.wait(3600):
        pass
    log("info", "Stop CRI service")
    return 0


def _runtimes(cfg: dict) -> dict:
    plugins = cfg.get("plugins", {})
    for key in ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"):
        cri = plugins.get(key, {})
        rts = cri.get("containerd", {}).get("runtimes", {})
        if rts:
            return rts
    return {}


if __name__ == "__main__":
    sys.exit(main())
