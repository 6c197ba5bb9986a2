#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: containerd_nvidia_runtime
short_description: Ensure containerd has the NVIDIA container runtime
version_added: 0.1.0
description:
  - Ensures containerd's CRI plugin has a runtime named O(runtime_name) with C(runtime_type = "io.containerd.runc.v2")
    and C(options.BinaryName) set to the NVIDIA container runtime, its other options copied from the existing
    O(base_runtime) runtime (so C(SystemdCgroup) matches what the kubelet uses), as C(nvidia-ctk runtime configure) does.
  - Reads the main config and every file its C(imports) load, as containerd does, before deciding anything. An import
    containing C(*) is a Go C(filepath.Glob) (C(*) does not cross C(/), dot files match, matches sorted); any other
    import is a literal path that must exist. Relative imports are relative to the importing file's directory
    (containerd 2.x, 1.7.16+, 1.6.29+); a relative glob in a version-2 config that older containerd 1.x (which globbed
    from its working directory, C(/) under systemd) would read differently is refused; write it as an absolute path.
  - Config C(version = 3) and C(version = 4) (containerd 2.x; 4 is the default from 2.3) use
    C(plugins."io.containerd.cri.v1.runtime"); containerd 2.x migrates each file on load and merges plugin tables key
    by key, so a v2 main file importing a v3 drop-in, and drop-ins without C(version), are read as the daemon reads
    them. A new runtime goes into O(drop_in) when an import glob really loads it (the layout C(nvidia-ctk) 1.18 and
    later writes), otherwise into the same file name in the directory of a C(<dir>/<glob>) import, otherwise into
    the main file.
  - Config C(version = 2) (C(plugins."io.containerd.grpc.v1.cri")) may run on containerd 1.x, which replaces a whole
    plugin section with that of the last file defining it, or on 2.x, which merges; the runtime must be right under
    both readings and goes into the file whose CRI section wins, never into a drop-in that would wipe the other CRI
    settings. The layout C(nvidia-ctk runtime configure) leaves (an old C(nvidia) runtime in the main file plus a
    drop-in holding a full copy of the CRI section) is recognised as correct.
  - When no file defines the default runtime (C(runc), which containerd has built in), C(runc) is written explicitly
    next to the new runtime with exactly the built-in settings (C(runtime_type = "io.containerd.runc.v2"), no
    options), because containerd 1.x replaces its built-in runtimes with the file's C(runtimes) table once a runtime
    is added and its CRI plugin would no longer load; containerd 2.x merges it with the built-in one. RV(notes) says so.
  - A runtime that is already defined correctly is left alone; one that differs is corrected in the file whose value
    containerd uses; the runtime is never defined twice.
  - Config C(version = 1) or no C(version) key is refused with a clear message (migrate it first).
  - The runtime's C(BinaryName) must be an executable file on the node; otherwise the module fails without changing
    anything (or warns, see O(on_missing_runtime_binary)); install the NVIDIA container toolkit.
  - k3s and rke2 regenerate C(/var/lib/rancher/<k3s|rke2>/agent/etc/containerd/config.toml) at every start. That file
    is read, never written; the C(nvidia) runtime they add by themselves when they find C(nvidia-container-runtime) is
    accepted as it is; a drop-in goes where the generated file's C(imports) load it; any other change fails with the
    template to use (C(config.toml.tmpl), or C(config-v3.toml.tmpl) for a version-3 file) and the TOML to put there.
  - Where the NVIDIA GPU Operator's container toolkit owns the runtime (O(gpu_operator.toolkit), a runtime whose
    C(BinaryName) lies under O(gpu_operator.toolkit_dir), as the toolkit's drop-in C(/etc/containerd/conf.d/99-nvidia.toml)
    writes them, or the toolkit's runtime binary there), the module changes nothing, not even with a wrong C(BinaryName),
    and returns RV(refused) with a warning, as the toolkit rewrites its drop-in whenever its pod starts. C(container_runtime)
    in O(gpu_operator.takeover) makes it act anyway, with a warning.
  - Restarts containerd only with O(restart); otherwise RV(restart_required) says when a restart is needed.
  - With O(restart=if_required), after writing, the module runs C(systemctl restart) O(service) and polls every quarter
    second, in the same run, until systemd calls the service active and containerd serves again - its gRPC socket
    (the address the config sets, else C(/run/containerd/containerd.sock)) is created anew and accepts a connection -
    or O(ready_timeout) seconds pass. Where no socket was there before the restart, the service must instead stay
    active for 2 seconds. A containerd that does not come back gets its files as they were before this run back
    (files it created are removed) and is restarted once more, waited on the same way (RV(rollback)); the module
    fails nothing itself - the caller fails the host (role C(gpuharden.k8s.container_runtime) does). Nothing restarts
    in check mode.
author:
  - gpuharden maintainers (@gpuharden)
extends_documentation_fragment:
  - gpuharden.k8s._attributes
  - gpuharden.k8s._attributes.node_root
  - gpuharden.k8s._files
  - gpuharden.k8s._gpu_operator
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  path:
    description: containerd's main configuration file, as a path on the node.
    type: path
    default: /etc/containerd/config.toml
  runtime_name:
    description:
      - Name of the runtime, which is also the C(handler) a RuntimeClass must use. A DNS label.
    type: str
    default: nvidia
  binary_name:
    description: The OCI runtime binary containerd's runc shim runs for this runtime (C(options.BinaryName)).
    type: path
    default: /usr/bin/nvidia-container-runtime
  runtime_type:
    description: The containerd shim of the runtime.
    type: str
    default: io.containerd.runc.v2
  base_runtime:
    description:
      - The runtime whose table and options are copied into a new runtime, and whose options an existing runtime must
        match. When it does not exist, the runtime named by C(default_runtime_name) is used; without either the
        runtime gets only C(runtime_type) and C(BinaryName), with a warning.
    type: str
    default: runc
  set_as_default:
    description:
      - Make the runtime containerd's C(default_runtime_name), where that key is set (or next to the runtime).
      - V(false) leaves C(default_runtime_name) as it is; a C(default_runtime_name) that names no runtime (containerd
        then runs without its CRI plugin) fails, naming the file, the field and the value, and nothing is changed.
      - On k3s and rke2 the generated config is not edited; the module fails and names the key to set instead,
        C(default-runtime) in C(/etc/rancher/<k3s|rke2>/config.yaml) (their C(--default-runtime) flag).
    type: bool
    default: false
  enable_cdi:
    description:
      - Set C(enable_cdi = true) in the CRI plugin section where containerd 1.x may read the files (a config
        C(version = 2) set); containerd 1.7 has CDI off by default.
      - Files only containerd 2.x reads (C(version = 3) or C(4), or a version-2 file importing one) get no
        C(enable_cdi) key, as 2.x enables CDI by default and 2.4 removed the key (CDI always on); only an explicit
        C(enable_cdi = false) is corrected there. RV(notes) says so.
      - V(false) leaves the setting as it is.
    type: bool
    default: false
  drop_in:
    description:
      - The drop-in to create for a config version 3 whose C(imports) load it. When the imports load another directory
        with a matching glob, the same file name in that directory is used.
    type: path
    default: /etc/containerd/conf.d/99-nvidia.toml
  on_missing_runtime_binary:
    description:
      - What to do when the runtime's C(BinaryName) is missing or not executable on the node.
      - V(fail) changes nothing and fails with "install the NVIDIA container toolkit"; V(warn) configures the runtime
        anyway and warns (for nodes where the toolkit is installed later, before containerd restarts).
    type: str
    choices: [fail, warn]
    default: fail
  restart:
    description:
      - V(never) - write only. V(if_required) - restart O(service) when this run changed a file (RV(restart_required))
        and wait until containerd serves again.
    type: str
    choices: [never, if_required]
    default: never
  service:
    description: The systemd unit restarted with O(restart).
    type: str
    default: containerd
  ready_timeout:
    description: Seconds from the restart for containerd to be active and serving again.
    type: int
    default: 30
notes:
  - Every file is parsed before anything is written; invalid TOML, a wrong type (for example C(imports) that is not an
    array, or C(runtimes) that is not a table) or an unsupported version fails with the file, the field and the value,
    and no file is changed.
  - The planned files are parsed again, their imports resolved again with a new drop-in in place (it must be loaded),
    and checked to define exactly the planned runtime under every way containerd may read them before any is written.
"""

EXAMPLES = r"""
- name: Ensure containerd has the nvidia runtime
  gpuharden.k8s.containerd_nvidia_runtime:
    backup: true
  register: containerd_runtime
  notify: Containerd | restart

- name: Make nvidia the default runtime and enable CDI
  gpuharden.k8s.containerd_nvidia_runtime:
    set_as_default: true
    enable_cdi: true

- name: RKE2-style config location
  gpuharden.k8s.containerd_nvidia_runtime:
    path: /var/lib/rancher/rke2/agent/etc/containerd/config.toml
"""

RETURN = r"""
runtime_name:
  description: The runtime's name; a RuntimeClass for it must use this C(handler).
  returned: always
  type: str
  sample: nvidia
restart_required:
  description: Whether containerd must be restarted to load the change (true when a file changed, also in check mode).
  returned: always
  type: bool
config_version:
  description: The main config's C(version).
  returned: always
  type: int
  sample: 3
files:
  description: The config files containerd loads, in its load order (the main file first).
  returned: always
  type: list
  elements: str
  sample: ["/etc/containerd/config.toml", "/etc/containerd/conf.d/99-nvidia.toml"]
runtime_file:
  description: The file that holds (or will hold) the runtime.
  returned: always
  type: str
  sample: /etc/containerd/conf.d/99-nvidia.toml
base_runtime:
  description: The runtime options were copied from, or V(null) when there was none.
  returned: always
  type: str
  sample: runc
runtime_binary:
  description: The C(BinaryName) the runtime uses (after the change), checked on the node.
  returned: always
  type: str
  sample: /usr/bin/nvidia-container-runtime
runtime_binary_state:
  description: V(ok), V(missing), V(not a regular file) or V(not executable).
  returned: always
  type: str
  sample: ok
generated_by:
  description: V(k3s) or V(rke2) when a file read is the config they regenerate at every start, else V(null).
  returned: always
  type: str
  sample: null
current:
  description: The runtime table, C(default_runtime_name) and C(enable_cdi) containerd reads before the change.
  returned: always
  type: dict
  sample: {"runtime": null, "default_runtime_name": "runc", "enable_cdi": null}
desired:
  description: The same, after the change.
  returned: always
  type: dict
  sample: {"runtime": {"runtime_type": "io.containerd.runc.v2",
           "options": {"SystemdCgroup": true, "BinaryName": "/usr/bin/nvidia-container-runtime"}},
           "default_runtime_name": "runc", "enable_cdi": null}
actions:
  description: What was (or in check mode would be) done, one line each.
  returned: always
  type: list
  elements: str
  sample: ["add runtime 'nvidia' to /etc/containerd/conf.d/99-nvidia.toml"]
notes:
  description:
    - What the module decided beyond the runtime itself, one line each; for example that containerd's built-in
      C(runc) runtime was written explicitly, or that C(enable_cdi) was not written because only containerd 2.x
      reads the files.
  returned: always
  type: list
  elements: str
  sample: ["no file defines the default runtime 'runc', so containerd ran its built-in one; it is written to /etc/containerd/config.toml ..."]
changes:
  description: One entry per changed file with C(path), C(action) (V(create) or V(update)) and C(reason).
  returned: always
  type: list
  elements: dict
backup_files:
  description: Backup copies made, keyed by the edited file; empty unless O(backup) and an existing file changed.
  returned: always
  type: dict
  sample: {"/etc/containerd/config.toml": "/etc/containerd/config.toml.1234.2026-01-01@00:00:00~"}
restarted:
  description: This run restarted containerd (O(restart)).
  returned: always
  type: bool
readiness:
  description:
    - After a restart, C(ready), C(status) (the last C(systemctl is-active) answer), C(seconds) from the restart,
      C(attempts), C(address) (the socket waited for), C(timed_out), C(error) (why containerd is not serving,
      V(null) when it is) and C(restarted_at) (the node's clock just before the restart, seconds since the epoch);
      V(null) without a restart.
  returned: always
  type: dict
  sample: {"ready": true, "status": "active", "seconds": 0.6, "attempts": 3, "address": "/run/containerd/containerd.sock",
           "timed_out": false, "error": null, "restarted_at": 1782907203.412}
refused:
  description:
    - What the module refused to change and why, one C({what, why, fix}) each (the GPU Operator's toolkit owns the
      runtime); empty otherwise.
  returned: always
  type: list
  elements: dict
  sample: [{"what": "containerd's nvidia runtime (/etc/containerd/conf.d/99-nvidia.toml)",
            "why": "the NVIDIA GPU Operator's container toolkit owns it: ...", "fix": "configure the runtime through ..."}]
rollback:
  description:
    - When containerd did not come back after the restart, C(restored) (the files put back as they were before this
      run, or removed where this run created them) and C(readiness) (the wait after the second restart, as
      RV(readiness)); V(null) otherwise.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _command, _files, _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _containerd, _containerd_restart, _gpu_operator


def build_module():
    return AnsibleModule(argument_spec=dict(_containerd.argument_spec(), **_containerd_restart.RESTART_SPEC), supports_check_mode=True)


def restart(module, address):
    """Restart containerd and wait until it serves on ``address`` (the planner's, from the files it read)."""
    return _containerd_restart.restart_and_wait(_command.runner(module.params["ready_timeout"]),
                                                module.params["service"], module.params["root"], address,
                                                module.params["ready_timeout"])


def roll_back(module, changes, address):
    """Put the files this run wrote back as they were (remove the ones it created), then restart containerd again."""
    reverse = [_files.FileChange(change.path, change.after, change.before, mode=change.mode,
                                 reason="rolled back: containerd did not come back with it") for change in changes if change.changed]
    _files.apply_changes(module, reverse)
    return {"restored": [_containerd.node_path(module.params["root"], change.path) for change in reverse], "readiness": restart(module, address)}


def run(module):
    if module.params["ready_timeout"] <= 0:  # refused before anything is written
        raise GpuhardenError("containerd_nvidia_runtime: option ready_timeout=%r must be a positive number of seconds"
                             % module.params["ready_timeout"])
    result = _containerd.decide(module.params)
    warnings = (_containerd.enforce_binary(result, module.params) + result["warnings"]
                + _gpu_operator.warnings(result["refused"], result["not_checked"]))
    changes = result["changes"]
    changed = bool(changes)
    backups = {}
    if changed and not module.check_mode:
        root = module.params["root"]
        backups = _files.apply_changes(module, changes, backup=module.params["backup"])
        backups = {_containerd.node_path(root, path): _containerd.node_path(root, backup) for path, backup in backups.items()}
    for warning in warnings:
        module.warn(warning)
    output = {
        "changed": changed,
        "restart_required": changed,
        "runtime_name": result["runtime_name"],
        "config_version": result["config_version"],
        "files": result["files"],
        "runtime_file": result["runtime_file"],
        "base_runtime": result["base_runtime"],
        "runtime_binary": result["runtime_binary"],
        "runtime_binary_state": result["runtime_binary_state"],
        "generated_by": result["generated_by"],
        "current": result["current"],
        "desired": result["desired"],
        "actions": result["actions"],
        "notes": result["notes"],
        "changes": [dict(change.as_dict(), path=_containerd.node_path(module.params["root"], change.path)) for change in changes],
        "backup_files": backups,
        "restarted": False,
        "readiness": None,
        "rollback": None,
        "refused": result["refused"],
    }
    if _containerd_restart.wanted(module.params, changed, module.check_mode):
        output["restarted"] = True
        output["readiness"] = restart(module, result["grpc_address"])
        if not output["readiness"]["ready"]:
            output["rollback"] = roll_back(module, changes, result["grpc_address"])
    if module._diff:
        output["diff"] = _files.diffs(changes)
    return output


def main():
    _module_shell.run_module(build_module(), run, requires=[("tomlkit", _containerd.HAS_TOMLKIT, _containerd.TOMLKIT_IMPORT_ERROR)])


if __name__ == "__main__":
    main()
