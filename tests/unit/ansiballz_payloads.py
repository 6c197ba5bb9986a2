# SPDX-License-Identifier: GPL-3.0-or-later
"""What Ansible ships to the managed host for each module of the collection: its AnsiballZ payload.

The payload is built by ansible-core's own ``module_common.modify_module`` (what the action plugin calls for every
module task, with the module_utils finder and the configured compression) and read back out of the wrapper, so
the file list is Ansible's answer, not an import graph of our own.

Run it in a process of its own, ``python -m tests.unit.ansiballz_payloads [--table]``: building a payload needs
Ansible's collection loader on ``sys.meta_path``, and installing that inside a pytest process would change how every
later ``ansible_collections`` import of the session resolves.  Prints JSON ``{module: description}`` (see
``describe``), or with ``--table`` the sizes, one module a line.
"""

from __future__ import annotations

import ast
import base64
import io
import json
import re
import sys
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = REPO_ROOT / "build" / "collections"
# The module path must lie below ansible_collections/<ns>/<name>/plugins/modules/: that is how module_common finds
# the module's FQN, so the link (make collection-link), not the checkout's own path.
MODULES = COLLECTIONS / "ansible_collections" / "gpuharden" / "k8s" / "plugins" / "modules"
MODULE_UTILS_PREFIX = "ansible_collections/gpuharden/k8s/plugins/module_utils/"
# The wrapper passes the base64 zip to _ansiballz_main as a repr()'d keyword argument.
_ZIP_DATA = re.compile(rb"""\bzip_data=(['"])([A-Za-z0-9+/=]*)\1""")


def build(module_path, templar):
    """(module style, wrapper bytes, zip bytes or None) as ansible-core builds them for a task."""
    from ansible import constants as C
    from ansible.executor.module_common import modify_module

    built = modify_module(
        module_name=module_path.stem,
        module_path=str(module_path),
        module_args={},
        templar=templar,
        # an interpreter given up front: without it, module_common would ask for interpreter discovery
        task_vars={"ansible_python_interpreter": sys.executable},
        module_compression=C.config.get_config_value("DEFAULT_MODULE_COMPRESSION"),
    )
    if built.module_style != "new":
        return built.module_style, built.b_module_data, None
    match = _ZIP_DATA.search(built.b_module_data)
    if match is None:
        raise RuntimeError("%s: no zip_data in the AnsiballZ wrapper of this ansible-core" % module_path.name)
    return built.module_style, built.b_module_data, base64.b64decode(match.group(2))


def kubernetes_imports(name, source):
    """``name:line`` of each import of the ``kubernetes`` package (or a submodule) in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        if any(module.split(".")[0] == "kubernetes" for module in modules):
            found.append("%s:%d" % (name, node.lineno))
    return found


def describe(style, wrapper, zip_data):
    """{style, wrapper_bytes, zip_bytes, files, module_utils, module_utils_bytes, kubernetes_imports}.

    ``module_utils`` are the collection's, named relative to plugins/module_utils without ``.py`` (package
    ``__init__`` files left out); ``kubernetes_imports`` covers every Python file of the payload.
    """
    if zip_data is None:
        return {"style": style, "wrapper_bytes": len(wrapper), "zip_bytes": 0, "files": [], "module_utils": [],
                "module_utils_bytes": 0, "kubernetes_imports": []}
    archive = zipfile.ZipFile(io.BytesIO(zip_data))
    utils, utils_bytes, imports = [], 0, []
    for info in archive.infolist():
        if not info.filename.endswith(".py"):
            continue
        imports.extend(kubernetes_imports(info.filename, archive.read(info)))
        if info.filename.startswith(MODULE_UTILS_PREFIX) and not info.filename.endswith("__init__.py"):
            utils.append(info.filename[len(MODULE_UTILS_PREFIX):-len(".py")])
            utils_bytes += info.file_size
    return {"style": style, "wrapper_bytes": len(wrapper), "zip_bytes": len(zip_data),
            "files": sorted(archive.namelist()), "module_utils": sorted(utils), "module_utils_bytes": utils_bytes,
            "kubernetes_imports": imports}


def payloads():
    """{module name: describe(...)} for every module file of the collection."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar

    init_plugin_loader([str(COLLECTIONS)])
    templar = Templar(loader=DataLoader())
    return {path.stem: describe(*build(path, templar)) for path in sorted(MODULES.glob("*.py")) if path.stem != "__init__"}


def table(described):
    lines = ["%-26s %8s %8s %4s %9s" % ("module", "wrapper", "zip", "mu", "mu_bytes")]
    for name, entry in described.items():
        lines.append("%-26s %8d %8d %4d %9d" % (name, entry["wrapper_bytes"], entry["zip_bytes"],
                                               len(entry["module_utils"]), entry["module_utils_bytes"]))
    return "\n".join(lines)


if __name__ == "__main__":
    result = payloads()
    print(table(result) if sys.argv[1:] == ["--table"] else json.dumps(result, sort_keys=True))
