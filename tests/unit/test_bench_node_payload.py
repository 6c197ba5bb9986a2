# SPDX-License-Identifier: GPL-3.0-or-later
"""bench/node_payload.py's premise (issue 45 item 7, node CPU per audit): zipimport, which runs an AnsiballZ payload
on the node, takes a checked-hash .pyc beside its source where the magic number is the running Python's, and falls back
to the source where it is another Python's (CPython Lib/zipimport.py: _get_module_code tries the .pyc first,
_unmarshal_code returns None on a bad magic number or a source hash that does not match).  Bytecode in the payload can
therefore only save the node's compile, never run other code than the source on another Python version."""

from __future__ import annotations

import importlib.util
import marshal
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("bench_node_payload", REPO / "bench" / "node_payload.py")
node_payload = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(node_payload)


def _payload(tmp_path):
    source = tmp_path / "source.zip"
    with zipfile.ZipFile(source, "w") as payload:
        payload.writestr("probe.py", "RAN = 'source'\n")
    return source


def _marked(built, tmp_path, name):
    """``built`` with the .pyc's code replaced by code that says it ran from bytecode (its header, and so its source
    hash, kept): which of the two ran is then visible."""
    marked = tmp_path / name
    with zipfile.ZipFile(built) as payload, zipfile.ZipFile(marked, "w") as out:
        for info in payload.infolist():
            data = payload.read(info)
            if info.filename == "probe.pyc":
                data = data[:16] + marshal.dumps(compile("RAN = 'bytecode'\n", "probe.py", "exec"))
            out.writestr(info.filename, data)
    return marked


def _ran(zip_path):
    program = f"import sys; sys.path.insert(0, {str(zip_path)!r}); import probe; print(probe.RAN)"
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout.strip()


def test_zipimport_takes_this_pythons_bytecode_and_ignores_another_pythons(tmp_path):
    source = _payload(tmp_path)
    assert _ran(source) == "source"
    own = node_payload.with_bytecode(source, tmp_path / "own.zip")
    with zipfile.ZipFile(own) as payload:
        assert sorted(payload.namelist()) == ["probe.py", "probe.pyc"]
    assert _ran(own) == "source"
    assert _ran(_marked(own, tmp_path, "own-marked.zip")) == "bytecode"
    foreign = node_payload.with_bytecode(source, tmp_path / "foreign.zip", foreign=True)
    assert _ran(_marked(foreign, tmp_path, "foreign-marked.zip")) == "source"


def test_bytecode_of_another_source_is_not_taken(tmp_path):
    """A .pyc whose hash is not its source's (the source edited after it was built) is ignored: checked-hash pycs."""
    built = _marked(node_payload.with_bytecode(_payload(tmp_path), tmp_path / "own.zip"), tmp_path, "marked.zip")
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(built) as payload, zipfile.ZipFile(edited, "w") as out:
        for info in payload.infolist():
            out.writestr(info.filename, b"RAN = 'edited source'\n" if info.filename == "probe.py" else payload.read(info))
    assert _ran(edited) == "edited source"
