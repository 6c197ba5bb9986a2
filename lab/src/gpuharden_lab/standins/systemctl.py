# SPDX-License-Identifier: GPL-3.0-or-later
"""A ``systemctl`` stand-in for lab nodes (no systemd runs there).

It reads the real unit files (``/etc/systemd/system``, ``/run/systemd/system``, ``/lib/systemd/system``,
``/usr/lib/systemd/system`` and their ``<unit>.d/*.conf`` drop-ins), keeps the "loaded" definition
from the last ``daemon-reload`` (as systemd does), and supervises Type=simple services: ``start``
spawns a detached supervisor (new session) that runs ExecStartPre=, then ExecStart=, records the
main PID and, when the process ends, the result (``failed``/``exit-code`` on a non-zero exit).
State lives under ``/run/gpuharden-units/<unit>/``; output goes to ``/var/log/<name>.log``.

Usage: ``python -m gpuharden_lab.standins.systemctl [--system] [--no-block] [-q] COMMAND [UNIT...]``
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpuharden_lab.standins import ROOT_ENV, rooted, rooted_exe, standin_root

UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")
STATE_DIR = "/run/gpuharden-units"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIST_KEYS = ("ExecStart", "ExecStartPre", "ExecStartPost", "ExecReload", "ExecStop", "Environment", "EnvironmentFile")
CLEAN_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)


def unit_dir(p: str) -> Path:
    """Unit directories; below GPUHARDEN_STANDIN_ROOT in tests (including /lib, unlike rooted())."""
    root = standin_root()
    return Path(p) if root == "/" else Path(root) / p.lstrip("/")


def log(msg: str) -> None:
    """Diagnostics go to /var/log/gpuharden-systemctl.log (real systemctl is silent on success)."""
    line = "%s gpuharden-systemctl[%d]: %s\n" % (time.strftime("%b %d %H:%M:%S"), os.getpid(), msg)
    if os.environ.get("GPUHARDEN_SYSTEMCTL_DEBUG"):
        sys.stderr.write(line)
    with contextlib.suppress(OSError):
        p = rooted("/var/log/gpuharden-systemctl.log")
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a") as f:
            f.write(line)


def normalize(name: str) -> str:
    name = name.strip()
    if "." not in name.rsplit("/", 1)[-1]:
        name += ".service"
    return name


# --------------------------------------------------------------------------------------------
# unit files


def parse_unit_text(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order; handles comments and backslash continuations."""
    out: list[tuple[str, str, str]] = []
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if pending:
            if line.lstrip().startswith(("#", ";")):
                continue  # comments inside continuations are skipped by systemd
            line = pending + " " + line.strip()
            pending = ""
        else:
            line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if "=" not in line:
            continue
        k, v = line.split("=", 1)
        out.append((section, k.strip(), v.strip()))
    if pending:
        k, _, v = pending.partition("=")
        out.append((section, k.strip(), v.strip()))
    return out


@dataclass
class UnitDef:
    name: str
    fragment: str = ""
    dropins: list[str] = field(default_factory=list)
    masked: bool = False
    settings: dict[str, dict[str, object]] = field(default_factory=dict)
    bad_setting: str = ""

    def get(self, section: str, key: str, default: object = None) -> object:
        return self.settings.get(section, {}).get(key, default)

    def lst(self, key: str) -> list[str]:
        return list(self.settings.get("Service", {}).get(key, []))  # type: ignore[arg-type]

    @property
    def load_state(self) -> str:
        if self.masked:
            return "masked"
        if not self.fragment:
            return "not-found"
        if self.bad_setting:
            return "bad-setting"
        return "loaded"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "fragment": self.fragment,
            "dropins": self.dropins,
            "masked": self.masked,
            "settings": self.settings,
            "bad_setting": self.bad_setting,
        }

    @classmethod
    def from_json(cls, d: dict) -> UnitDef:
        return cls(d["name"], d["fragment"], d["dropins"], d["masked"], d["settings"], d.get("bad_setting", ""))


def find_files(name: str) -> tuple[str, list[str], bool]:
    """Fragment path (as on the node), drop-in paths sorted by file name, masked flag."""
    fragment = ""
    masked = False
    for d in UNIT_DIRS:
        p = unit_dir(d) / name
        if p.is_symlink() and os.readlink(p) == "/dev/null":
            masked = True
            fragment = str(Path(d) / name)
            break
        if p.is_file():
            fragment = str(Path(d) / name)
            break
    by_base: dict[str, str] = {}
    for d in UNIT_DIRS:
        dd = unit_dir(d) / (name + ".d")
        if not dd.is_dir():
            continue
        for f in dd.iterdir():
            if f.name.endswith(".conf") and f.name not in by_base:
                by_base[f.name] = str(Path(d) / (name + ".d") / f.name)
    dropins = [by_base[k] for k in sorted(by_base)]
    return fragment, dropins, masked


def load_unit(name: str) -> UnitDef:
    fragment, dropins, masked = find_files(name)
    u = UnitDef(name, fragment, dropins if fragment else [], masked)
    if masked or not fragment:
        return u
    for path in [fragment, *dropins]:
        try:
            text = unit_dir(path).read_text() if _is_unit_path(path) else Path(path).read_text()
        except OSError as e:
            log("%s: cannot read %s: %s" % (name, path, e))
            continue
        for section, k, v in parse_unit_text(text):
            sec = u.settings.setdefault(section, {})
            if section == "Service" and k in LIST_KEYS:
                cur = sec.setdefault(k, [])
                if v == "":
                    cur.clear()  # an empty assignment resets the list, as in systemd
                else:
                    cur.append(v)
            elif section == "Install" and k in ("WantedBy", "RequiredBy", "Alias", "Also"):
                cur = sec.setdefault(k, [])
                if v == "":
                    cur.clear()
                else:
                    cur.extend(v.split())
            else:
                sec[k] = v
    stype = str(u.get("Service", "Type", "simple"))
    execs = u.lst("ExecStart")
    if name.endswith(".service"):
        if not execs:
            u.bad_setting = "Service has no ExecStart=, ExecStop=, or SuccessAction=. Refusing."
        elif len(execs) > 1 and stype != "oneshot":
            u.bad_setting = ("Service has more than one ExecStart= setting, which is only allowed for "
                             "Type=oneshot services. Refusing.")
    return u


def _is_unit_path(path: str) -> bool:
    return any(path.startswith(d + "/") for d in UNIT_DIRS)


def fingerprint(name: str) -> list:
    fragment, dropins, masked = find_files(name)
    fp: list = [masked]
    for p in [fragment, *dropins]:
        if not p:
            fp.append(None)
            continue
        try:
            st = unit_dir(p).lstat()
            fp.append([p, st.st_mtime_ns, st.st_size])
        except OSError:
            fp.append([p, None])
    return fp


def all_unit_names() -> list[str]:
    names: set[str] = set()
    for d in UNIT_DIRS:
        dd = unit_dir(d)
        if dd.is_dir():
            for f in dd.iterdir():
                if f.name.endswith((".service", ".socket", ".target", ".timer")) and not f.is_dir():
                    names.add(f.name)
    sd = rooted(STATE_DIR)
    if sd.is_dir():
        names.update(f.name for f in sd.iterdir() if f.is_dir())
    return sorted(names)


# --------------------------------------------------------------------------------------------
# runtime state


def state_dir(name: str) -> Path:
    d = rooted(STATE_DIR) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


_HELD: dict[str, int] = {}


@contextlib.contextmanager
def locked(name: str):
    """Per-unit exclusive lock (flock); re-entrant within one process."""
    if _HELD.get(name):
        _HELD[name] += 1
        try:
            yield
        finally:
            _HELD[name] -= 1
        return
    with open(state_dir(name) / "lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        _HELD[name] = 1
        try:
            yield
        finally:
            _HELD[name] = 0
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp%d" % os.getpid())
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def read_state(name: str) -> dict:
    p = rooted(STATE_DIR) / name / "state.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {"ActiveState": "inactive", "SubState": "dead", "Result": "success", "MainPID": 0}


def write_state(name: str, st: dict) -> None:
    st["StateChangeTimestamp"] = time.time()
    _write_json(state_dir(name) / "state.json", st)


def update_state(name: str, **kv: object) -> dict:
    with locked(name):
        st = read_state(name)
        st.update(kv)
        write_state(name, st)
        return st


def pid_alive(pid: int) -> bool:
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive (its parent has not reaped it yet).
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def current_state(name: str) -> dict:
    """The state, corrected when the supervisor disappeared without recording an exit."""
    st = read_state(name)
    if st.get("ActiveState") in ("active", "activating", "deactivating", "reloading"):
        sup = int(st.get("SupervisorPID") or 0)
        if not pid_alive(sup):
            main = int(st.get("MainPID") or 0)
            if pid_alive(main):
                return st  # supervisor gone but the service still runs
            with locked(name):
                st = read_state(name)
                if st.get("ActiveState") in ("active", "activating", "deactivating", "reloading") and not pid_alive(
                    int(st.get("SupervisorPID") or 0)
                ):
                    st.update(ActiveState="failed", SubState="failed", Result="signal", MainPID=0)
                    write_state(name, st)
    return st


# --------------------------------------------------------------------------------------------
# loaded definitions (daemon-reload semantics)


def snapshot_path(name: str) -> Path:
    return rooted(STATE_DIR) / name / "loaded.json"


def do_reload_unit(name: str) -> None:
    u = load_unit(name)
    _write_json(state_dir(name) / "loaded.json", {"fingerprint": fingerprint(name), "unit": u.to_json()})


def loaded_unit(name: str) -> tuple[UnitDef, bool]:
    """The loaded definition and whether the files changed since (NeedDaemonReload).

    A unit that systemd has never loaded is loaded from disk on first reference (as at boot)."""
    p = snapshot_path(name)
    try:
        snap = json.loads(p.read_text())
    except (OSError, ValueError):
        snap = None
    if snap is None:
        u = load_unit(name)
        if u.load_state != "not-found":
            _write_json(state_dir(name) / "loaded.json", {"fingerprint": fingerprint(name), "unit": u.to_json()})
        return u, False
    u = UnitDef.from_json(snap["unit"])
    if u.load_state == "not-found":
        # systemd retries loading a not-found unit on each reference
        fresh = load_unit(name)
        if fresh.load_state != "not-found":
            do_reload_unit(name)
            return fresh, False
    return u, json.loads(json.dumps(fingerprint(name))) != snap["fingerprint"]


# --------------------------------------------------------------------------------------------
# environment and command lines


def _unquote_assignments(value: str) -> list[str]:
    try:
        return shlex.split(value, posix=True)
    except ValueError:
        return value.split()


def parse_env_file(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    joined: list[str] = []
    buf = ""
    for line in text.splitlines():
        if buf:
            line = buf + line
            buf = ""
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf = line[:-1]
            continue
        joined.append(line)
    if buf:
        joined.append(buf)
    for line in joined:
        s = line.strip()
        if not s or s.startswith(("#", ";")):
            continue
        if s.startswith("export "):
            s = s[7:].lstrip()
        if "=" not in s:
            continue
        k, v = s.split("=", 1)
        k = k.strip()
        v = v.strip()
        if v[:1] in ("'", '"'):
            try:
                parts = shlex.split(v, posix=True)
                v = parts[0] if parts else ""
            except ValueError:
                v = v.strip("'\"")
        env[k] = v
    return env


def manager_environment() -> dict[str, str]:
    """DefaultEnvironment= from /etc/systemd/system.conf (+ system.conf.d), as the manager's base env."""
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
    files = [rooted("/etc/systemd/system.conf")]
    dd = rooted("/etc/systemd/system.conf.d")
    if dd.is_dir():
        files += sorted(f for f in dd.iterdir() if f.name.endswith(".conf"))
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        for section, k, v in parse_unit_text(text):
            if section == "Manager" and k == "DefaultEnvironment":
                for a in _unquote_assignments(v):
                    if "=" in a:
                        ek, ev = a.split("=", 1)
                        env[ek] = ev
    if standin_root() != "/":
        env[ROOT_ENV] = standin_root()
    return env


def unit_environment(u: UnitDef) -> tuple[dict[str, str], list[str]]:
    env = manager_environment()
    problems: list[str] = []
    for v in u.lst("Environment"):
        for a in _unquote_assignments(v):
            if "=" in a:
                ek, ev = a.split("=", 1)
                env[ek] = ev
    for v in u.lst("EnvironmentFile"):
        for item in v.split():
            optional = item.startswith("-")
            path = item.lstrip("-")
            try:
                env.update(parse_env_file(rooted(path).read_text()))
            except OSError as e:
                if not optional:
                    problems.append("Failed to load environment files: %s: %s" % (path, e.strerror))
    return env, problems


def _var_name_ok(s: str) -> bool:
    return bool(s) and (s[0].isalpha() or s[0] == "_") and all(c.isalnum() or c == "_" for c in s)


def expand_braced(word: str, env: dict[str, str]) -> str:
    out = []
    i = 0
    while i < len(word):
        if word.startswith("${", i):
            j = word.find("}", i + 2)
            if j > 0 and _var_name_ok(word[i + 2 : j]):
                out.append(env.get(word[i + 2 : j], ""))
                i = j + 1
                continue
        if word.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        out.append(word[i])
        i += 1
    return "".join(out)


def parse_exec(line: str, env: dict[str, str]) -> tuple[list[str], bool]:
    """Split an Exec*= line as systemd does; returns (argv, ignore_failure).

    ``$VAR`` as a whole word is split at whitespace into zero or more words; ``${VAR}`` anywhere
    is replaced by the value as part of one word."""
    ignore = False
    no_expand = False
    argv0_sep = False
    while line and line[0] in "-@+!:":
        c = line[0]
        line = line[1:]
        if c == "-":
            ignore = True
        elif c == ":":
            no_expand = True
        elif c == "@":
            argv0_sep = True
    words = shlex.split(line, posix=True)
    if no_expand:
        argv = words
    else:
        argv = []
        for w in words:
            if w.startswith("$") and not w.startswith("${") and _var_name_ok(w[1:]):
                argv.extend(env.get(w[1:], "").split())
            else:
                argv.append(expand_braced(w, env))
    if argv0_sep and len(argv) >= 2:
        argv = [argv[0], *argv[2:]]  # the stand-in cannot set argv[0] separately
    return argv, ignore


# --------------------------------------------------------------------------------------------
# supervisor (runs detached, one per started unit)


def log_path(name: str) -> Path:
    return rooted("/var/log/%s.log" % name.rsplit(".", 1)[0])


def supervise(name: str) -> int:
    sd = state_dir(name)
    inv = json.loads((sd / "invocation.json").read_text())
    env = inv["env"]
    out = open(log_path(name), "ab", buffering=0)  # noqa: SIM115 - kept for the supervisor's lifetime

    def note(msg: str) -> None:
        out.write(("%s gpuharden-systemctl: %s: %s\n" % (time.strftime("%b %d %H:%M:%S"), name, msg)).encode())

    stop_flag = {"stop": False}

    def on_term(_sig, _frm):
        stop_flag["stop"] = True

    signal.signal(signal.SIGTERM, on_term)

    for argv, ignore in inv["pre"]:
        note("ExecStartPre: %s" % shlex.join(argv))
        try:
            p = subprocess.Popen([rooted_exe(argv[0]), *argv[1:]], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=out, cwd="/", process_group=0)
        except OSError as e:
            note("Failed to execute %s: %s" % (argv[0], e.strerror))
            rc = 203
        else:
            update_state(name, ControlPID=p.pid)
            rc = p.wait()
        if rc != 0 and not ignore:
            note("Control process exited, code=exited, status=%d/FAILURE" % rc)
            update_state(name, ActiveState="failed", SubState="failed", Result="exit-code", ControlPID=0,
                         MainPID=0, ExecMainStatus=rc if rc > 0 else -rc, ExecMainCode=1)
            note("Failed with result 'exit-code'.")
            return 1
    update_state(name, ControlPID=0)

    argv = inv["argv"]
    note("Starting: %s" % shlex.join(argv))
    try:
        p = subprocess.Popen([rooted_exe(argv[0]), *argv[1:]], env=env, stdin=subprocess.DEVNULL, stdout=out,
                             stderr=out, cwd="/", process_group=0)
    except OSError as e:
        note("Failed to execute %s: %s" % (argv[0], e.strerror))
        update_state(name, ActiveState="failed", SubState="failed", Result="exit-code", MainPID=0, ExecMainPID=0,
                     ExecMainStatus=203, ExecMainCode=1, ExecMainExitTimestamp=time.time())
        note("Main process exited, code=exited, status=203/EXEC")
        return 1
    update_state(name, ActiveState="active", SubState="running", MainPID=p.pid, ExecMainPID=p.pid,
                 ExecMainStartTimestamp=time.time(), ActiveEnterTimestamp=time.time(), ExecMainStatus=0,
                 ExecMainCode=0, Result="success")
    note("Started, main PID %d" % p.pid)
    while True:
        try:
            rc = p.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries wait() itself
            continue
    with locked(name):
        st = read_state(name)
        stopping = bool(st.get("StopRequested")) or stop_flag["stop"]
        if rc >= 0:
            code, status, desc = 1, rc, "code=exited, status=%d/%s" % (rc, "SUCCESS" if rc == 0 else "FAILURE")
        else:
            code, status = 2, -rc
            desc = "code=killed, status=%d/%s" % (-rc, signal.Signals(-rc).name[3:])
        clean = rc == 0 or (rc < 0 and -rc in CLEAN_SIGNALS)
        if st.get("StopTimedOut"):
            result = "timeout"
        elif clean or (stopping and rc < 0 and -rc == signal.SIGKILL):
            result = "success"
        else:
            result = "exit-code" if rc > 0 else "signal"
        failed = result != "success"
        st.update(ActiveState="failed" if failed else "inactive", SubState="failed" if failed else "dead",
                  Result=result, MainPID=0, ExecMainStatus=status, ExecMainCode=code,
                  ExecMainExitTimestamp=time.time(), StopRequested=False, StopTimedOut=False)
        write_state(name, st)
    note("Main process exited, %s" % desc)
    if failed:
        note("Failed with result '%s'." % result)
    else:
        note("Deactivated successfully.")
    return 0


# --------------------------------------------------------------------------------------------
# commands


class Ctl:
    def __init__(self, no_block: bool, quiet: bool) -> None:
        self.no_block = no_block
        self.quiet = quiet

    def err(self, msg: str) -> None:
        sys.stderr.write(msg + "\n")

    def warn_reload(self, name: str, need: bool) -> None:
        if need and not self.quiet:
            self.err("Warning: The unit file, source configuration file or drop-ins of %s changed on disk. "
                     "Run 'systemctl daemon-reload' to reload units." % name)

    # -- start/stop ---------------------------------------------------------------------------
    def start(self, name: str, verb: str = "start") -> int:
        u, need = loaded_unit(name)
        if u.load_state == "not-found":
            self.err("Failed to %s %s: Unit %s not found." % (verb, name, name))
            return 5
        if u.load_state == "masked":
            self.err("Failed to %s %s: Unit %s is masked." % (verb, name, name))
            return 1
        if u.load_state == "bad-setting":
            self.err("Failed to %s %s: Unit %s has a bad unit file setting.\n"
                     "See system logs and 'systemctl status %s' for details." % (verb, name, name, name))
            return 1
        self.warn_reload(name, need)
        with locked(name):
            st = current_state(name)
            if st.get("ActiveState") in ("active", "activating", "reloading"):
                return 0
            env, problems = unit_environment(u)
            if problems:
                for pr in problems:
                    log("%s: %s" % (name, pr))
                st.update(ActiveState="failed", SubState="failed", Result="resources", MainPID=0)
                write_state(name, st)
                self.err("Job for %s failed because of unavailable resources or another system error.\n"
                         "See \"systemctl status %s\" and \"journalctl -xeu %s\" for details." % (name, name, name))
                return 1
            env["INVOCATION_ID"] = uuid.uuid4().hex
            main, _ign = parse_exec(u.lst("ExecStart")[0], env)
            pre = [parse_exec(x, env) for x in u.lst("ExecStartPre")]
            if not main:
                self.err("Failed to %s %s: Unit %s has a bad unit file setting." % (verb, name, name))
                return 1
            _write_json(state_dir(name) / "invocation.json", {"argv": main, "pre": pre, "env": env})
            log_path(name).parent.mkdir(parents=True, exist_ok=True)
            logf = open(log_path(name), "ab")  # noqa: SIM115
            sup = subprocess.Popen(
                [sys.executable, "-m", "gpuharden_lab.standins.systemctl", "__supervise", name],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, cwd="/", start_new_session=True,
                env={**os.environ, **({ROOT_ENV: standin_root()} if standin_root() != "/" else {})},
            )
            logf.close()
            # systemd resets the main process's exec status when a start begins: a start whose ExecStartPre= fails
            # has no main PID, and its job fails (rc 1) even where an earlier run had one
            st.update(ActiveState="activating", SubState="start-pre" if pre else "start", MainPID=0, ExecMainPID=0,
                      SupervisorPID=sup.pid, StopRequested=False, StopTimedOut=False, Result="success",
                      InvocationID=env["INVOCATION_ID"], ExecMainStatus=0, ExecMainCode=0,
                      NRestarts=int(st.get("NRestarts", 0)))
            write_state(name, st)
        log("%s: started supervisor %d for %s" % (name, sup.pid, shlex.join(main)))
        if self.no_block:
            return 0
        deadline = time.monotonic() + float(os.environ.get("GPUHARDEN_SYSTEMCTL_START_TIMEOUT", "90"))
        while time.monotonic() < deadline:
            st = read_state(name)
            if st.get("ActiveState") != "activating":
                break
            if sup.poll() is not None and read_state(name).get("ActiveState") == "activating":
                update_state(name, ActiveState="failed", SubState="failed", Result="resources")
                break
            time.sleep(0.02)
        st = read_state(name)
        if st.get("ActiveState") == "failed" and int(st.get("ExecMainPID") or 0) == 0 and pre:
            self.err("Job for %s failed because the control process exited with error code.\n"
                     "See \"systemctl status %s\" and \"journalctl -xeu %s\" for details." % (name, name, name))
            return 1
        if st.get("ActiveState") == "failed" and st.get("Result") == "resources":
            self.err("Job for %s failed because of unavailable resources or another system error." % name)
            return 1
        return 0

    def stop(self, name: str, verb: str = "stop") -> int:
        u, need = loaded_unit(name)
        st = current_state(name)
        if u.load_state == "not-found" and st.get("ActiveState") not in ("active", "activating"):
            self.err("Failed to %s %s: Unit %s not loaded." % (verb, name, name))
            return 5
        self.warn_reload(name, need)
        if st.get("ActiveState") not in ("active", "activating", "deactivating", "reloading"):
            return 0
        timeout = _parse_seconds(str(u.get("Service", "TimeoutStopSec", "") or ""),
                                 float(os.environ.get("GPUHARDEN_SYSTEMCTL_STOP_TIMEOUT", "90")))
        st = update_state(name, StopRequested=True, ActiveState="deactivating", SubState="stop-sigterm")
        targets = [int(st.get("MainPID") or 0), int(st.get("ControlPID") or 0)]
        log("%s: stopping (SIGTERM to %s)" % (name, [p for p in targets if p]))
        for pid in targets:
            _kill_group(pid, signal.SIGTERM)
        sup = int(st.get("SupervisorPID") or 0)
        if not targets[0] and pid_alive(sup):
            os.kill(sup, signal.SIGTERM)
        if self.no_block:
            return 0
        deadline = time.monotonic() + timeout
        killed = False
        while True:
            st = read_state(name)
            main = int(st.get("MainPID") or 0)
            if st.get("ActiveState") in ("inactive", "failed") and not pid_alive(main):
                break
            if not pid_alive(sup) and not pid_alive(main):
                update_state(name, ActiveState="inactive", SubState="dead", MainPID=0, StopRequested=False)
                break
            if not killed and time.monotonic() > deadline:
                log("%s: stop timed out after %.0fs, sending SIGKILL" % (name, timeout))
                update_state(name, StopTimedOut=True, SubState="stop-sigkill")
                for pid in (main, int(st.get("ControlPID") or 0)):
                    _kill_group(pid, signal.SIGKILL)
                killed = True
            time.sleep(0.02)
        return 0

    def restart(self, name: str, verb: str = "restart") -> int:
        u, _need = loaded_unit(name)
        if u.load_state == "not-found":
            self.err("Failed to %s %s: Unit %s not found." % (verb, name, name))
            return 5
        nb, self.no_block = self.no_block, False
        rc = self.stop(name, verb)
        self.no_block = nb
        if rc not in (0,):
            return rc
        with contextlib.suppress(Exception):
            st = read_state(name)
            update_state(name, NRestarts=int(st.get("NRestarts", 0)))
        return self.start(name, verb)

    def reload(self, name: str) -> int:
        u, _need = loaded_unit(name)
        if u.load_state == "not-found":
            self.err("Failed to reload %s: Unit %s not found." % (name, name))
            return 5
        st = current_state(name)
        if not u.lst("ExecReload"):
            self.err("Failed to reload %s: Job type reload is not applicable for unit %s." % (name, name))
            return 1
        if st.get("ActiveState") != "active":
            self.err("%s is not active, cannot reload." % name)
            return 1
        env, _p = unit_environment(u)
        env["MAINPID"] = str(st.get("MainPID") or "")
        for line in u.lst("ExecReload"):
            argv, ignore = parse_exec(line, env)
            rc = subprocess.call([rooted_exe(argv[0]), *argv[1:]], env=env)
            if rc and not ignore:
                self.err("Job for %s failed because the control process exited with error code." % name)
                return 1
        return 0

    # -- queries ------------------------------------------------------------------------------
    def unit_file_state(self, u: UnitDef) -> str:
        if u.masked:
            return "masked"
        if not u.fragment:
            return ""
        install = u.settings.get("Install", {})
        wanted = list(install.get("WantedBy", [])) + list(install.get("RequiredBy", []))  # type: ignore[arg-type]
        if not wanted:
            return "static"
        for t in wanted:
            for suffix in (".wants", ".requires"):
                for d in ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system"):
                    if (unit_dir(d) / (t + suffix) / u.name).is_symlink() or (unit_dir(d) / (t + suffix) / u.name).exists():
                        return "enabled"
        return "disabled"

    def show_props(self, name: str) -> dict[str, str]:
        u, need = loaded_unit(name)
        disk = load_unit(name)  # UnitFileState reflects the files, not the loaded definition
        st = current_state(name) if u.load_state != "not-found" else read_state(name)
        if u.load_state == "not-found" and not (rooted(STATE_DIR) / name / "state.json").exists():
            st = {"ActiveState": "inactive", "SubState": "dead", "Result": "success", "MainPID": 0}
        env, _p = unit_environment(u) if u.fragment else ({}, [])
        exec_start = ""
        if u.lst("ExecStart"):
            raw = u.lst("ExecStart")[0]
            argv, ign = parse_exec(raw, env) if not u.bad_setting else ([], False)
            if argv:  # systemd shows the unexpanded words
                argv = [argv[0], *shlex.split(raw.lstrip("-@+!:"), posix=True)[1:]]
            if argv:
                exec_start = "{ path=%s ; argv[]=%s ; ignore_errors=%s ; start_time=[n/a] ; stop_time=[n/a] ; " \
                             "pid=%s ; code=(null) ; status=0/0 }" % (argv[0], " ".join(argv), "yes" if ign else "no",
                                                                       st.get("ExecMainPID") or 0)
        envfiles = []
        for v in u.lst("EnvironmentFile"):
            for item in v.split():
                envfiles.append("%s (ignore_errors=%s)" % (item.lstrip("-"), "yes" if item.startswith("-") else "no"))
        unit_env = []
        for v in u.lst("Environment"):
            unit_env.extend(_unquote_assignments(v))

        def ts(key: str) -> str:
            t = st.get(key)
            return time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(float(t))) if t else ""

        props = {
            "Type": str(u.get("Service", "Type", "simple")),
            "Restart": str(u.get("Service", "Restart", "no")),
            "NotifyAccess": "none",
            "MainPID": str(st.get("MainPID") or 0),
            "ControlPID": str(st.get("ControlPID") or 0),
            "ExecMainStartTimestamp": ts("ExecMainStartTimestamp"),
            "ExecMainExitTimestamp": ts("ExecMainExitTimestamp"),
            "ExecMainPID": str(st.get("ExecMainPID") or 0),
            "ExecMainCode": str(st.get("ExecMainCode") or 0),
            "ExecMainStatus": str(st.get("ExecMainStatus") or 0),
            "ExecStart": exec_start,
            "Result": str(st.get("Result", "success")),
            "NRestarts": str(st.get("NRestarts", 0)),
            "Environment": " ".join(unit_env),
            "EnvironmentFiles": " ".join(envfiles),
            "Id": name,
            "Names": name,
            "Description": str(u.get("Unit", "Description", name)),
            "LoadState": u.load_state,
            "ActiveState": str(st.get("ActiveState", "inactive")),
            "FreezerState": "running",
            "SubState": str(st.get("SubState", "dead")),
            "FragmentPath": u.fragment if not u.masked else "",
            "DropInPaths": " ".join(u.dropins),
            "UnitFileState": self.unit_file_state(disk),
            "UnitFilePreset": "enabled" if u.fragment else "",
            "StateChangeTimestamp": ts("StateChangeTimestamp"),
            "ActiveEnterTimestamp": ts("ActiveEnterTimestamp"),
            "InvocationID": str(st.get("InvocationID", "")),
            "CanStart": "yes" if u.load_state == "loaded" else "no",
            "CanStop": "yes" if u.load_state == "loaded" else "no",
            "CanReload": "yes" if u.lst("ExecReload") else "no",
            "NeedDaemonReload": "yes" if need else "no",
            "ControlGroup": "/system.slice/%s" % name if st.get("ActiveState") == "active" else "",
            "TimeoutStopUSec": "1min 30s",
        }
        if u.load_state == "not-found":
            props["LoadError"] = 'org.freedesktop.systemd1.NoSuchUnit "Unit %s not found."' % name
        elif u.load_state == "bad-setting":
            props["LoadError"] = 'org.freedesktop.systemd1.BadUnitSetting "Unit %s has a bad unit file setting."' % name
        return props

    def show(self, names: list[str], props: list[str], value_only: bool) -> int:
        first = True
        for name in names:
            p = self.show_props(name)
            if not first:
                print()
            first = False
            for k, v in p.items():
                if props and k not in props:
                    continue
                print(v if value_only else "%s=%s" % (k, v))
        return 0

    def is_active(self, names: list[str], want: tuple[str, ...] = ("active", "reloading")) -> int:
        ok = False
        not_found = False
        for name in names:
            u, _n = loaded_unit(name)
            st = current_state(name) if u.load_state != "not-found" else {"ActiveState": "inactive"}
            if u.load_state == "not-found" and st.get("ActiveState") == "inactive":
                not_found = True
            state = str(st.get("ActiveState", "inactive"))
            if not self.quiet:
                print(state)
            if state in want:
                ok = True
        if ok:
            return 0
        if want == ("failed",):
            return 1
        return 4 if not_found else 3

    def is_enabled(self, names: list[str]) -> int:
        rc = 1
        for name in names:
            u = load_unit(name)
            s = self.unit_file_state(u)
            if not s:
                self.err("Failed to get unit file state for %s: No such file or directory" % name)
                return 1
            if not self.quiet:
                print(s)
            if s in ("enabled", "static", "enabled-runtime", "alias", "indirect", "generated"):
                rc = 0
        return rc

    def enable(self, names: list[str], on: bool) -> int:
        for name in names:
            u = load_unit(name)
            if not u.fragment:
                self.err("Failed to %s unit: Unit file %s does not exist." % ("enable" if on else "disable", name))
                return 1
            if u.masked:
                self.err("Failed to %s unit: Unit file %s is masked." % ("enable" if on else "disable", name))
                return 1
            install = u.settings.get("Install", {})
            wanted = list(install.get("WantedBy", [])) + list(install.get("RequiredBy", []))  # type: ignore[arg-type]
            if not wanted:
                if on:
                    self.err("The unit files have no installation config (WantedBy=, RequiredBy=, Also=,\n"
                             "Alias= settings in the [Install] section, and DefaultInstance= for template\n"
                             "units). This means they are not meant to be enabled or disabled using systemctl.")
                continue
            for t in wanted:
                suffix = ".requires" if t in install.get("RequiredBy", []) else ".wants"  # type: ignore[operator]
                link_dir = unit_dir("/etc/systemd/system") / (t + suffix)
                link = link_dir / name
                node_link = "/etc/systemd/system/%s%s/%s" % (t, suffix, name)
                if on and not link.is_symlink():
                    link_dir.mkdir(parents=True, exist_ok=True)
                    os.symlink(u.fragment, link)
                    self.err("Created symlink %s → %s." % (node_link, u.fragment))
                elif not on and link.is_symlink():
                    link.unlink()
                    self.err("Removed \"%s\"." % node_link)
        return 0

    def mask(self, names: list[str], on: bool) -> int:
        for name in names:
            link = unit_dir("/etc/systemd/system") / name
            if on:
                if link.exists() and not link.is_symlink():
                    self.err("Failed to mask unit: File /etc/systemd/system/%s already exists." % name)
                    return 1
                link.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    link.unlink()
                os.symlink("/dev/null", link)
                self.err("Created symlink /etc/systemd/system/%s → /dev/null." % name)
            elif link.is_symlink() and os.readlink(link) == "/dev/null":
                link.unlink()
                self.err("Removed \"/etc/systemd/system/%s\"." % name)
        return 0

    def list_unit_files(self, patterns: list[str]) -> int:
        rows = []
        for name in all_unit_names():
            if patterns and not any(fnmatch.fnmatch(name, normalize_pattern(p)) for p in patterns):
                continue
            u = load_unit(name)
            s = self.unit_file_state(u)
            if s:
                rows.append((name, s, "enabled"))
        w = max([len("UNIT FILE")] + [len(r[0]) for r in rows])
        w2 = max([len("STATE")] + [len(r[1]) for r in rows])
        print("%-*s %-*s PRESET" % (w, "UNIT FILE", w2, "STATE"))
        for r in rows:
            print("%-*s %-*s %s" % (w, r[0], w2, r[1], r[2]))
        print()
        print("%d unit files listed." % len(rows))
        return 0 if rows else 1

    def list_units(self, patterns: list[str], show_all: bool) -> int:
        rows = []
        for name in all_unit_names():
            if patterns and not any(fnmatch.fnmatch(name, normalize_pattern(p)) for p in patterns):
                continue
            u, _n = loaded_unit(name)
            st = current_state(name)
            if not show_all and st.get("ActiveState") == "inactive":
                continue
            rows.append((name, u.load_state, st.get("ActiveState", "inactive"), st.get("SubState", "dead"),
                         str(u.get("Unit", "Description", name))))
        print("  UNIT LOAD ACTIVE SUB DESCRIPTION")
        for r in rows:
            print("  %s %s %s %s %s" % r)
        print()
        print("%d loaded units listed." % len(rows))
        return 0

    def status(self, names: list[str]) -> int:
        rc = 0
        for name in names:
            u, _need = loaded_unit(name)
            if u.load_state == "not-found":
                self.err("Unit %s could not be found." % name)
                rc = max(rc, 4)
                continue
            p = self.show_props(name)
            print("● %s - %s" % (name, p["Description"]))
            print("     Loaded: %s (%s; %s)" % (u.load_state, u.fragment, p["UnitFileState"]))
            if u.dropins:
                print("    Drop-In: %s" % "\n             ".join(u.dropins))
            print("     Active: %s (%s)" % (p["ActiveState"], p["SubState"]))
            if p["MainPID"] != "0":
                print("   Main PID: %s" % p["MainPID"])
            try:
                tail = log_path(name).read_text(errors="replace").splitlines()[-10:]
            except OSError:
                tail = []
            if tail:
                print()
                print("\n".join(tail))
            if p["ActiveState"] != "active":
                rc = max(rc, 3)
        return rc

    def daemon_reload(self) -> int:
        for name in all_unit_names():
            do_reload_unit(name)
        return 0

    def reset_failed(self, names: list[str]) -> int:
        for name in names or all_unit_names():
            with locked(name):
                st = read_state(name)
                if st.get("ActiveState") == "failed":
                    st.update(ActiveState="inactive", SubState="dead", Result="success")
                    write_state(name, st)
        return 0

    def kill(self, names: list[str], sig: int) -> int:
        for name in names:
            st = current_state(name)
            main = int(st.get("MainPID") or 0)
            if not main:
                self.err("Failed to kill unit %s: No main process to kill" % name)
                return 1
            _kill_group(main, sig)
        return 0

    def cat(self, names: list[str]) -> int:
        for name in names:
            fragment, dropins, _m = find_files(name)
            if not fragment:
                self.err("No files found for %s." % name)
                return 1
            for p in [fragment, *dropins]:
                print("# %s" % p)
                print(unit_dir(p).read_text())
        return 0


def normalize_pattern(p: str) -> str:
    return p if any(c in p for c in "*?[") or "." in p else p + ".service"


def _parse_seconds(v: str, default: float) -> float:
    v = v.strip()
    if not v:
        return default
    if v == "infinity":
        return 10**9
    total = 0.0
    for part in v.split():
        num = "".join(c for c in part if c.isdigit() or c == ".")
        unit = part[len(num):] or "s"
        mult = {"s": 1, "sec": 1, "m": 60, "min": 60, "ms": 0.001, "h": 3600}.get(unit, 1)
        total += float(num or 0) * mult
    return total


def _kill_group(pid: int, sig: int) -> None:
    if not pid:
        return
    try:
        os.killpg(pid, sig)  # processes are started as their own process group (KillMode=control-group)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["__supervise"]:
        return supervise(args[1])
    no_block = quiet = value_only = show_all = now = False
    props: list[str] = []
    sig = signal.SIGTERM
    rest: list[str] = []
    it = iter(args)
    for a in it:
        if a in ("--no-block",):
            no_block = True
        elif a in ("-q", "--quiet"):
            quiet = True
        elif a in ("--system", "--force", "-f", "--no-pager", "--no-legend", "--no-ask-password", "--full", "-l",
                   "--plain", "--runtime"):
            continue
        elif a in ("--all", "-a"):
            show_all = True
        elif a == "--value":
            value_only = True
        elif a == "--now":
            now = True
        elif a in ("-p", "--property"):
            props.extend(next(it, "").split(","))
        elif a.startswith("--property="):
            props.extend(a.split("=", 1)[1].split(","))
        elif a in ("-t", "--type"):
            next(it, None)
        elif a.startswith("--type="):
            continue
        elif a.startswith(("--signal=", "-s")) and a not in ("-s",):
            v = a.split("=", 1)[1] if "=" in a else a[2:]
            sig = int(v) if v.isdigit() else signal.Signals(v if v.startswith("SIG") else "SIG" + v)
        elif a == "-s":
            v = next(it, "TERM")
            sig = int(v) if v.isdigit() else signal.Signals(v if v.startswith("SIG") else "SIG" + v)
        elif a in ("--user", "--global"):
            sys.stderr.write("Failed to connect to bus: No medium found\n")
            return 1
        elif a.startswith("-") and a != "-":
            continue  # other options: accepted and ignored
        else:
            rest.append(a)
    cmd = rest[0] if rest else "list-units"
    units = [normalize(u) for u in rest[1:]]
    ctl = Ctl(no_block, quiet)
    log("systemctl %s" % shlex.join(args))

    def each(fn) -> int:
        if not units:
            sys.stderr.write("Too few arguments.\n")
            return 1
        rc = 0
        for u in units:
            rc = fn(u) or rc
        return rc

    if cmd in ("daemon-reload", "daemon-reexec"):
        return ctl.daemon_reload()
    if cmd == "start":
        return each(ctl.start)
    if cmd == "stop":
        return each(ctl.stop)
    if cmd == "restart":
        return each(ctl.restart)
    if cmd == "try-restart":
        return each(lambda u: ctl.restart(u, "try-restart") if current_state(u).get("ActiveState") == "active" else 0)
    if cmd in ("reload-or-restart", "try-reload-or-restart"):
        return each(lambda u: ctl.reload(u) if loaded_unit(u)[0].lst("ExecReload") else ctl.restart(u))
    if cmd == "reload":
        return each(ctl.reload)
    if cmd == "show":
        return ctl.show(units, props, value_only)
    if cmd == "is-active":
        return ctl.is_active(units)
    if cmd == "is-failed":
        return ctl.is_active(units, ("failed",))
    if cmd == "is-enabled":
        return ctl.is_enabled(units)
    if cmd in ("enable", "disable"):
        rc = ctl.enable(units, cmd == "enable")
        if rc == 0 and now:
            rc = each(ctl.start if cmd == "enable" else ctl.stop)
        return rc
    if cmd in ("mask", "unmask"):
        return ctl.mask(units, cmd == "mask")
    if cmd == "list-unit-files":
        return ctl.list_unit_files(rest[1:])
    if cmd == "list-units":
        return ctl.list_units(rest[1:], show_all)
    if cmd == "status":
        return ctl.status(units)
    if cmd == "reset-failed":
        return ctl.reset_failed(units)
    if cmd == "kill":
        return ctl.kill(units, sig)
    if cmd == "cat":
        return ctl.cat(units)
    if cmd == "is-system-running":
        print("running")
        return 0
    sys.stderr.write("Unknown command verb '%s'.\n" % cmd)
    return 1


if __name__ == "__main__":
    sys.exit(main())
