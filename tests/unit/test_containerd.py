# SPDX-License-Identifier: GPL-3.0-or-later
"""containerd_nvidia_runtime: the pure planner on fixtures, and the module run as Ansible runs it."""

from __future__ import annotations

import hashlib
import os
import shutil
import tomllib
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _containerd

from tests.unit.conftest import run_module

FIXTURES = Path(__file__).parent / "fixtures" / "containerd"
CONFIG = "/etc/containerd/config.toml"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
V2 = ("plugins", "io.containerd.grpc.v1.cri")
V3 = ("plugins", "io.containerd.cri.v1.runtime")
BINARY = "/usr/bin/nvidia-container-runtime"


def params(**overrides):
    base = {"path": CONFIG, "runtime_name": "nvidia", "binary_name": BINARY, "runtime_type": "io.containerd.runc.v2",
            "base_runtime": "runc", "set_as_default": False, "enable_cdi": False, "drop_in": DROP_IN}
    base.update(overrides)
    return base


def install(root: Path, fixture: str | None = None, files: dict[str, str] | None = None) -> Path:
    """A node root with the fixture as /etc/containerd (a directory fixture) or as config.toml (a file)."""
    (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
    if fixture:
        source = FIXTURES / fixture
        if source.is_dir():
            shutil.copytree(source, root / "etc/containerd", dirs_exist_ok=True)
        else:
            shutil.copy(source, root / "etc/containerd/config.toml")
    for path, text in (files or {}).items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    toolkit(root)
    return root


def toolkit(root: Path, path: str = BINARY, mode: int = 0o755) -> Path:
    """The NVIDIA container runtime binary the toolkit installs (a stub)."""
    binary = root / path.lstrip("/")
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(mode)
    return binary


def plan(root: Path, **overrides):
    files = _containerd.read_config_set(str(root), CONFIG)
    return _containerd.plan_runtime(files, params(**overrides), root=str(root))


def apply(plan_result):
    for change in plan_result["changes"]:
        Path(change.path).parent.mkdir(parents=True, exist_ok=True)
        Path(change.path).write_text(change.after)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def dig(data, keys):
    for key in keys:
        data = data[key]
    return data


def pop(data, keys):
    for key in keys[:-1]:
        data = data[key]
    return data.pop(keys[-1])


def prune(data):
    """Drop tables left empty (an added runtime may have created its parents)."""
    for key in list(data):
        if isinstance(data[key], dict):
            prune(data[key])
            if not data[key]:
                del data[key]
    return data


def comments(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        if "#" in line:
            out.append(line[line.index("#"):].strip())
    return out


# ---------------------------------------------------------------------------------------------
# exactly the runtime and nothing else


@pytest.mark.parametrize(("fixture", "cri"), [("v2-single.toml", V2), ("v3-single.toml", V3), ("v2-comments.toml", V2)])
def test_single_file_gains_exactly_the_runtime(world_tmp, fixture, cri):
    root = install(world_tmp, fixture)
    before_text = (root / "etc/containerd/config.toml").read_text()
    result = plan(root)
    assert [change.path for change in result["changes"]] == [str(root / "etc/containerd/config.toml")]
    after_text = result["changes"][0].after
    before, after = tomllib.loads(before_text), tomllib.loads(after_text)
    runtime = pop(after, (*cri, "containerd", "runtimes", "nvidia"))
    assert after == before
    runc = dig(before, (*cri, "containerd", "runtimes", "runc"))
    assert runtime["runtime_type"] == "io.containerd.runc.v2"
    assert runtime["options"] == {**runc.get("options", {}), "BinaryName": BINARY}
    assert runtime["options"]["SystemdCgroup"] is True
    assert {key: value for key, value in runtime.items() if key != "options"} == {key: value for key, value in runc.items() if key != "options"}
    for comment in comments(before_text):
        assert comment in after_text
    assert after_text.startswith(before_text.split("[", 1)[0])  # the header block is byte-identical
    assert result["restart_required"] if "restart_required" in result else result["changes"]


def test_comment_before_next_table_stays_with_it(world_tmp):
    root = install(world_tmp, "v2-comments.toml")
    after = plan(root)["changes"][0].after
    assert "# Registry\n[plugins.\"io.containerd.grpc.v1.cri\".registry]" in after
    assert after.index("runtimes.nvidia]") < after.index("# Registry")


def test_conf_d_layout_writes_a_drop_in(world_tmp):
    root = install(world_tmp, "v3-confd")
    before = snapshot(root)
    result = plan(root)
    assert result["runtime_file"] == DROP_IN
    assert len(result["changes"]) == 1
    change = result["changes"][0]
    assert change.path == str(root / DROP_IN.lstrip("/")) and change.before is None and change.mode == 0o644
    drop_in = tomllib.loads(change.after)
    runtime = pop(drop_in, (*V3, "containerd", "runtimes", "nvidia"))
    assert prune(drop_in) == {"version": 3}
    assert runtime == {"runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": True, "BinaryName": BINARY}}
    assert snapshot(root) == before  # planning wrote nothing


def test_conf_d_layout_set_as_default_goes_to_the_drop_in_and_cdi_is_left_to_containerd_2x(world_tmp):
    # a version-3 set runs only on containerd 2.x, where CDI is on by default and 2.4 ignores enable_cdi
    # (tests/real/test_containerd_real.py::test_enable_cdi_is_not_written_where_containerd_2x_ignores_it)
    root = install(world_tmp, "v3-confd")
    result = plan(root, set_as_default=True, enable_cdi=True)
    drop_in = tomllib.loads(result["changes"][0].after)
    assert dig(drop_in, (*V3, "containerd", "default_runtime_name")) == "nvidia"
    assert "enable_cdi" not in dig(drop_in, V3) and "enable_cdi" not in result["changes"][0].after
    assert result["desired"]["default_runtime_name"] == "nvidia"
    assert result["desired"]["enable_cdi"] is None and not any("enable_cdi" in action for action in result["actions"])
    assert any("enable_cdi is not written" in note for note in result["notes"])


def test_nvidia_ctk_drop_in_is_compliant(world_tmp):
    root = install(world_tmp, "v3-confd-nvidia")
    result = plan(root)
    assert result["changes"] == [] and result["actions"] == []
    assert result["runtime_file"] == DROP_IN
    assert result["files"] == [CONFIG, DROP_IN]


def test_relative_import_glob_and_other_directory(world_tmp):
    main = ("version = 3\nimports = [\"config.d/*.toml\"]\n\n"
            "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n")
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/config.d/00-base.toml": "version = 3\n"})
    result = plan(root)
    assert result["runtime_file"] == "/etc/containerd/config.d/99-nvidia.toml"
    assert result["files"] == [CONFIG, "/etc/containerd/config.d/00-base.toml"]


def test_v3_imports_without_a_glob_keep_the_runtime_in_the_main_file(world_tmp):
    main = "version = 3\nimports = [\"/etc/containerd/extra.toml\"]\n"
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/extra.toml": "version = 3\n"})
    result = plan(root)
    assert result["runtime_file"] == CONFIG
    assert len(result["changes"]) == 1 and result["changes"][0].path.endswith("config.toml")


def test_v2_with_imports_writes_where_the_cri_section_lives(world_tmp):
    # containerd 1.x replaces a plugin section per file: a drop-in with only the runtime would wipe the others
    main = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n"
    cri = "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n"
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/conf.d/50-cri.toml": cri})
    result = plan(root)
    assert result["runtime_file"] == "/etc/containerd/conf.d/50-cri.toml"
    assert [change.path for change in result["changes"]] == [str(root / "etc/containerd/conf.d/50-cri.toml")]


def test_drop_in_already_correct_and_main_untouched_even_with_set_as_default_done(world_tmp):
    root = install(world_tmp, "v3-confd-nvidia")
    text = (root / DROP_IN.lstrip("/")).read_text()
    (root / DROP_IN.lstrip("/")).write_text(text.replace("[plugins.\"io.containerd.cri.v1.runtime\".containerd]\n",
                                                           "[plugins.\"io.containerd.cri.v1.runtime\".containerd]\n      default_runtime_name = \"nvidia\"\n"))
    assert plan(root, set_as_default=True)["changes"] == []


def test_existing_runtime_that_differs_is_corrected_in_place(world_tmp):
    root = install(world_tmp, "v2-nvidia-differs.toml")
    before_text = (root / "etc/containerd/config.toml").read_text()
    result = plan(root)
    assert len(result["changes"]) == 1
    after_text = result["changes"][0].after
    before, after = tomllib.loads(before_text), tomllib.loads(after_text)
    old = pop(before, (*V2, "containerd", "runtimes", "nvidia"))
    new = pop(after, (*V2, "containerd", "runtimes", "nvidia"))
    assert after == before
    assert new["runtime_type"] == "io.containerd.runc.v2"
    assert new["options"] == {"BinaryName": BINARY, "Root": "/run/nvidia-runc", "SystemdCgroup": True}
    assert new["privileged_without_host_devices"] == old["privileged_without_host_devices"]  # extra keys kept
    assert after_text.count("runtimes.nvidia]") == 1  # never defined twice
    for comment in comments(before_text):
        assert comment in after_text
    assert any("update" in action for action in result["actions"])


def test_set_as_default_edits_the_existing_key(world_tmp):
    root = install(world_tmp, "v2-single.toml")
    after = plan(root, set_as_default=True)["changes"][0].after
    assert dig(tomllib.loads(after), (*V2, "containerd", "default_runtime_name")) == "nvidia"
    assert after.count("default_runtime_name") == 1


def test_default_runtime_name_already_nvidia_copies_its_options_when_runc_missing(world_tmp):
    root = install(world_tmp, "v2-default-nvidia.toml")
    result = plan(root, enable_cdi=True)
    after = tomllib.loads(result["changes"][0].after)
    assert dig(after, (*V2, "enable_cdi")) is True
    assert dig(after, (*V2, "containerd", "runtimes", "nvidia", "options")) == {"SystemdCgroup": False, "BinaryName": BINARY}
    assert result["changes"][0].after.count("enable_cdi") == 1


@pytest.mark.parametrize(("fixture", "options"), [
    ("v2-single.toml", {"enable_cdi": True}),
    ("v2-comments.toml", {"enable_cdi": True, "set_as_default": True}),
    ("v2-nvidia-differs.toml", {"enable_cdi": True}),
])
def test_a_tomlkit_without_insert_at_writes_the_same_settings(world_tmp, monkeypatch, fixture, options):
    # _set_key inserts a new key mid-table with the private Container._insert_at; a tomlkit release without it (as
    # 0.15.3 dropped _insert_after) must still give the same configuration, through tomlkit's public append.
    root = install(world_tmp, fixture)
    with_insert = plan(root, **options)["changes"][0].after
    calls = []
    monkeypatch.setattr(_containerd, "_private_insert_at", lambda container: calls.append(container))
    without_insert = plan(root, **options)["changes"][0].after
    assert calls, "the fixture never adds a key mid-table: the fallback was not exercised"
    assert tomllib.loads(without_insert) == tomllib.loads(with_insert)
    assert comments(without_insert) == comments(with_insert)


def test_no_base_runtime_warns(world_tmp):
    # the default runtime is the one being added, so there is nothing to copy from
    root = install(world_tmp, files={CONFIG: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"nvidia\"\n"})
    result = plan(root)
    assert result["base_runtime"] is None
    assert any("SystemdCgroup" in warning for warning in result["warnings"])
    runtime = dig(tomllib.loads(result["changes"][0].after), (*V2, "containerd", "runtimes", "nvidia"))
    assert runtime == {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": BINARY}}


def test_out_of_order_tables(world_tmp):
    text = ("version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
            "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"\"\n\n"
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n")
    root = install(world_tmp, files={CONFIG: text})
    after = tomllib.loads(plan(root)["changes"][0].after)
    assert dig(after, (*V2, "containerd", "runtimes", "nvidia", "options")) == {"SystemdCgroup": True, "BinaryName": BINARY}


@pytest.mark.parametrize("fixture", ["v2-single.toml", "v3-single.toml", "v2-comments.toml", "v2-nvidia-differs.toml", "v3-confd",
                                     "v2-default-nvidia.toml"])
@pytest.mark.parametrize("flags", [{}, {"set_as_default": True, "enable_cdi": True}])
def test_second_plan_is_empty(world_tmp, fixture, flags):
    root = install(world_tmp, fixture)
    first = plan(root, **flags)
    assert first["changes"]
    apply(first)
    second = plan(root, **flags)
    assert second["changes"] == [] and second["actions"] == []
    assert second["current"] == first["desired"]


def test_custom_runtime_name_and_binary(world_tmp):
    root = install(world_tmp, "v3-single.toml")
    result = plan(root, runtime_name="nvidia-cdi", binary_name="/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi")
    runtime = dig(tomllib.loads(result["changes"][0].after), (*V3, "containerd", "runtimes", "nvidia-cdi"))
    assert runtime["options"]["BinaryName"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi"
    assert result["runtime_name"] == "nvidia-cdi"


# ---------------------------------------------------------------------------------------------
# the module, as Ansible runs it


def module_args(root, **extra):
    return {"root": str(root), **extra}


def test_module_check_mode_apply_reapply(world_tmp):
    root = install(world_tmp, "v3-confd")
    before = snapshot(root)
    checked = run_module("containerd_nvidia_runtime", module_args(root, _ansible_check_mode=True, _ansible_diff=True), {})
    assert checked["changed"] is True and checked["restart_required"] is True, checked
    assert checked["runtime_name"] == "nvidia"
    assert checked["diff"][0]["before"] == "" and "runtimes.nvidia]" in checked["diff"][0]["after"]
    assert checked["changes"] == [{"path": DROP_IN, "changed": True, "action": "create", "reason": checked["actions"][0]}]
    assert snapshot(root) == before and not (root / "etc/containerd/conf.d/99-nvidia.toml").exists()

    applied = run_module("containerd_nvidia_runtime", module_args(root, backup=True), {})
    assert applied["changed"] is True and applied["backup_files"] == {}, applied  # a new file has nothing to back up
    drop_in = root / DROP_IN.lstrip("/")
    assert oct(drop_in.stat().st_mode & 0o777) == "0o644"
    stat = drop_in.stat()
    again = run_module("containerd_nvidia_runtime", module_args(root), {})
    assert again["changed"] is False and again["restart_required"] is False and again["actions"] == []
    assert drop_in.stat().st_mtime_ns == stat.st_mtime_ns and drop_in.stat().st_ino == stat.st_ino


def test_module_backup_and_mode_kept(world_tmp):
    root = install(world_tmp, "v2-single.toml")
    config = root / "etc/containerd/config.toml"
    config.chmod(0o600)
    original = config.read_text()
    result = run_module("containerd_nvidia_runtime", module_args(root, backup=True), {})
    assert result["changed"] is True, result
    backup = result["backup_files"][CONFIG]
    assert Path(root / backup.lstrip("/")).read_text() == original
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    assert not any(name.startswith(".gpuharden-") for name in os.listdir(config.parent))


def test_module_compliant_lab_shape(world_tmp):
    # what the lab seeds on every node but seed-no-runtime: v2, single file, runtime already there
    text = ("# containerd configuration (generated for this node by its installer)\nversion = 2\n\n"
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n\n"
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n"
            "  SystemdCgroup = true\n")
    root = install(world_tmp, files={CONFIG: text})
    result = run_module("containerd_nvidia_runtime", module_args(root), {})
    assert result["changed"] is False and result["runtime_file"] == CONFIG, result


# ---------------------------------------------------------------------------------------------
# malformed input: a clear message naming file, field and value; nothing on the node changes

RUNC = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
MALFORMED = {
    "broken-toml-fixture": ({"fixture": "broken.toml"}, {}, [CONFIG, "invalid TOML", "line"]),
    "wrong-types-fixture": ({"fixture": "wrong-types.toml"}, {}, [CONFIG, "runtimes", "'runc'", "must be a table"]),
    "v1-fixture": ({"fixture": "v1.toml"}, {}, [CONFIG, "version is missing", "version 1"]),
    "version-5": ({CONFIG: "version = 5\n"}, {}, [CONFIG, "version = 5"]),
    "drop-in-v1-names": ({"fixture": "v3-confd", DROP_IN: "[plugins.cri.containerd]\nsnapshotter = 'overlayfs'\n"}, {}, [DROP_IN, "plugins.cri", "no version"]),
    "import-bad-glob": ({CONFIG: "version = 3\nimports = [\"/etc/containerd/conf.d/*[.toml\"]\n"}, {}, [CONFIG, "imports[0]", "*[.toml", "glob"]),
    "duplicate-key": ({CONFIG: "version = 2\nversion = 3\n"}, {}, [CONFIG, "invalid TOML"]),
    "duplicate-table": ({CONFIG: "version = 2\n" + RUNC + RUNC}, {}, [CONFIG, "invalid TOML"]),
    "version-string": ({CONFIG: "version = \"2\"\n"}, {}, [CONFIG, "version", "'2'", "integer"]),
    "version-bool": ({CONFIG: "version = true\n"}, {}, [CONFIG, "version", "True"]),
    "imports-string": ({CONFIG: "version = 3\nimports = \"/etc/containerd/conf.d/*.toml\"\n"}, {}, [CONFIG, "imports", "array"]),
    "imports-number": ({CONFIG: "version = 3\nimports = [1]\n"}, {}, [CONFIG, "imports[0]", "1"]),
    "import-missing": ({CONFIG: "version = 3\nimports = [\"/etc/containerd/nope.toml\"]\n"}, {}, [CONFIG, "imports", "/etc/containerd/nope.toml"]),
    "plugins-string": ({CONFIG: "version = 2\nplugins = \"cri\"\n"}, {}, [CONFIG, "plugins", "'cri'", "table"]),
    "cri-number": ({CONFIG: "version = 2\n[plugins]\n\"io.containerd.grpc.v1.cri\" = 5\n"}, {}, [CONFIG, "io.containerd.grpc.v1.cri", "5"]),
    "containerd-array": ({CONFIG: "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\ncontainerd = [1, 2]\n"}, {},
                         [CONFIG, "containerd", "[1, 2]", "table"]),
    "runc-string": ({CONFIG: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\nrunc = \"x\"\n"}, {},
                    [CONFIG, "runtimes.runc", "'x'"]),
    "runc-runtime-type-number": ({CONFIG: "version = 2\n" + RUNC.replace('"io.containerd.runc.v2"', "5")}, {}, [CONFIG, "runc.runtime_type", "5", "string"]),
    "runc-options-string": ({CONFIG: "version = 2\n" + RUNC + "  options = \"SystemdCgroup\"\n"}, {}, [CONFIG, "runc.options", "'SystemdCgroup'"]),
    "nvidia-number": ({CONFIG: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\nnvidia = 1\n"}, {},
                      [CONFIG, "runtimes.nvidia", "1"]),
    "nvidia-options-array": ({CONFIG: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\noptions = []\n"}, {},
                             [CONFIG, "nvidia.options", "[]"]),
    "default-runtime-number": ({CONFIG: "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = 5\n"},
                               {}, [CONFIG, "default_runtime_name", "5", "string"]),
    "enable-cdi-string": ({CONFIG: "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = \"yes\"\n"}, {"enable_cdi": True},
                          [CONFIG, "enable_cdi", "'yes'", "boolean"]),
    "drop-in-broken": ({"fixture": "v3-confd", DROP_IN: "version = 3\n[plugins\n"}, {}, [DROP_IN, "invalid TOML"]),
    "drop-in-v1-with-plugins": ({"fixture": "v3-confd", DROP_IN: "[plugins.cri]\nx = 1\n"}, {}, [DROP_IN, "version"]),
    "drop-in-wrong-runtimes": ({"fixture": "v3-confd", DROP_IN: "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd]\nruntimes = 3\n"},
                               {}, [DROP_IN, "runtimes", "3"]),
    "not-utf8": ({CONFIG: None}, {}, [CONFIG, "UTF-8"]),
    "config-missing": ({}, {}, [CONFIG, "no containerd config"]),
    "config-is-directory": ({"dir": CONFIG}, {}, [CONFIG, "directory"]),
    "runtime-name-uppercase": ({"fixture": "v2-single.toml"}, {"runtime_name": "NVIDIA"}, ["runtime_name", "'NVIDIA'", "DNS label"]),
    "runtime-name-dots": ({"fixture": "v2-single.toml"}, {"runtime_name": "nvidia.cdi"}, ["runtime_name", "nvidia.cdi"]),
    "binary-relative": ({"fixture": "v2-single.toml"}, {"binary_name": "nvidia-container-runtime"}, ["binary_name", "absolute"]),
    "drop-in-not-toml": ({"fixture": "v3-confd"}, {"drop_in": "/etc/containerd/conf.d/99-nvidia.conf"}, ["drop_in", "99-nvidia.conf", ".toml"]),
    "set-as-default-wrong-type": ({"fixture": "v2-single.toml"}, {"set_as_default": "perhaps"}, ["set_as_default", "perhaps"]),
}


def _write_case(root: Path, spec: dict):
    (root / "etc/containerd").mkdir(parents=True, exist_ok=True)
    toolkit(root)
    for key, value in spec.items():
        if key == "fixture":
            install(root, value)
        elif key == "dir":
            (root / value.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif value is None:
            (root / key.lstrip("/")).write_bytes(b"version = 2\n# caf\xe9\n")
        else:
            target = root / key.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(value)


def test_at_least_15_malformed_cases():
    assert len(MALFORMED) >= 15


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_fails_clearly_and_changes_nothing(world_tmp, case):
    spec, extra, expected = MALFORMED[case]
    _write_case(world_tmp, spec)
    before = snapshot(world_tmp)
    listing = sorted(str(p) for p in world_tmp.rglob("*"))
    result = run_module("containerd_nvidia_runtime", module_args(world_tmp, backup=True, **extra), {})
    assert result.get("failed") is True, result
    for fragment in expected:
        assert fragment in result["msg"], (fragment, result["msg"])
    assert snapshot(world_tmp) == before
    assert sorted(str(p) for p in world_tmp.rglob("*")) == listing


def test_planner_raises_domain_error_only(world_tmp):
    root = install(world_tmp, "broken.toml")
    with pytest.raises(GpuhardenError) as raised:
        plan(root)
    assert "line 2" in raised.value.msg


def test_integer_is_not_a_boolean(world_tmp):
    text = ("version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n\n"
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n"
            "  SystemdCgroup = 1\n")
    root = install(world_tmp, files={CONFIG: text})
    result = plan(root)
    assert result["actions"] == ["update options.SystemdCgroup of runtime 'nvidia' in %s" % CONFIG]
    assert "SystemdCgroup = true" in result["changes"][0].after.split("runtimes.nvidia.options]")[1]


# ---------------------------------------------------------------------------------------------
# issue 13: match what the real containerd, nvidia-ctk and k3s/rke2 do

V2_RUNC = ("version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n\n"
           "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
           "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n")
V3_NVIDIA = ("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
             "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.nvidia.options]\n"
             "  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n  SystemdCgroup = true\n")
K3S_CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
RKE2_CONFIG = "/var/lib/rancher/rke2/agent/etc/containerd/config.toml"


def install_at(root: Path, fixture: str, directory: str) -> Path:
    shutil.copytree(FIXTURES / fixture, root / directory.lstrip("/"), dirs_exist_ok=True)
    toolkit(root)
    return root


def test_item07_config_version_4_edited_like_v3(world_tmp):
    root = install(world_tmp, "v4-single.toml")
    result = plan(root)
    assert result["config_version"] == 4 and result["runtime_file"] == CONFIG
    after = tomllib.loads(result["changes"][0].after)
    runtime = dig(after, (*V3, "containerd", "runtimes", "nvidia"))
    assert runtime["options"] == {"BinaryName": BINARY, "SystemdCgroup": True, "NoNewKeyring": False}
    apply(result)
    assert plan(root)["changes"] == []


def test_item07_config_version_4_conf_d_drop_in_has_version_4(world_tmp):
    root = install(world_tmp, "v3-confd")
    config = root / "etc/containerd/config.toml"
    config.write_text(config.read_text().replace("version = 3", "version = 4"))
    (root / "etc/containerd/conf.d/10-registry.toml").write_text("version = 4\n")
    result = plan(root)
    assert result["runtime_file"] == DROP_IN
    drop_in = tomllib.loads(result["changes"][0].after)
    assert drop_in["version"] == 4 and dig(drop_in, (*V3, "containerd", "runtimes", "nvidia", "options", "BinaryName")) == BINARY


def test_item07_v2_main_importing_a_v3_drop_in_is_accepted(world_tmp):
    root = install(world_tmp, files={CONFIG: V2_RUNC, DROP_IN: "version = 3\n\n" + V3_NVIDIA})
    result = plan(root)
    assert result["changes"] == [] and result["actions"] == [], result["actions"]
    assert result["files"] == [CONFIG, DROP_IN]
    assert any("version = 3 in" in warning for warning in result["warnings"])


def test_item07_drop_in_without_version_is_accepted(world_tmp):
    root = install(world_tmp, "v3-confd", files={DROP_IN: V3_NVIDIA})
    result = plan(root)
    assert result["changes"] == [] and result["runtime_file"] == DROP_IN


def test_item07_drop_in_without_version_holding_runc_options_is_merged(world_tmp):
    main = "version = 3\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n"
    runc = ("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n")
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/conf.d/10-runc.toml": runc})
    result = plan(root)
    drop_in = tomllib.loads(result["changes"][0].after)
    assert dig(drop_in, (*V3, "containerd", "runtimes", "nvidia", "options")) == {"SystemdCgroup": True, "BinaryName": BINARY}


@pytest.mark.parametrize(("text", "fragments"), [
    ("[plugins.cri.containerd]\n  snapshotter = 'overlayfs'\n", [CONFIG, "version is missing", "version 1", "version = 2, 3 or 4"]),
    ("version = 1\n", [CONFIG, "version = 1", "containerd config migrate"]),
    ("version = 7\n", [CONFIG, "version = 7", "(2, 3 or 4)"]),
    ("version = '3'\n", [CONFIG, "version", "string '3'"]),
])
def test_item07_missing_or_old_version_names_file_field_and_value(world_tmp, text, fragments):
    root = install(world_tmp, files={CONFIG: text})
    with pytest.raises(GpuhardenError) as raised:
        plan(root)
    for fragment in fragments:
        assert fragment in raised.value.msg, (fragment, raised.value.msg)
    assert raised.value.result["path"] == CONFIG and raised.value.result["field"] == "version"


def test_item08_nvidia_ctk_v2_layout_is_recognised_as_correct(world_tmp):
    root = install(world_tmp, "v2-nvidia-ctk")
    before = snapshot(root)
    result = plan(root)
    assert result["changes"] == [] and result["actions"] == [], result["actions"]
    assert result["files"] == [CONFIG, DROP_IN] and result["runtime_file"] == DROP_IN
    assert result["current"]["runtime"]["options"]["BinaryName"] == BINARY
    assert run_module("containerd_nvidia_runtime", module_args(root), {})["changed"] is False
    assert snapshot(root) == before


def test_item08_nvidia_ctk_v2_layout_with_a_stale_drop_in_is_fixed_in_the_drop_in(world_tmp):
    root = install(world_tmp, "v2-nvidia-ctk")
    drop_in = root / DROP_IN.lstrip("/")
    drop_in.write_text(drop_in.read_text().replace("SystemdCgroup = true\n\n        [plugins", "SystemdCgroup = false\n\n        [plugins", 1))
    result = plan(root)
    assert [change.path for change in result["changes"]] == [str(drop_in)]
    assert result["actions"] == ["update options.SystemdCgroup of runtime 'nvidia' in %s" % DROP_IN]


def test_item09_star_does_not_cross_a_slash(world_tmp):
    main = "version = 3\nimports = [\"/etc/containerd/*.toml\"]\n"
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/conf.d/10-registry.toml": "version = 3\n"})
    result = plan(root)
    assert result["files"] == [CONFIG]  # conf.d/10-registry.toml is not loaded
    assert result["runtime_file"] == "/etc/containerd/99-nvidia.toml"  # not conf.d/99-nvidia.toml, which nothing loads
    assert [change.path for change in result["changes"]] == [str(root / "etc/containerd/99-nvidia.toml")]


def test_item09_star_matches_dot_files_like_go(world_tmp):
    root = install(world_tmp, "v3-confd", files={"/etc/containerd/conf.d/.50-nvidia.toml": "version = 3\n\n" + V3_NVIDIA})
    result = plan(root)
    assert "/etc/containerd/conf.d/.50-nvidia.toml" in result["files"]
    assert result["changes"] == []


def test_item09_import_without_star_is_a_literal_path(world_tmp):
    main = "version = 3\nimports = [\"/etc/containerd/conf.d/9?-nvidia.toml\"]\n"
    root = install(world_tmp, files={CONFIG: main, DROP_IN: "version = 3\n\n" + V3_NVIDIA})
    with pytest.raises(GpuhardenError) as raised:
        plan(root)
    assert "imports[0]" in raised.value.msg and "9?-nvidia.toml" in raised.value.msg and "does not exist" in raised.value.msg


def test_item09_relative_glob_of_a_v2_config_read_differently_by_old_containerd_is_refused(world_tmp):
    main = "version = 2\nimports = [\"conf.d/*.toml\"]\n"
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/conf.d/50-cri.toml": V2_RUNC.replace("imports", "# imports")})
    with pytest.raises(GpuhardenError) as raised:
        plan(root)
    message = raised.value.msg
    assert CONFIG in message and "imports[0]" in message and "'conf.d/*.toml'" in message and "absolute" in message


def test_item09_relative_glob_of_a_v3_config_is_relative_to_the_file(world_tmp):
    main = "version = 3\nimports = [\"conf.d/*.toml\"]\n"
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/conf.d/10-x.toml": "version = 3\n", "/conf.d/10-y.toml": "version = 3\n"})
    result = plan(root)
    assert result["files"] == [CONFIG, "/etc/containerd/conf.d/10-x.toml"] and result["runtime_file"] == DROP_IN


def test_item09_self_check_proves_the_drop_in_is_loaded(world_tmp, monkeypatch):
    root = install(world_tmp, "v3-confd")
    monkeypatch.setattr(_containerd, "_drop_in_target", lambda *args, **kwargs: "/etc/containerd/conf.d/nested/99-nvidia.toml")
    with pytest.raises(GpuhardenError) as raised:
        plan(root)
    assert "no import" in raised.value.msg and "nested/99-nvidia.toml" in raised.value.msg


@pytest.mark.parametrize(("pattern", "name", "matches"), [
    ("*.toml", "99-nvidia.toml", True), ("*.toml", "conf.d/99-nvidia.toml", False), ("*.toml", ".hidden.toml", True),
    ("9?-*.toml", "99-nvidia.toml", True), ("[^0-8]*", "99.toml", True), ("[^0-9]*", "99.toml", False),
    ("\\*.toml", "*.toml", True), ("\\*.toml", "a.toml", False), ("[a-c]x", "bx", True),
])
def test_item09_go_match_semantics(pattern, name, matches):
    assert _containerd.go_match(pattern, name) is matches


@pytest.mark.parametrize("pattern", ["[", "[]a]", "a\\", "[a-]"])
def test_item09_go_bad_patterns_are_errors(pattern):
    with pytest.raises(ValueError):
        _containerd.go_match(pattern, "a")


def test_item10_missing_runtime_binary_fails_and_changes_nothing(world_tmp):
    root = install(world_tmp, "v3-confd")
    (root / BINARY.lstrip("/")).unlink()
    before = snapshot(root)
    result = run_module("containerd_nvidia_runtime", module_args(root), {})
    assert result.get("failed") is True, result
    assert BINARY in result["msg"] and "does not exist" in result["msg"] and "install the NVIDIA container toolkit" in result["msg"]
    assert result["field"] == "binary_name" and result["value"] == BINARY
    assert snapshot(root) == before


def test_item10_runtime_binary_not_executable_fails(world_tmp):
    root = install(world_tmp, "v3-confd-nvidia")
    (root / BINARY.lstrip("/")).chmod(0o644)
    result = run_module("containerd_nvidia_runtime", module_args(root), {})
    assert result.get("failed") is True and "not executable" in result["msg"], result


def test_item10_runtime_binary_through_a_symlink_in_the_root(world_tmp):
    root = install(world_tmp, "v3-confd")
    binary = root / BINARY.lstrip("/")
    binary.unlink()
    toolkit(root, "/opt/nvidia/bin/nvidia-container-runtime")
    binary.symlink_to("/opt/nvidia/bin/nvidia-container-runtime")  # absolute: resolved inside the root
    assert run_module("containerd_nvidia_runtime", module_args(root), {})["changed"] is True


def test_item10_warn_option_configures_and_warns(world_tmp):
    root = install(world_tmp, "v3-confd")
    (root / BINARY.lstrip("/")).unlink()
    result = run_module("containerd_nvidia_runtime", module_args(root, on_missing_runtime_binary="warn"), {})
    assert result["changed"] is True and result["runtime_binary_state"] == "missing", result
    assert "install the NVIDIA container toolkit" in str(result.get("warnings"))  # structured warning events in ansible-core 2.19


def test_item10_node_audit_reports_the_missing_binary(world_tmp):
    from ansible_collections.gpuharden.k8s.plugins.module_utils.audit import _node_audit

    root = install(world_tmp, "v3-confd-nvidia")
    (root / BINARY.lstrip("/")).unlink()
    options = _node_audit.section_params("containerd", _containerd.argument_spec(), {}, str(root))
    would_change, findings, _details = _node_audit.audit_containerd(options)
    assert would_change is False
    assert [(entry["id"], entry["remediable"], entry["path"]) for entry in findings] == [("containerd_runtime_binary_missing", False, BINARY)]
    assert "install the NVIDIA container toolkit" in findings[0]["hint"]


def test_item11_k3s_generated_config_is_never_edited(world_tmp):
    root = install_at(world_tmp, "k3s-v2", os.path.dirname(K3S_CONFIG))
    before = snapshot(root)
    result = run_module("containerd_nvidia_runtime", module_args(root, path=K3S_CONFIG), {})
    assert result.get("failed") is True, result
    message = result["msg"]
    assert K3S_CONFIG in message and "DO NOT EDIT" in message and "config.toml.tmpl" in message and "restart k3s" in message
    assert "runtimes.nvidia" in message
    assert snapshot(root) == before


def test_item11_k3s_own_nvidia_runtime_is_correct(world_tmp):
    root = install_at(world_tmp, "k3s-v2", os.path.dirname(K3S_CONFIG))
    config = root / K3S_CONFIG.lstrip("/")
    # what k3s appends when it finds nvidia-container-runtime on its PATH (ExtraRuntimes: no SystemdCgroup)
    config.write_text(config.read_text() + "\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.\"nvidia\"]\n"
                      "  runtime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.\"nvidia\".options]\n"
                      "  BinaryName = \"/usr/bin/nvidia-container-runtime\"\n")
    toolkit(root)
    result = run_module("containerd_nvidia_runtime", module_args(root, path=K3S_CONFIG), {})
    assert result["changed"] is False and result["generated_by"] == "k3s" and result["refused"] == [], result
    assert result["runtime_binary"] == BINARY
    assert "SystemdCgroup" in str(result.get("warnings"))


def test_item11_rke2_v3_generated_config_gets_a_drop_in_it_imports(world_tmp):
    root = install_at(world_tmp, "rke2-v3", os.path.dirname(RKE2_CONFIG))
    before = (root / RKE2_CONFIG.lstrip("/")).read_text()
    result = _containerd.plan_runtime(
        _containerd.read_config_set(str(root), RKE2_CONFIG), params(path=RKE2_CONFIG), root=str(root))
    drop_in = "/var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.d/99-nvidia.toml"
    assert result["runtime_file"] == drop_in
    assert [change.path for change in result["changes"]] == [str(root / drop_in.lstrip("/"))]
    assert (root / RKE2_CONFIG.lstrip("/")).read_text() == before


def test_item11_k3s_v3_without_imports_names_the_v3_template(world_tmp):
    root = install_at(world_tmp, "rke2-v3", os.path.dirname(K3S_CONFIG))
    config = root / K3S_CONFIG.lstrip("/")
    text = config.read_text().replace("rke2", "k3s")
    config.write_text("\n".join(line for line in text.splitlines() if not line.startswith("imports")) + "\n")
    with pytest.raises(GpuhardenError) as raised:
        _containerd.plan_runtime(_containerd.read_config_set(str(root), K3S_CONFIG), params(path=K3S_CONFIG), root=str(root))
    assert "config-v3.toml.tmpl" in raised.value.msg and "{{ template \"base\" . }}" in raised.value.msg


def test_item11_k3s_template_toml_follows_the_base_without_declaring_a_table_twice(world_tmp):
    # k3s renders config.toml.tmpl; after {{ template "base" . }} the base (k3s pkg/agent/templates/templates_linux.go
    # ContainerdConfigTemplate) already declares [plugins."io.containerd.grpc.v1.cri"]: declaring it again is invalid
    # TOML and the real containerd refuses to start
    # (tests/real/test_containerd_real.py::test_k3s_template_toml_the_module_proposes_is_loaded)
    root = install_at(world_tmp, "k3s-v2", os.path.dirname(K3S_CONFIG))
    base = (root / K3S_CONFIG.lstrip("/")).read_text()
    with pytest.raises(GpuhardenError) as raised:
        _containerd.plan_runtime(_containerd.read_config_set(str(root), K3S_CONFIG), params(path=K3S_CONFIG), root=str(root))
    snippet = raised.value.msg.split("{{ template \"base\" . }}:\n", 1)[1]
    assert "[plugins.\"io.containerd.grpc.v1.cri\"]\n" not in snippet
    merged = tomllib.loads(base + "\n" + snippet)
    assert dig(merged, (*V2, "containerd", "runtimes", "nvidia", "options", "BinaryName")) == BINARY
    assert dig(merged, (*V2, "sandbox_image")) == "rancher/mirrored-pause:3.6"


# ---------------------------------------------------------------------------------------------
# what the real daemons taught (tests/real/test_containerd_real.py)

BARE_V2 = {
    "bare": "version = 2\n",
    "cri-without-runtimes": ("version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.9\"\n\n"
                             "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n"),
    "v3-bare": "version = 3\n",
}


@pytest.mark.parametrize("layout", sorted(BARE_V2))
def test_builtin_runc_is_made_explicit_when_no_file_defines_it(world_tmp, layout):
    # containerd 1.7 replaces its built-in runtimes with the file's runtimes table, so adding only nvidia loses runc and
    # the CRI plugin (default_runtime_name "runc"); runc is written with exactly the built-in settings, on every version
    root = install(world_tmp, files={CONFIG: BARE_V2[layout]})
    result = plan(root)
    cri = V3 if layout.startswith("v3") else V2
    after = tomllib.loads(result["changes"][0].after)
    runtimes = dig(after, (*cri, "containerd", "runtimes"))
    assert list(runtimes) == ["runc", "nvidia"]
    assert runtimes["runc"] == {"runtime_type": "io.containerd.runc.v2"}
    assert runtimes["nvidia"] == {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": BINARY}}
    assert result["base_runtime"] == "runc" and not any("SystemdCgroup" in warning for warning in result["warnings"])
    assert any("add runtime 'runc'" in action and "made explicit" in action for action in result["actions"])
    assert any("built-in one" in note and "runc" in note for note in result["notes"])
    apply(result)
    again = plan(root)
    assert again["changes"] == [] and again["notes"] == []


def test_builtin_runc_made_explicit_when_default_is_set_to_runc_but_undefined(world_tmp):
    text = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n"
    root = install(world_tmp, files={CONFIG: text})
    after = tomllib.loads(plan(root, set_as_default=True)["changes"][0].after)
    assert dig(after, (*V2, "containerd", "runtimes", "runc")) == {"runtime_type": "io.containerd.runc.v2"}
    assert dig(after, (*V2, "containerd", "default_runtime_name")) == "nvidia"


def test_builtin_runc_goes_into_the_winning_v2_section_and_the_module_reports_it(world_tmp):
    # 1.x reads only the last CRI section: runc must be there, next to nvidia
    main = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n"
    cri = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n"
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/conf.d/50-cri.toml": cri})
    result = run_module("containerd_nvidia_runtime", module_args(root), {})
    assert result["changed"] is True and result["runtime_file"] == "/etc/containerd/conf.d/50-cri.toml", result
    written = tomllib.loads((root / "etc/containerd/conf.d/50-cri.toml").read_text())
    assert set(dig(written, (*V2, "containerd", "runtimes"))) == {"runc", "nvidia"}
    assert any("runc" in note for note in result["notes"])


def set_toml(path: Path, keys, value) -> None:
    import tomlkit

    doc = tomlkit.parse(path.read_text())
    table = doc
    for key in keys[:-1]:
        table = table[key]
    table[keys[-1]] = value
    path.write_text(tomlkit.dumps(doc))


@pytest.mark.parametrize(("fixture", "cri"), [("v2-single.toml", V2), ("v3-single.toml", V3)])
def test_default_runtime_name_without_its_runtime_is_refused(world_tmp, fixture, cri):
    # containerd runs but its CRI plugin does not load (1.7 ValidatePluginConfig, 2.x ValidateRuntimeConfig; tests/real)
    root = install(world_tmp, fixture)
    set_toml(root / CONFIG.lstrip("/"), (*cri, "containerd", "default_runtime_name"), "nope")
    before = snapshot(root)
    result = run_module("containerd_nvidia_runtime", module_args(root, backup=True), {})
    assert result.get("failed") is True and snapshot(root) == before, result
    for fragment in (CONFIG, "default_runtime_name", "'nope'", "CRI plugin does not load"):
        assert fragment in result["msg"], (fragment, result["msg"])
    # set_as_default replaces it with the runtime being added: accepted
    assert plan(root, set_as_default=True)["desired"]["default_runtime_name"] == "nvidia"


def test_default_runtime_name_of_the_runtime_being_added_is_accepted(world_tmp):
    root = install(world_tmp, "v2-single.toml")
    set_toml(root / CONFIG.lstrip("/"), (*V2, "containerd", "default_runtime_name"), "nvidia")
    result = plan(root)
    assert result["changes"] and result["desired"]["default_runtime_name"] == "nvidia"


def test_v2_default_runtime_in_a_file_1x_does_not_read_is_refused(world_tmp):
    # 1.x keeps only the last CRI section: a runtime defined in an earlier file does not exist for it (2.x merges: it does)
    main = ("version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun]\n"
            "  runtime_type = \"io.containerd.runc.v2\"\n")
    cri = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"crun\"\n"
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/conf.d/50-cri.toml": cri})
    with pytest.raises(GpuhardenError) as raised:
        plan(root)
    assert raised.value.msg.startswith("/etc/containerd/conf.d/50-cri.toml: ")
    assert "containerd 1.x has (runc)" in raised.value.msg and "'crun'" in raised.value.msg


def test_enable_cdi_is_written_where_containerd_1x_may_read_the_files(world_tmp):
    root = install(world_tmp, "v2-single.toml")
    result = plan(root, enable_cdi=True)
    assert dig(tomllib.loads(result["changes"][0].after), (*V2, "enable_cdi")) is True
    assert result["desired"]["enable_cdi"] is True and result["notes"] == []


@pytest.mark.parametrize("fixture", ["v3-single.toml", "v4-single.toml"])
def test_enable_cdi_is_not_written_where_only_containerd_2x_reads_the_files(world_tmp, fixture):
    root = install(world_tmp, fixture)
    config = root / CONFIG.lstrip("/")
    config.write_text("\n".join(line for line in config.read_text().splitlines() if "enable_cdi" not in line) + "\n")
    result = plan(root, enable_cdi=True)
    assert "enable_cdi" not in result["changes"][0].after
    assert result["desired"]["enable_cdi"] is None
    assert any("enable_cdi is not written" in note and "2.4" in note for note in result["notes"])


def test_enable_cdi_false_is_corrected_for_containerd_2x(world_tmp):
    # containerd 2.0 to 2.3 honour an explicit false
    text = "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\n  enable_cdi = false\n"
    root = install(world_tmp, files={CONFIG: text})
    result = plan(root, enable_cdi=True)
    assert dig(tomllib.loads(result["changes"][0].after), (*V3, "enable_cdi")) is True
    assert result["desired"]["enable_cdi"] is True


@pytest.mark.parametrize(("program", "config"), [("k3s", K3S_CONFIG), ("rke2", RKE2_CONFIG)])
def test_k3s_set_as_default_names_the_distribution_flag_not_a_template_table(world_tmp, program, config):
    # the base template declares [plugins."io.containerd.grpc.v1.cri".containerd]: a template that declares it again is
    # refused by the real containerd; k3s/rke2 set default_runtime_name from --default-runtime (config.yaml default-runtime)
    root = install_at(world_tmp, "k3s-v2", os.path.dirname(config))
    generated = root / config.lstrip("/")
    generated.write_text(generated.read_text().replace("k3s", program))
    before = snapshot(root)
    result = run_module("containerd_nvidia_runtime", module_args(root, path=config, set_as_default=True), {})
    assert result.get("failed") is True and snapshot(root) == before, result
    message = result["msg"]
    assert "`default-runtime: nvidia`" in message and "/etc/rancher/%s/config.yaml" % program in message
    snippet = message.split("{{ template \"base\" . }}:\n", 1)[1]
    assert ".containerd]" not in snippet and "default_runtime_name" not in snippet
    assert "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]" in snippet


def test_k3s_default_only_missing_gives_no_template_toml(world_tmp):
    root = install_at(world_tmp, "k3s-v2", os.path.dirname(K3S_CONFIG))
    config = root / K3S_CONFIG.lstrip("/")
    config.write_text(config.read_text() + "\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.\"nvidia\"]\n"
                      "  runtime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.\"nvidia\".options]\n"
                      "  BinaryName = \"%s\"\n" % BINARY)
    with pytest.raises(GpuhardenError) as raised:
        _containerd.plan_runtime(_containerd.read_config_set(str(root), K3S_CONFIG), params(path=K3S_CONFIG, set_as_default=True),
                                 root=str(root))
    assert "default-runtime: nvidia" in raised.value.msg and "[plugins" not in raised.value.msg
    # what k3s renders with --default-runtime nvidia: the module then has nothing left to do
    config.write_text(config.read_text().replace("  snapshotter = \"overlayfs\"\n", "  snapshotter = \"overlayfs\"\n  default_runtime_name = \"nvidia\"\n"))
    again = _containerd.plan_runtime(_containerd.read_config_set(str(root), K3S_CONFIG), params(path=K3S_CONFIG, set_as_default=True),
                                     root=str(root))
    assert again["changes"] == []
