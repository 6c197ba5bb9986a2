# SPDX-License-Identifier: GPL-3.0-or-later
"""containerd_nvidia_runtime on hostile input (issue 47 phase 2): special files, links, bounds, inline tables.

Each case either refuses in one line naming the file (nothing on the node changes) or succeeds with a file the
containerd loader would read the same; the real loader's verdict on the written files is the fuzz harness's
(tests/fuzz/validators.py runs containerd 2.4.2 and 1.7.35) and tests/real/test_containerd_real.py's.
"""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _containerd

from tests.unit.conftest import run_module
from tests.unit.test_containerd import CONFIG, DROP_IN, V2, apply, dig, install, module_args, plan, snapshot

CRI_RUNTIMES = V2 + ("containerd", "runtimes")
INLINE_V2 = """# containerd 1.7, every plugin as one inline table
version = 2
root = "/var/lib/containerd"
plugins = {"io.containerd.grpc.v1.cri" = {sandbox_image = "registry.k8s.io/pause:3.9", containerd = {default_runtime_name = "runc", \
runtimes = {runc = {runtime_type = "io.containerd.runc.v2", options = {SystemdCgroup = true}}}}}} # kept with its table
oom_score = 0

[grpc]
  address = "/run/containerd/containerd.sock"
"""
CONFD_MAIN = 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n'


def refused(root: Path, fragments, **overrides):
    with pytest.raises(GpuhardenError) as raised:
        plan(root, **overrides)
    message = raised.value.msg
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# ---------------------------------------------------------------------------------------------------------------
# inline tables: converted to standard tables on the edited path, every value and the comment kept


def test_plugins_as_an_inline_table_becomes_standard_tables_with_every_value_kept(world_tmp):
    root = install(world_tmp, files={CONFIG: INLINE_V2})
    result = plan(root)
    assert [Path(change.path) for change in result["changes"]] == [root / CONFIG.lstrip("/")]
    after = result["changes"][0].after
    written, before = tomllib.loads(after), tomllib.loads(INLINE_V2)
    assert dig(written, CRI_RUNTIMES + ("nvidia",)) == {
        "runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": True, "BinaryName": "/usr/bin/nvidia-container-runtime"}}
    del dig(written, CRI_RUNTIMES)["nvidia"]
    assert written == before  # nothing else changed, root-level keys stay root-level keys
    assert '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]' in after
    assert "# kept with its table" in after
    apply(result)
    assert plan(root)["changes"] == []  # idempotent on the converted file


def test_an_inline_runtime_table_that_differs_is_corrected_as_a_standard_table(world_tmp):
    text = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes]\n'
            'runc = {runtime_type = "io.containerd.runc.v2"}\n'
            'nvidia = {runtime_type = "io.containerd.runc.v2", options = {BinaryName = "/old/nvidia-container-runtime"}}\n')
    root = install(world_tmp, files={CONFIG: text})
    result = plan(root)
    written = tomllib.loads(result["changes"][0].after)
    assert dig(written, CRI_RUNTIMES + ("nvidia", "options", "BinaryName")) == "/usr/bin/nvidia-container-runtime"
    assert dig(written, CRI_RUNTIMES + ("runc",)) == {"runtime_type": "io.containerd.runc.v2"}


def test_the_module_writes_the_inline_layout_and_the_second_run_changes_nothing(world_tmp):
    install(world_tmp, files={CONFIG: INLINE_V2})
    first = run_module("containerd_nvidia_runtime", module_args(world_tmp), {})
    assert first["changed"] is True and not first.get("failed"), first
    again = run_module("containerd_nvidia_runtime", module_args(world_tmp), {})
    assert again["changed"] is False, again


# ---------------------------------------------------------------------------------------------------------------
# special files: containerd opens every import and glob match (config.go loadConfigFile); refused, never opened


def test_a_glob_match_that_is_a_fifo_is_refused_without_blocking(world_tmp):
    root = install(world_tmp, files={CONFIG: CONFD_MAIN})
    (root / "etc/containerd/conf.d").mkdir()
    os.mkfifo(root / "etc/containerd/conf.d/10-registry.toml")
    started = time.monotonic()
    message = refused(root, ["/etc/containerd/conf.d/10-registry.toml: is a FIFO (named pipe)",
                             "loaded by %s imports[0] = '/etc/containerd/conf.d/*.toml'" % CONFIG])
    assert time.monotonic() - started < 5, message


def test_a_glob_match_that_is_a_directory_is_refused(world_tmp):
    root = install(world_tmp, files={CONFIG: CONFD_MAIN})
    (root / "etc/containerd/conf.d/10-registry.toml").mkdir(parents=True)
    refused(root, ["10-registry.toml", "is a directory", "imports[0]"])


def test_a_main_config_that_is_a_fifo_is_refused(world_tmp):
    root = install(world_tmp)
    os.mkfifo(root / CONFIG.lstrip("/"))
    refused(root, ["config.toml", "is a FIFO (named pipe)"])


# ---------------------------------------------------------------------------------------------------------------
# links and "..": resolved inside the root, as the node sees its files; nothing outside it is read


@pytest.fixture
def outside(world_tmp):
    """A directory beside the node root holding a config containerd would accept: it must never be read."""
    place = world_tmp / "outside"
    (place / "etc/containerd/conf.d").mkdir(parents=True)
    (place / "etc/containerd/conf.d/50-outside.toml").write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\nenable_cdi = false\n')
    return place


def test_a_config_linked_out_of_the_root_is_read_inside_it(world_tmp, outside):
    root = install(world_tmp / "root")
    (outside / "config.toml").write_text(CONFD_MAIN)
    os.symlink(str(outside / "config.toml"), root / CONFIG.lstrip("/"))
    refused(root, [CONFIG, "is a symbolic link to", "not a file on the node"])


def test_an_import_directory_linked_out_of_the_root_lists_nothing_outside(world_tmp, outside):
    root = install(world_tmp / "root", files={CONFIG: CONFD_MAIN})
    os.symlink(str(outside / "etc/containerd/conf.d"), root / "etc/containerd/conf.d")
    files = _containerd.read_config_set(str(root), CONFIG)
    assert [config.path for config in files] == [CONFIG]  # the link's target inside the root does not exist


def test_an_import_directory_linked_absolutely_inside_the_root_is_followed_there(world_tmp, outside):
    root = install(world_tmp / "root", files={CONFIG: CONFD_MAIN, "/srv/confd/20-site.toml": "version = 3\n"})
    os.symlink(str(outside / "etc/containerd/conf.d"), root / "srv/confd/50-outside.toml")
    os.symlink("/srv/confd", root / "etc/containerd/conf.d")  # absolute: the node's /srv/confd, not this machine's
    refused(root, ["50-outside.toml", "imports[0]"])  # the match is a link to a directory that is not on the node


def test_an_import_climbing_out_with_dotdot_stays_in_the_root(world_tmp, outside):
    climb = "../" * 12 + str(outside).lstrip("/") + "/etc/containerd/conf.d/50-outside.toml"
    root = install(world_tmp / "root", files={CONFIG: 'version = 3\nimports = ["%s"]\n' % climb})
    refused(root, ["does not exist", "imports[0]"])


def test_a_relative_link_climbing_out_of_the_root_is_read_inside_it(world_tmp, outside):
    root = install(world_tmp / "root", files={CONFIG: 'version = 3\nimports = ["/etc/containerd/site.toml"]\n'})
    os.symlink("../" * 12 + str(outside).lstrip("/") + "/etc/containerd/conf.d/50-outside.toml", root / "etc/containerd/site.toml")
    refused(root, ["/etc/containerd/site.toml", "is a symbolic link to"])


# ---------------------------------------------------------------------------------------------------------------
# size: a stated bound, refused at once


def test_a_config_larger_than_the_bound_is_refused_at_once(world_tmp):
    body = "".join("k%d = %d\n" % (index, index) for index in range(100000))
    root = install(world_tmp, files={CONFIG: "version = 2\n[generated]\n" + body})
    # this process's CPU, not the wall clock: a loaded machine (CI, lab streams) stretches the wall time, not the work
    started = time.process_time()
    refused(root, [CONFIG + ": larger than %d bytes" % _containerd.MAX_CONFIG_BYTES, "(option path)"])
    assert time.process_time() - started < 5


def test_a_config_just_under_the_bound_is_planned_in_seconds(world_tmp):
    root = install(world_tmp, "v2-single.toml")
    lines, size, index = [], len((root / CONFIG.lstrip("/")).read_bytes()) + 100, 0
    while size < _containerd.MAX_CONFIG_BYTES - 4096:  # room for the runtime the plan adds
        line = "k%d = %d\n" % (index, index)
        lines.append(line)
        size += len(line)
        index += 1
    with open(root / CONFIG.lstrip("/"), "a", encoding="utf-8") as handle:
        handle.write("\n[generated]\n" + "".join(lines))
    started = time.process_time()
    assert plan(root)["changes"]
    # 52 s of wall time at load 40 on 2 cores: the planner's own CPU is what a quadratic parse would blow up
    assert time.process_time() - started < 20


# ---------------------------------------------------------------------------------------------------------------
# the write: links and immutable files refused before anything is written


def test_a_drop_in_that_is_a_link_is_refused_and_nothing_is_written(world_tmp):
    root = install(world_tmp, "v3-confd")
    (root / "etc/containerd/site-nvidia.toml").write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
                                                         'runtime_type = "io.containerd.runc.v1"\n')
    os.symlink("../site-nvidia.toml", root / DROP_IN.lstrip("/"))
    before = snapshot(root)
    result = run_module("containerd_nvidia_runtime", module_args(root), {})
    assert result.get("failed") is True, result
    assert "99-nvidia.toml: is a symbolic link (to ../site-nvidia.toml): gpuharden does not write through links" in result["msg"]
    assert "\n" not in result["msg"]
    assert snapshot(root) == before


def test_an_immutable_config_is_refused_before_any_write(world_tmp):
    root = install(world_tmp, "v2-single.toml")
    target = root / CONFIG.lstrip("/")
    if subprocess.run(["chattr", "+i", str(target)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i is not possible here")
    try:
        before = snapshot(root)
        result = run_module("containerd_nvidia_runtime", module_args(root), {})
        assert result.get("failed") is True, result
        assert "the file is immutable (chattr +i)" in result["msg"] and "\n" not in result["msg"]
        assert snapshot(root) == before
        assert sorted(path.name for path in target.parent.iterdir()) == ["config.toml"]  # no temporary file
    finally:
        subprocess.run(["chattr", "-i", str(target)], capture_output=True, check=False)


# ---------------------------------------------------------------------------------------------------------------
# errors: file, field and value first, in TOML's words


@pytest.mark.parametrize(("value", "shown"), [("1979-05-27T07:32:00Z", "date-time 1979-05-27T07:32:00+00:00"),
                                              ("1979-05-27", "date 1979-05-27"), ("07:32:00", "time 07:32:00")])
def test_a_date_where_a_table_belongs_is_named_in_toml_words(world_tmp, value, shown):
    root = install(world_tmp, files={CONFIG: 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\ncontainerd = %s\n' % value})
    message = refused(root, [CONFIG, 'plugins."io.containerd.grpc.v1.cri".containerd must be a table, got ' + shown])
    assert "datetime" not in message and "DateTime" not in message


def test_a_grpc_section_of_another_type_is_named(world_tmp):
    root = install(world_tmp, "v2-single.toml")
    text = (root / CONFIG.lstrip("/")).read_text().replace("[grpc]\n", "grpc = 5\n[unused]\n")
    (root / CONFIG.lstrip("/")).write_text(text)
    with pytest.raises(GpuhardenError) as raised:
        _containerd.decide(dict(params_for_decide(root)))
    assert raised.value.msg.startswith("%s: grpc must be a table, got integer 5" % CONFIG), raised.value.msg


def params_for_decide(root):
    values = {key: spec.get("default") for key, spec in _containerd.argument_spec().items()}
    values.update(root=str(root), path=CONFIG, drop_in=DROP_IN)
    return values


def test_a_runtime_written_as_dotted_keys_is_refused_in_one_line(world_tmp):
    text = ('version = 2\nplugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.runtime_type = "io.containerd.runc.v2"\n'
            'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options.SystemdCgroup = true\n')
    root = install(world_tmp, files={CONFIG: text})
    refused(root, [CONFIG + ": plugins is written as dotted keys", "[plugins] table header", "nothing was changed"])
