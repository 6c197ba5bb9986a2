# SPDX-License-Identifier: GPL-3.0-or-later
"""The real containerd is the judge: what containerd_nvidia_runtime writes, the real daemon loads with the nvidia
runtime; what the real daemon refuses to start with, the module refuses before writing.

Each case installs a config layout of tests/unit/test_containerd.py in a temp node root, runs the module there as
Ansible runs it, moves every host path of the result into the temp root (daemons.jail_containerd), starts the real
containerd (lab/realcomponents/build-containerd.sh) on it and asks its CRI plugin (RuntimeService.Status, verbose) which
runtimes it really has.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from gpuharden_lab import operatornode

from tests.real import daemons
from tests.unit.conftest import run_module
from tests.unit.test_containerd import BINARY, CONFIG, DROP_IN, K3S_CONFIG, RKE2_CONFIG, install, install_at, snapshot, toolkit

pytestmark = pytest.mark.real

VERSIONS = daemons.versions()
V2X = VERSIONS["CONTAINERD_VERSION"]  # containerd 2.x: config version 4 by default, reads 2 and 3 (migrated on load)
V1X = VERSIONS["CONTAINERD_1_VERSION"]  # containerd 1.7: config version 2


@pytest.fixture
def containerd(tmp_path, host_guard):
    """containerd(version, root, main, files) -> (daemon, socket); every daemon started is killed at teardown."""
    started = []

    def start(version, root, main, files):
        jailed = daemons.jail_containerd(root, main, files, version)
        daemon = daemons.start_containerd(version, jailed["config"], tmp_path / ("containerd-%d.log" % len(started)))
        started.append(daemon)
        return daemon, jailed["socket"]

    yield start
    for daemon in started:
        daemon.stop()


def module(root: Path, **args) -> dict:
    return run_module("containerd_nvidia_runtime", {"root": str(root), **args}, {})


def assert_runs_with_nvidia(containerd, version, root, result, binary=BINARY):
    """The real daemon starts on the module's files, answers ctr, and its CRI plugin has runc and nvidia as planned."""
    main = result["files"][0]
    daemon, sock = containerd(version, root, main, result["files"])
    assert daemons.wait_containerd(daemon, version, sock), "containerd %s did not answer:\n%s" % (version, daemon.text()[-4000:])
    answer = daemons.ctr_version(version, sock)
    assert answer.returncode == 0 and version.lstrip("v") in answer.stdout, answer
    status = daemons.cri_status(sock)
    runtimes = daemons.cri_runtimes(status)
    assert {"runc", "nvidia"} <= set(runtimes), (sorted(runtimes), daemon.text()[-3000:])
    nvidia = runtimes["nvidia"]
    assert nvidia["runtimeType"] == "io.containerd.runc.v2", nvidia
    assert nvidia["options"]["BinaryName"] == binary, nvidia
    if not version.startswith("v1."):
        # containerd 2.x reports its runtime handlers itself (the kubelet copies them into Node.status.runtimeHandlers)
        assert "nvidia" in status["runtimeHandlers"], status["runtimeHandlers"]
    assert daemon.returncode() is None, daemon.text()[-3000:]
    return status


# ---------------------------------------------------------------------------------------------
# every layout the module handles: the module's result is what the real daemon loads


LAYOUTS = [
    # (fixture, daemon version): containerd 1.7 reads v2 only; 2.x reads v2 (migrated), v3 and v4
    ("v2-single.toml", V1X),
    ("v2-single.toml", V2X),
    ("v2-comments.toml", V1X),
    ("v3-single.toml", V2X),
    ("v4-single.toml", V2X),
    ("v3-confd", V2X),
]


@pytest.mark.parametrize(("fixture", "version"), LAYOUTS, ids=["%s-containerd-%s" % case for case in LAYOUTS])
def test_module_result_is_loaded_by_the_real_daemon(world_tmp, containerd, fixture, version):
    root = install(world_tmp, fixture)
    result = module(root)
    assert result["changed"] is True and not result.get("failed"), result
    assert module(root)["changed"] is False
    assert_runs_with_nvidia(containerd, version, root, result)


def test_v3_confd_drop_in_is_merged_next_to_runc_by_the_real_daemon(world_tmp, containerd):
    # the drop-in holds only the nvidia runtime; 2.x merges plugin tables key by key, so runc from the main file stays
    root = install(world_tmp, "v3-confd")
    result = module(root)
    assert result["runtime_file"] == "/etc/containerd/conf.d/99-nvidia.toml" and len(result["changes"]) == 1
    status = assert_runs_with_nvidia(containerd, V2X, root, result)
    runtimes = daemons.cri_runtimes(status)
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is True


@pytest.mark.parametrize("version", [V1X, V2X])
def test_nvidia_ctk_v2_layout_the_module_accepts_is_what_the_daemon_runs(world_tmp, containerd, version):
    # main file: an old nvidia runtime (runtime.v1.linux, /usr/local/bin); drop-in: a full CRI section with the right
    # one. 1.7 takes the drop-in's CRI section whole, 2.x merges key by key: both end with the drop-in's values.
    root = install(world_tmp, "v2-nvidia-ctk")
    result = module(root)
    assert result["changed"] is False and not result.get("failed"), result
    assert_runs_with_nvidia(containerd, version, root, result)


@pytest.mark.parametrize("version", [V1X, V2X])
def test_v2_with_imports_runtime_where_the_cri_section_wins(world_tmp, containerd, version):
    main = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n"
    cri = ("version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\n"
           "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n")
    root = install(world_tmp, files={CONFIG: main, "/etc/containerd/conf.d/50-cri.toml": cri})
    result = module(root)
    assert result["runtime_file"] == "/etc/containerd/conf.d/50-cri.toml", result
    assert_runs_with_nvidia(containerd, version, root, result)


def test_rke2_v3_drop_in_is_loaded(world_tmp, containerd):
    root = install_at(world_tmp, "rke2-v3", str(Path(RKE2_CONFIG).parent))
    (root / RKE2_CONFIG.lstrip("/")).parent.joinpath("config-v3.toml.d").mkdir()
    result = module(root, path=RKE2_CONFIG)
    assert result["changed"] is True and result["generated_by"] == "rke2", result
    assert_runs_with_nvidia(containerd, V2X, root, result)


@pytest.mark.parametrize("version", [V1X, V2X])
def test_k3s_own_nvidia_runtime_the_module_accepts_is_what_the_daemon_runs(world_tmp, containerd, version):
    # what k3s appends when it finds nvidia-container-runtime (k3s pkg/agent/templates/templates_linux.go ExtraRuntimes;
    # a version-2 file, read by containerd 1.7 or migrated by 2.x)
    root = install_at(world_tmp, "k3s-v2", str(Path(K3S_CONFIG).parent))
    config = root / K3S_CONFIG.lstrip("/")
    binary = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
    config.write_text(config.read_text() + "\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.\"nvidia\"]\n"
                      "  runtime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.\"nvidia\".options]\n"
                      "  BinaryName = \"%s\"\n" % binary)
    (root / binary.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(root / BINARY.lstrip("/"), root / binary.lstrip("/"))
    result = module(root, path=K3S_CONFIG)
    assert result["changed"] is False and result["generated_by"] == "k3s", result
    assert_runs_with_nvidia(containerd, version, root, result, binary=binary)


@pytest.mark.parametrize("extra", [{}, {"set_as_default": True}], ids=["runtime", "set-as-default"])
def test_k3s_template_toml_the_module_proposes_is_loaded(world_tmp, containerd, extra):
    # the module never edits the generated file; the TOML its message gives for config.toml.tmpl, appended to the
    # generated file (what k3s renders from '{{ template "base" . }}' plus that TOML), is what the daemon loads.
    # The base template already declares [plugins."io.containerd.grpc.v1.cri".containerd] (k3s
    # pkg/agent/templates/templates_linux.go), so the TOML never declares it again (the daemon refuses a table declared
    # twice); the default runtime is k3s's own --default-runtime flag (k3s pkg/cli/cmds/agent.go DefaultRuntimeFlag),
    # which the message names as config.yaml's default-runtime.
    root = install_at(world_tmp / "node", "k3s-v2", str(Path(K3S_CONFIG).parent))
    before = snapshot(root)
    result = module(root, path=K3S_CONFIG, **extra)
    assert result.get("failed") is True and snapshot(root) == before, result
    snippet = k3s_template_snippet(result["msg"])
    assert ".containerd]" not in snippet and "default_runtime_name" not in snippet, snippet
    config = root / K3S_CONFIG.lstrip("/")
    config.write_text(config.read_text() + "\n" + snippet)
    if extra.get("set_as_default"):
        assert "`default-runtime: nvidia` in /etc/rancher/k3s/config.yaml" in result["msg"], result["msg"]
        # what k3s renders once config.yaml has default-runtime: nvidia: the key in the base's containerd table
        config.write_text(config.read_text().replace("  snapshotter = \"overlayfs\"\n",
                                                     "  snapshotter = \"overlayfs\"\n  default_runtime_name = \"nvidia\"\n", 1))
    # the judge first: the real daemon on the rendered file; then the module agrees that nothing is left to do
    checked = world_tmp / "module-view"
    shutil.copytree(root, checked, symlinks=True)
    status = assert_runs_with_nvidia(containerd, V1X, root, {"files": [K3S_CONFIG]})
    again = module(checked, path=K3S_CONFIG, **extra)
    assert again["changed"] is False and not again.get("failed"), again
    if extra.get("set_as_default"):
        assert status["info"]["config"]["containerd"]["defaultRuntimeName"] == "nvidia"


def k3s_template_snippet(message: str) -> str:
    """The TOML tables of the module's k3s message (the lines from the first '[plugins' table on)."""
    lines = message.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("[plugins"))
    body = []
    for line in lines[start:]:
        stripped = line.strip()
        if stripped and not (stripped.startswith("[") or "=" in stripped):
            break
        body.append(stripped)
    return "\n".join(body) + "\n"


# ---------------------------------------------------------------------------------------------
# what the real daemon refuses, the module refuses (clearly, before writing anything)

V2_BASE = "v2-single.toml"
V3_BASE = "v3-single.toml"
V2_CRI = ("plugins", "io.containerd.grpc.v1.cri")
V3_CRI = ("plugins", "io.containerd.cri.v1.runtime")
BAD_V2 = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc\n  runtime_type = 1\n"
BAD_V3 = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc\n  runtime_type = 1\n"
NOPE = ["/etc/containerd/nope.toml"]
REJECTED = {
    # case: (base fixture, daemon version, defect applied to the main file, what the daemon says (regex; its
    #        config loader: 1.7 pelletier/go-toml v1, 2.x go-toml/v2 strict decoding), module message fragments)
    "bad-toml-1.7": (V2_BASE, V1X, ("append", BAD_V2), r"failed to load TOML: .*unclosed table key", [CONFIG, "invalid TOML"]),
    "bad-toml-2.x": (V3_BASE, V2X, ("append", BAD_V3), r"failed to unmarshal TOML at row \d+ column \d+", [CONFIG, "invalid TOML"]),
    "runtimes-string-1.7": (V2_BASE, V1X, ("set", (*V2_CRI, "containerd", "runtimes"), "runc"), r"Can't convert runc\(string\) to map",
                            [CONFIG, "runtimes", "'runc'", "must be a table"]),
    "runtimes-string-2.x": (V3_BASE, V2X, ("set", (*V3_CRI, "containerd", "runtimes"), "runc"), r"ContainerdConfig\.Runtimes of type map",
                            [CONFIG, "runtimes", "'runc'", "must be a table"]),
    "runtime-type-number-1.7": (V2_BASE, V1X, ("set", (*V2_CRI, "containerd", "runtimes", "runc", "runtime_type"), 5),
                                r"Can't convert 5\(int64\) to string", [CONFIG, "runc.runtime_type", "5", "string"]),
    "runtime-type-number-2.x": (V3_BASE, V2X, ("set", (*V3_CRI, "containerd", "runtimes", "runc", "runtime_type"), 5),
                                r"config\.Runtime\.Type of type string", [CONFIG, "runc.runtime_type", "5", "string"]),
    "options-string-2.x": (V3_BASE, V2X, ("set", (*V3_CRI, "containerd", "runtimes", "runc", "options"), "SystemdCgroup"),
                           r"config\.Runtime\.Options of type map", [CONFIG, "runc.options", "'SystemdCgroup'"]),
    "default-runtime-number-1.7": (V2_BASE, V1X, ("set", (*V2_CRI, "containerd", "default_runtime_name"), 5),
                                   r"Can't convert 5\(int64\) to string", [CONFIG, "default_runtime_name", "5", "string"]),
    "default-runtime-number-2.x": (V3_BASE, V2X, ("set", (*V3_CRI, "containerd", "default_runtime_name"), 5),
                                   r"DefaultRuntimeName of type string", [CONFIG, "default_runtime_name", "5", "string"]),
    "missing-literal-import-1.7": (V2_BASE, V1X, ("set", ("imports",), NOPE), r"nope\.toml: no such file or directory",
                                   [CONFIG, "imports", "/etc/containerd/nope.toml"]),
    "missing-literal-import-2.x": (V3_BASE, V2X, ("set", ("imports",), NOPE), r"nope\.toml: no such file or directory",
                                   [CONFIG, "imports", "/etc/containerd/nope.toml"]),
    "imports-string-1.7": (V2_BASE, V1X, ("set", ("imports",), "/etc/containerd/conf.d/*.toml"), r"to \[\]string",
                           [CONFIG, "imports", "array"]),
    "imports-string-2.x": (V3_BASE, V2X, ("set", ("imports",), "/etc/containerd/conf.d/*.toml"), r"config\.Config\.Imports of type \[\]string",
                           [CONFIG, "imports", "array"]),
    "version-5-1.7": (V2_BASE, V1X, ("set", ("version",), 5), r"unsupported config version `5`", [CONFIG, "version = 5"]),
    "version-5-2.x": (V3_BASE, V2X, ("set", ("version",), 5), r"equal to or less than `4`, got `5`", [CONFIG, "version = 5"]),
}


def apply_defect(path: Path, defect) -> None:
    import tomlkit

    if defect[0] == "append":
        path.write_text(path.read_text() + "\n" + defect[1])
        return
    doc = tomlkit.parse(path.read_text())
    container = doc
    for key in defect[1][:-1]:
        container = container[key]
    container[defect[1][-1]] = defect[2]
    path.write_text(tomlkit.dumps(doc))


def daemon_on_defect(tmp_path: Path, fixture: str, version: str, defect, wait: float = 30):
    """The real daemon on the base layout moved off the host, then the defect: (exit code or None, log, daemon)."""
    daemon_root = tmp_path / "daemon"
    install(daemon_root, fixture)
    jailed = daemons.jail_containerd(daemon_root, CONFIG, [CONFIG], version)
    if defect[0] == "set" and defect[1] == ("imports",) and isinstance(defect[2], list):
        defect = ("set", ("imports",), [str(daemon_root) + item for item in defect[2]])  # keep the import inside the root
    apply_defect(jailed["config"], defect)
    daemon = daemons.start_containerd(version, jailed["config"], tmp_path / "containerd.log")
    return daemon, jailed["socket"], daemon.wait_exit(wait)


def module_on_defect(world_tmp: Path, fixture: str, defect, **args):
    root = install(world_tmp, fixture)
    apply_defect(root / CONFIG.lstrip("/"), defect)
    before = snapshot(root)
    result = module(root, backup=True, **args)
    return result, snapshot(root) == before


@pytest.mark.parametrize("case", sorted(REJECTED))
def test_what_the_real_daemon_rejects_the_module_refuses(tmp_path, world_tmp, host_guard, case):
    fixture, version, defect, said, fragments = REJECTED[case]
    daemon, _sock, rc = daemon_on_defect(tmp_path, fixture, version, defect)
    daemon.stop()
    log = daemon.text()
    assert rc is not None and rc != 0, "containerd %s kept running (rc %s) with %s:\n%s" % (version, rc, case, log[-3000:])
    assert re.search(said, log), (case, log[-2000:])
    result, untouched = module_on_defect(world_tmp, fixture, defect)
    assert result.get("failed") is True, (case, log[-2000:], result)
    for fragment in fragments:
        assert fragment in result["msg"], (fragment, result["msg"])
    assert untouched


# The module is deliberately stricter than the daemon here: it refuses input the daemon starts with.
STRICTER = {
    # containerd 2.x still migrates version 1 (v2.4.2 cmd/containerd/server/config/config.go migrations: v1Migrate);
    # the module refuses to edit a version-1 file and asks for `containerd config migrate` first.
    "version-1-2.x": (V2_BASE, V2X, ("set", ("version",), 1), [CONFIG, "version = 1", "migrate it first"]),
    # containerd 2.4 removed enable_cdi (RELEASES.md deprecation table: CDI is always enabled) and ignores the key
    # with a warning whatever its type; the module still type-checks it.
    "enable-cdi-string-2.x": (V3_BASE, V2X, ("set", (*V3_CRI, "enable_cdi"), "yes"), [CONFIG, "enable_cdi", "'yes'", "boolean"]),
}


@pytest.mark.parametrize("case", sorted(STRICTER))
def test_module_refuses_what_the_real_daemon_still_starts_with(tmp_path, world_tmp, host_guard, case):
    fixture, version, defect, fragments = STRICTER[case]
    daemon, sock, rc = daemon_on_defect(tmp_path, fixture, version, defect, wait=2)
    try:
        assert rc is None and daemons.wait_containerd(daemon, version, sock), daemon.text()[-3000:]
        assert "runc" in daemons.cri_runtimes(daemons.cri_status(sock))
    finally:
        daemon.stop()
    result, untouched = module_on_defect(world_tmp, fixture, defect, enable_cdi=case.startswith("enable-cdi"))
    assert result.get("failed") is True and untouched, result
    for fragment in fragments:
        assert fragment in result["msg"], (fragment, result["msg"])


@pytest.mark.parametrize("version", [V1X, V2X])
def test_default_runtime_name_without_its_runtime(tmp_path, world_tmp, host_guard, containerd, version):
    # default_runtime_name naming no runtime keeps containerd running but its CRI plugin does not load (1.7
    # pkg/cri/config/config.go ValidatePluginConfig, 2.x internal/cri/config/config.go ValidateRuntimeConfig), so the
    # kubelet has no runtime: the module refuses, naming the file, the field and the value, and writes nothing
    fixture, cri = (V2_BASE, V2_CRI) if version == V1X else (V3_BASE, V3_CRI)
    defect = ("set", (*cri, "containerd", "default_runtime_name"), "nope")
    daemon, sock, rc = daemon_on_defect(tmp_path, fixture, version, defect, wait=2)
    try:
        assert rc is None and daemons.wait_containerd(daemon, version, sock), daemon.text()[-3000:]
        answer = subprocess.run([str(daemons.cri_status_bin()), "-endpoint", "unix://%s" % sock, "-timeout", "5s"],
                                capture_output=True, text=True, timeout=15, check=False)
    finally:
        daemon.stop()
    assert answer.returncode != 0 and "unknown service runtime.v1.RuntimeService" in answer.stderr, answer
    assert re.search(r"no corresponding runtime configured in `containerd.runtimes`.*default_runtime_name = \\\"nope", daemon.text())
    result, untouched = module_on_defect(world_tmp, fixture, defect)
    assert result.get("failed") is True and untouched, result
    for fragment in (CONFIG, "default_runtime_name", "'nope'", "CRI plugin does not load"):
        assert fragment in result["msg"], (fragment, result["msg"])
    # set_as_default makes it name the runtime being added: the daemon then loads its CRI plugin with nvidia as default
    fixed_root = world_tmp / "set-as-default"
    install(fixed_root, fixture)
    apply_defect(fixed_root / CONFIG.lstrip("/"), defect)
    fixed = module(fixed_root, set_as_default=True)
    assert fixed["changed"] is True and not fixed.get("failed"), fixed
    status = assert_runs_with_nvidia(containerd, version, fixed_root, fixed)
    assert status["info"]["config"]["containerd"]["defaultRuntimeName"] == "nvidia"


@pytest.mark.parametrize("fixture", ["v3-single.toml", "v4-single.toml"])
def test_enable_cdi_is_not_written_where_containerd_2x_ignores_it(world_tmp, containerd, fixture):
    # containerd 2.4 removed enable_cdi (RELEASES.md deprecation table: deprecated v2.2, removed v2.4, CDI always
    # enabled) and ignores it with 'Ignoring unknown key'; 2.0 to 2.3 enable CDI by default: a version-3/4 set (read
    # only by 2.x) gets no enable_cdi, and the module says why
    root = install(world_tmp, fixture)
    config = root / CONFIG.lstrip("/")
    config.write_text("\n".join(line for line in config.read_text().splitlines() if "enable_cdi" not in line) + "\n")
    result = module(root, enable_cdi=True)
    assert not result.get("failed") and "enable_cdi" not in " ".join(result["actions"]), result
    assert any("enable_cdi is not written" in note for note in result["notes"]), result
    assert module(root, enable_cdi=True)["changed"] is False
    daemon, sock = containerd(V2X, root, result["files"][0], result["files"])
    assert daemons.wait_containerd(daemon, V2X, sock), daemon.text()[-3000:]
    assert "key=enable_cdi" not in daemon.text(), [line for line in daemon.text().splitlines() if "enable_cdi" in line]
    assert "nvidia" in daemons.cri_runtimes(daemons.cri_status(sock))


def test_enable_cdi_is_written_and_read_by_containerd_17(world_tmp, containerd):
    # containerd 1.7 has CDI off by default (pkg/cri/config/config_unix.go DefaultConfig EnableCDI false)
    root = install(world_tmp, "v2-single.toml")
    config = root / CONFIG.lstrip("/")
    config.write_text("\n".join(line for line in config.read_text().splitlines() if "enable_cdi" not in line) + "\n")
    result = module(root, enable_cdi=True)
    assert "enable_cdi" in " ".join(result["actions"]) and result["notes"] == [], result
    status = assert_runs_with_nvidia(containerd, V1X, root, result)
    assert status["info"]["config"]["enableCDI"] is True, status["info"]["config"].get("enableCDI")


@pytest.mark.parametrize("version", [V1X, V2X])
def test_the_gpu_operators_toolkit_layout_is_what_the_daemon_runs_and_the_module_leaves_it_alone(world_tmp, containerd, version):
    # Issue 43 item 4: the drop-in the GPU Operator's toolkit container writes over the release's own default config
    # (lab operatornode.py, from nvidia-container-toolkit v1.20.0 cmd/nvidia-ctk-installer: a copy of the CRI section,
    # the runtimes nvidia, nvidia-cdi and nvidia-legacy under /usr/local/nvidia/toolkit, enable_cdi), and the import of
    # conf.d the installer adds to a config without one (1.7's default; 2.4's has it).  The real daemon runs the three
    # runtimes; the module changes nothing there and says why.
    main = subprocess.run([str(daemons.containerd_bin(version)), "config", "default"], capture_output=True, text=True, check=True).stdout
    root = install(world_tmp, files={CONFIG: operatornode.with_import(main), DROP_IN: operatornode.drop_in(main)})
    for _name, binary in operatornode.RUNTIMES:
        toolkit(root, "%s/%s" % (operatornode.TOOLKIT_DIR, binary))
    before = snapshot(root)
    result = module(root)
    assert result["changed"] is False and not result.get("failed") and len(result["refused"]) == 1, result
    assert "container toolkit owns it" in result["refused"][0]["why"], result
    assert snapshot(root) == before
    daemon, sock = containerd(version, root, CONFIG, result["files"])
    assert daemons.wait_containerd(daemon, version, sock), daemon.text()[-3000:]
    status = daemons.cri_status(sock)
    runtimes = daemons.cri_runtimes(status)
    for name, binary in operatornode.RUNTIMES:
        assert runtimes[name]["options"]["BinaryName"] == "%s/%s" % (operatornode.TOOLKIT_DIR, binary), (name, runtimes.get(name))
    assert "runc" in runtimes and status["info"]["config"]["containerd"]["defaultRuntimeName"] == "runc"
    if version == V1X:  # the toolkit's enable_cdi; 2.4 has CDI on always
        assert status["info"]["config"]["enableCDI"] is True, status["info"]["config"].get("enableCDI")


BARE_V2 = {
    "bare": "version = 2\n",
    "cri-without-runtimes": ("version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.9\"\n\n"
                             "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  snapshotter = \"overlayfs\"\n"),
}
@pytest.mark.parametrize("version", [V1X, V2X])
@pytest.mark.parametrize("layout", sorted(BARE_V2))
def test_v2_file_without_runtimes_keeps_a_working_cri_plugin(tmp_path, world_tmp, containerd, layout, version):
    # a version-2 file that defines no runtimes runs on the daemon's built-in runc. Once a runtime is added, 1.7 decodes
    # the file's runtimes table in place of its defaults (pkg/cri/config/config_unix.go DefaultConfig has runc;
    # services/server/config/config.go Decode, go-toml v1 replaces the map) and ValidatePluginConfig refuses
    # default_runtime_name = "runc": the module writes runc explicitly with the built-in settings. 2.x merges the tables
    # and keeps runc anyway; the explicit runc is harmless there (one rule for every version).
    # before: the daemon runs its built-in runc
    before_root = install(tmp_path / "before", files={CONFIG: BARE_V2[layout]})
    daemon, sock = containerd(version, before_root, CONFIG, [CONFIG])
    assert daemons.wait_containerd(daemon, version, sock), daemon.text()[-3000:]
    assert "runc" in daemons.cri_runtimes(daemons.cri_status(sock))
    daemon.stop()
    # after the module: still runc, and nvidia
    root = install(world_tmp, files={CONFIG: BARE_V2[layout]})
    result = module(root)
    assert result["changed"] is True and not result.get("failed"), result
    assert any("built-in" in note for note in result["notes"]), result
    status = assert_runs_with_nvidia(containerd, version, root, result)
    runc = daemons.cri_runtimes(status)["runc"]
    assert runc["runtimeType"] == "io.containerd.runc.v2" and not (runc.get("options") or {}).get("SystemdCgroup"), runc
    assert status["info"]["config"]["containerd"]["defaultRuntimeName"] == "runc"
