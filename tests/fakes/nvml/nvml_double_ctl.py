#!/usr/bin/env python3
"""Control the NVML test double's mutable state (stdlib only).

The C library (libnvidia-ml.so.1 built from nvml_double.c) keeps MIG mode,
GPU/compute instances and running processes in a JSON state file. This tool
edits that file under the same lock the library takes: flock(LOCK_EX) on
``<state>.lock``; writes are atomic (temp file + rename in the same dir).

    nvml_double_ctl.py show [STATE]
    nvml_double_ctl.py reset [STATE] [--gpu N ...] [--force]
    nvml_double_ctl.py set-processes [STATE] --gpu N (--json LIST | --clear)
    nvml_double_ctl.py inject-xid [STATE] --gpu N --xid 79 [--gi G --ci C]

STATE defaults to $NVML_DOUBLE_STATE or /var/lib/nvml-double/state.json, the
fixture to $NVML_DOUBLE_FIXTURE or /etc/nvml-double/fixture.json (--state and
--fixture override). A missing state file is created from the fixture.

Exit codes: 0 ok, 2 usage/fixture error, 3 GPU in use (reset refused).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import sys
import tempfile

DEFAULT_FIXTURE = "/etc/nvml-double/fixture.json"
DEFAULT_STATE = "/var/lib/nvml-double/state.json"

# profile id -> (name, memory slices, compute slices); same for both tables.
GI_PROFILES = {
    19: ("1g.10gb", 1, 1),
    20: ("1g.10gb+me", 1, 1),
    15: ("1g.20gb", 2, 1),
    14: ("2g.20gb", 2, 2),
    9: ("3g.40gb", 4, 3),
    5: ("4g.40gb", 4, 4),
    0: ("7g.80gb", 8, 7),
}
CI_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7}
KNOWN_TABLES = {"A100-80GB", "H100-80GB"}


class CtlError(Exception):
    def __init__(self, msg: str, code: int = 2):
        super().__init__(msg)
        self.code = code


def buddy_id(start: int, size: int) -> int:
    """GPU-instance id for a memory-slice placement (same rule as the C side)."""
    if size == 8:
        return 0
    if size == 4:
        return 2 if start == 0 else 1
    if size == 2:
        return 3 + start // 2
    return 7 + start


def _gi_from_fixture(entry: dict) -> dict:
    pid = entry.get("profile_id")
    if "profile" in entry:
        pid = next((k for k, v in GI_PROFILES.items() if v[0] == entry["profile"]), None)
    if pid not in GI_PROFILES:
        raise CtlError(f"unknown GPU instance profile in {entry!r}")
    _name, msize, cslices = GI_PROFILES[pid]
    start = int(entry.get("start", 0))
    gi = {
        "id": int(entry.get("id", buddy_id(start, msize))),
        "profile_id": pid,
        "start": start,
        "size": msize,
        "compute_instances": [],
    }
    cis = entry.get("compute_instances")
    if cis is None:
        default = 4 if cslices == 7 else cslices - 1
        gi["compute_instances"] = [{"id": 0, "profile_id": default, "start": 0, "size": cslices}]
    else:
        for k, ci in enumerate(cis):
            cp = int(ci["profile_id"])
            if cp not in CI_SLICES:
                raise CtlError(f"unknown compute instance profile {cp}")
            gi["compute_instances"].append(
                {"id": int(ci.get("id", k)), "profile_id": cp, "start": int(ci.get("start", 0)), "size": CI_SLICES[cp]}
            )
    return gi


def _procs(lst) -> list:
    return [
        {
            "pid": int(p["pid"]),
            "used_memory_mib": int(p.get("used_memory_mib", 0)),
            "gpu_instance_id": int(p.get("gpu_instance_id", -1)),
            "compute_instance_id": int(p.get("compute_instance_id", -1)),
        }
        for p in lst or []
    ]


def load_fixture(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            fx = json.load(f)
    except OSError as e:
        raise CtlError(f"cannot read fixture {path}: {e}") from e
    except ValueError as e:
        raise CtlError(f"malformed fixture {path}: {e}") from e
    if not isinstance(fx, dict) or not isinstance(fx.get("gpus"), list):
        raise CtlError(f"malformed fixture {path}: top level must be an object with a 'gpus' array")
    return fx


def initial_gpu_state(gpu: dict) -> dict:
    mig = gpu.get("mig")
    st = {"mig_current": 0, "mig_pending": 0, "gpu_instances": [], "processes": _procs(gpu.get("processes"))}
    if mig:
        if mig.get("profile_table") not in KNOWN_TABLES:
            raise CtlError(f"unknown mig.profile_table {mig.get('profile_table')!r}")
        st["mig_current"] = int(mig.get("mode", 0))
        st["mig_pending"] = int(mig.get("pending_mode", st["mig_current"]))
        st["gpu_instances"] = [_gi_from_fixture(g) for g in mig.get("gpu_instances", [])]
    return st


def read_state(state_path: str, fx: dict) -> dict:
    """State as the library sees it: file entries by UUID, fixture values for the rest."""
    stored = {}
    try:
        with open(state_path, encoding="utf-8") as f:
            stored = json.load(f).get("gpus", {})
    except FileNotFoundError:
        pass
    except ValueError:
        stored = {}
    gpus = {}
    for gpu in fx["gpus"]:
        gpus[gpu["uuid"]] = stored.get(gpu["uuid"]) or initial_gpu_state(gpu)
    return {"format": 1, "gpus": gpus}


def write_state(state_path: str, state: dict) -> None:
    d = os.path.dirname(os.path.abspath(state_path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".nvml-double-state.", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, state_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(state_path: str, exclusive: bool = True):
    """Hold the same flock the C library takes (``<state>.lock``)."""
    lock = state_path + ".lock"
    os.makedirs(os.path.dirname(os.path.abspath(lock)), exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _select(fx: dict, gpus) -> list:
    n = len(fx["gpus"])
    if not gpus:
        return list(range(n))
    for g in gpus:
        if not 0 <= g < n:
            raise CtlError(f"--gpu {g} out of range (fixture has {n} GPUs)")
    return list(gpus)


def cmd_show(args, fx) -> int:
    with locked(args.state, exclusive=False):
        state = read_state(args.state, fx)
    out = {"state_file": args.state, "fixture": args.fixture, "gpus": []}
    for i, gpu in enumerate(fx["gpus"]):
        out["gpus"].append(dict(index=i, uuid=gpu["uuid"], name=gpu.get("name"), **state["gpus"][gpu["uuid"]]))
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def drop_mig_capabilities(fx: dict, gpus) -> None:
    """Remove the driver's capability entries of the GPU instances a reset destroyed, as the kernel module does.

    The C side rewrites the tree on each of its state writes (nvml_double.c caps_sync); a reset only ever destroys
    instances, so removing the GPUs' gi<id> entries keeps the tree in step.  Only where the node's view holds the tree
    (its mig/config entry), as there."""
    caps = os.environ.get("NVML_DOUBLE_CAPS_DIR") or "/proc/driver/nvidia/capabilities"
    if not os.path.exists(os.path.join(caps, "mig", "config")):
        return
    for i in gpus:
        mig = os.path.join(caps, "gpu%d" % fx["gpus"][i]["minor"], "mig")
        if os.path.isdir(mig):
            for name in os.listdir(mig):
                if name.startswith("gi"):
                    shutil.rmtree(os.path.join(mig, name), ignore_errors=True)


def cmd_reset(args, fx) -> int:
    with locked(args.state):
        state = read_state(args.state, fx)
        busy = []
        for i in _select(fx, args.gpu):
            st = state["gpus"][fx["gpus"][i]["uuid"]]
            if st["processes"] and not args.force:
                busy.append(i)
        if busy:
            raise CtlError(f"GPU reset refused: processes running on GPU(s) {busy} (use --force)", 3)
        flipped = []
        for i in _select(fx, args.gpu):
            st = state["gpus"][fx["gpus"][i]["uuid"]]
            st["processes"] = []
            if st["mig_pending"] != st["mig_current"]:
                st["mig_current"] = st["mig_pending"]
                st["gpu_instances"] = []
                flipped.append(i)
        write_state(args.state, state)
        drop_mig_capabilities(fx, flipped)
    return 0


def cmd_set_processes(args, fx) -> int:
    if args.clear:
        procs = []
    else:
        try:
            procs = _procs(json.loads(args.json))
        except (ValueError, KeyError, TypeError) as e:
            raise CtlError(
                f"--json must be a list of {{pid, used_memory_mib[, gpu_instance_id, compute_instance_id]}}: {e}"
            ) from e
    with locked(args.state):
        state = read_state(args.state, fx)
        for i in _select(fx, args.gpu):
            state["gpus"][fx["gpus"][i]["uuid"]]["processes"] = procs
        write_state(args.state, state)
    return 0


# nvml.h nvmlEventTypeXidCriticalError; instance ids for "not attributable to a MIG instance".
EVENT_TYPE_XID = 0x8
NA_ID = 0xFFFFFFFF


def cmd_inject_xid(args, fx) -> int:
    """Append an XID event to ``<state>.events``; event sets created before it receive it."""
    (gpu,) = _select(fx, [args.gpu])
    if (args.gi is None) != (args.ci is None):
        raise CtlError("--gi and --ci go together")
    event = {
        "uuid": fx["gpus"][gpu]["uuid"],
        "type": EVENT_TYPE_XID,
        "data": args.xid,
        "gpu_instance_id": NA_ID if args.gi is None else args.gi,
        "compute_instance_id": NA_ID if args.ci is None else args.ci,
    }
    line = (json.dumps(event) + "\n").encode()
    with locked(args.state):
        fd = os.open(args.state + ".events", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line)  # one write: readers never see half a line
        finally:
            os.close(fd)
    return 0


def main(argv=None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--state", dest="state_opt", help="state file (default $NVML_DOUBLE_STATE)")
    common.add_argument("--fixture", help="fixture file (default $NVML_DOUBLE_FIXTURE)")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", parents=[common], help="print the effective state")
    s.add_argument("state", nargs="?")
    s = sub.add_parser("reset", parents=[common], help="simulated GPU reset (pending MIG mode becomes current)")
    s.add_argument("state", nargs="?")
    s.add_argument("--gpu", type=int, action="append", help="GPU index (repeatable; default all)")
    s.add_argument("--force", action="store_true", help="reset even with processes running (they are dropped)")
    s = sub.add_parser("set-processes", parents=[common], help="replace the running processes of GPU(s)")
    s.add_argument("state", nargs="?")
    s.add_argument("--gpu", type=int, action="append", required=True, help="GPU index (repeatable)")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--json", help='e.g. \'[{"pid": 42, "used_memory_mib": 100}]\'')
    g.add_argument("--clear", action="store_true")
    s = sub.add_parser("inject-xid", parents=[common], help="raise an XID critical-error event on a GPU")
    s.add_argument("state", nargs="?")
    s.add_argument("--gpu", type=int, required=True, help="GPU index")
    s.add_argument("--xid", type=int, required=True, help="XID number, e.g. 79 (GPU has fallen off the bus)")
    s.add_argument("--gi", type=int, help="GPU instance id the error is attributed to (MIG)")
    s.add_argument("--ci", type=int, help="compute instance id the error is attributed to (MIG)")
    args = p.parse_args(argv)
    args.state = args.state_opt or args.state or os.environ.get("NVML_DOUBLE_STATE") or DEFAULT_STATE
    args.fixture = args.fixture or os.environ.get("NVML_DOUBLE_FIXTURE") or DEFAULT_FIXTURE
    try:
        fx = load_fixture(args.fixture)
        return {
            "show": cmd_show,
            "reset": cmd_reset,
            "set-processes": cmd_set_processes,
            "inject-xid": cmd_inject_xid,
        }[args.cmd](args, fx)
    except CtlError as e:
        print(f"nvml_double_ctl: {e}", file=sys.stderr)
        return e.code


if __name__ == "__main__":
    sys.exit(main())
