# SPDX-License-Identifier: GPL-3.0-or-later
"""Where the node's CPU per audit goes: node_audit's AnsiballZ payload imported from source, and from bytecode.

Ansible ships a module to the node as a zip of Python source (ansible/executor/module_common.py builds it; the
wrapper puts it on ``sys.path``) and the node's Python imports it through zipimport, which never writes bytecode: every
audit compiles every file it imports.  This benchmark takes the payload ansible-core really builds for
``gpuharden.k8s.node_audit`` (one ad-hoc run on localhost, read-only: no check is given, the wrapper is kept with
ANSIBLE_KEEP_REMOTE_FILES), then imports all of its module_utils, one fresh Python per run, alternating:

- ``source``: the payload as Ansible ships it;
- ``bytecode``: the same zip with a checked-hash .pyc beside each .py (PEP 552; zipimport takes a .pyc whose magic
  number is this Python's and whose hash matches its source, Lib/zipimport.py _unmarshal_code);
- ``foreign bytecode``: the same .pyc with another magic number, as a node with another Python version would see them:
  zipimport must fall back to the source, so this should cost what ``source`` does.

Prints each variant's CPU (user + system of the child) per import, the medians, and the payload sizes.  Controller
only, no lab; it measures imports (every module_utils file of the payload, an upper bound of what one audit imports),
not the audit's own work.  Figures compare only within one run.

    python bench/node_payload.py [--runs 7] [--python /usr/bin/python3] [--json FILE]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import marshal
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULE = "gpuharden.k8s.node_audit"
# ansible-core 2.19's wrapper (executor/module_common.py, ANSIBALLZ_TEMPLATE) passes the payload as zip_data='...'
ZIP_DATA = re.compile(r"zip_data='([A-Za-z0-9+/=]+)'")
FOREIGN_MAGIC = b"\x00\x00\r\n"


def shipped_payload(workdir, python):
    """The zip ansible-core builds for node_audit, from one kept ad-hoc run on localhost."""
    remote_tmp = Path(workdir) / "remote"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_KEEP_REMOTE_FILES="1", ANSIBLE_REMOTE_TMP=str(remote_tmp),
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-c", "local", "-m", MODULE,
                           "-a", "node_name=bench", "-e", f"ansible_python_interpreter={python}"],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=300)
    wrappers = list(remote_tmp.rglob("AnsiballZ_node_audit.py"))
    if done.returncode != 0 or len(wrappers) != 1:
        raise SystemExit(f"node_payload: the ad-hoc run of {MODULE} kept no wrapper (rc {done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    found = ZIP_DATA.search(wrappers[0].read_text())
    if not found:
        raise SystemExit(f"node_payload: no zip_data in {wrappers[0]}: this ansible-core's wrapper is not the one this benchmark reads")
    return base64.b64decode(found.group(1))


def with_bytecode(source_zip, path, foreign=False):
    """The payload with a checked-hash .pyc beside each .py, compiled by the Python that runs this (foreign: with
    another magic number than its own)."""
    magic = FOREIGN_MAGIC if foreign else importlib.util.MAGIC_NUMBER
    with zipfile.ZipFile(source_zip) as original, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in original.infolist():
            data = original.read(info)
            out.writestr(zipfile.ZipInfo(info.filename, info.date_time), data, zipfile.ZIP_DEFLATED)
            if info.filename.endswith(".py"):
                code = compile(data, info.filename, "exec", dont_inherit=True)
                # flags 0b11: hash-based, checked against the source (PEP 552)
                header = magic + (3).to_bytes(4, "little") + importlib.util.source_hash(data)
                out.writestr(zipfile.ZipInfo(info.filename + "c", info.date_time), header + marshal.dumps(code), zipfile.ZIP_DEFLATED)
    return Path(path)


def built_by(python, source_zip, path, foreign=False):
    """with_bytecode run by the node's Python, whose magic number and compiler the .pyc must carry."""
    subprocess.run([python, __file__, "--build-bytecode", str(source_zip), str(path), *(["--foreign"] if foreign else [])], check=True)
    return Path(path)


def module_utils(payload_path):
    with zipfile.ZipFile(payload_path) as payload:
        return sorted(name[:-3].replace("/", ".").removesuffix(".__init__") for name in payload.namelist()
                      if name.endswith(".py") and "/module_utils/" in name and name.startswith("ansible_collections/"))


def import_cpu_ms(python, payload_path, modules):
    """CPU (user + system) of one fresh Python importing ``modules`` from the zip, in ms."""
    program = f"import sys\nsys.path.insert(0, {str(payload_path)!r})\nfor name in {modules!r}:\n    __import__(name)\n"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([python, "-c", program], check=True, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--python", default="/usr/bin/python3", help="the node's Python (the lab nodes run the host's)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--build-bytecode", nargs=2, metavar=("SOURCE_ZIP", "ZIP"), help=argparse.SUPPRESS)
    parser.add_argument("--foreign", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_bytecode:
        with_bytecode(*args.build_bytecode, foreign=args.foreign)
        return 0
    with tempfile.TemporaryDirectory(prefix="gpuharden-bench-payload-") as workdir:
        work = Path(workdir)
        payload = shipped_payload(work, args.python)
        (work / "source.zip").write_bytes(payload)
        variants = {"source": work / "source.zip",
                    "bytecode": built_by(args.python, work / "source.zip", work / "bytecode.zip"),
                    "foreign bytecode": built_by(args.python, work / "source.zip", work / "foreign.zip", foreign=True)}
        modules = module_utils(variants["source"])
        figures = {name: [] for name in variants}
        for _ in range(args.runs):
            for name, path in variants.items():
                figures[name].append(import_cpu_ms(args.python, path, modules))
        sizes = {name: path.stat().st_size for name, path in variants.items()}
    result = {"modules": len(modules), "runs": args.runs, "load_average": os.getloadavg()[0],
              "median_ms": {name: statistics.median(values) for name, values in figures.items()}, "cpu_ms": figures, "zip_bytes": sizes}
    print(f"node_audit's payload: {len(modules)} module_utils files, imported {args.runs} times each way, alternating "
          f"(load average {result['load_average']:.1f})")
    for name, values in figures.items():
        print(f"  {name:17s} median {statistics.median(values):6.0f} ms CPU  (min {min(values):.0f}, max {max(values):.0f})  "
              f"zip {sizes[name] // 1024} KiB")
    source, bytecode = result["median_ms"]["source"], result["median_ms"]["bytecode"]
    print(f"  bytecode saves {source - bytecode:.0f} ms per import ({(source - bytecode) / source:.0%})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
