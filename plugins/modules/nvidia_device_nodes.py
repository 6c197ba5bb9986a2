#!/usr/bin/python
# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_device_nodes
short_description: Repair NVIDIA device nodes and make their permissions stick where anything can
version_added: 0.1.0
description:
  - Inspects and repairs C(/dev/nvidia<minor>) (195:minor) for every GPU the driver lists in
    C(/proc/driver/nvidia/gpus/<bdf>/information), C(/dev/nvidiactl) (195:255), C(/dev/nvidia-modeset)
    (195:254, when it exists or nvidia_modeset is loaded), C(/dev/nvidia-uvm) and C(/dev/nvidia-uvm-tools)
    (minors 0 and 1 of the C(nvidia-uvm) major in C(/proc/devices)) and C(/dev/nvidia-caps/nvidia-cap<m>)
    (the C(nvidia-caps) major; the MIG capabilities announced under C(/proc/driver/nvidia/capabilities), plus
    existing C(nvidia-cap1) (MIG config, 0400) and C(nvidia-cap2) (MIG monitor, 0444)). Another announced
    capability (such as C(fabric-imex-mgmt)) is fixed where its node exists and never created, since its user makes
    it with C(nvidia-modprobe -f) when it needs it.
  - Creates missing nodes, replaces nodes of the wrong type or numbers (a new node is made next to the old
    one and renamed over it), and fixes owner, group and mode.
  - "Creates the C(/dev/char/<major>:<minor>) symlinks that runc's systemd cgroup driver resolves device
    rules through; without them containers lose their GPUs after a C(systemctl daemon-reload) and NVML
    fails with C(Failed to initialize NVML: Unknown Error)."
  - With O(persist=true) the module writes the C(NVreg_DeviceFile*) options to O(modprobe_file), and removes
    the udev rules for C(nvidia-uvm*) and C(nvidia-cap*) that earlier versions wrote to O(udev_rules_file)
    (they never fired).
  - Reports RV(reboot_or_reload_required) when C(/proc/driver/nvidia/params) shows the running driver
    still uses other values, and RV(conflicts) when another modprobe.d file or the kernel command line
    sets the same options differently.
  - "The kernel modules make no device node and send no uevent (they register their numbers with C(cdev_add)
    only), so udev never sees these devices. The nodes are made, and their owner, group and mode reset in place,
    by C(nvidia-modprobe), which the NVIDIA container toolkit runs at every container start and CUDA runs when it
    opens UVM. What it uses decides what can stick:"
  - "C(/dev/nvidia<N>), C(/dev/nvidiactl), C(/dev/nvidia-modeset): the C(NVreg_DeviceFileUID),
    C(NVreg_DeviceFileGID) and C(NVreg_DeviceFileMode) the nvidia module runs with (C(/proc/driver/nvidia/params)).
    The policy sticks once the module is loaded with the options the module writes to O(modprobe_file)."
  - "C(/dev/nvidia-uvm), C(/dev/nvidia-uvm-tools): always C(root:root 0666); no parameter changes that.
    C(/dev/nvidia-caps/nvidia-cap<m>): C(root:root) with the mode the driver gives the capability in
    C(/proc/driver/nvidia/capabilities) (MIG config 0400, monitor and instance access 0444). No policy can stick
    for these nodes, so the module keeps them at exactly those values under every policy (a narrower mode would
    last only until the next container start, and the drift check would flap), and reports a policy that asks for
    something else in RV(not_persistable). GPU access is still limited by the policy: UVM works only on a GPU
    registered through a file descriptor of C(/dev/nvidiactl), and capabilities are checked by the driver behind
    C(/dev/nvidiactl) and C(/dev/nvidia<N>)."
  - Does not need NVML, which may be exactly what is broken.
  - Where the NVIDIA GPU Operator's driver container serves the driver (O(gpu_operator.driver), a non-empty
    O(gpu_operator.driver_root) or C(/run/nvidia/validations/.driver-ctr-ready)), the module changes nothing and
    returns RV(refused) with a warning, since the driver container loads the module with its own modprobe options and the
    operator's validator makes the device nodes and C(/dev/char) links. C(device_permissions) in
    O(gpu_operator.takeover) makes it act anyway, with a warning.
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
    details:
      - "Device-node and link changes appear as one text diff, one line per path
        (C(/dev/nvidia0: char 195:0 root:root 0600) before, C(... 0666) after), followed by the file diffs."
options:
  policy:
    description:
      - V(default) is the driver's own default, C(root:root 0666); O(owner), O(group) and O(mode) must not be set.
      - V(restricted) limits C(/dev/nvidia<N>), C(/dev/nvidiactl) and C(/dev/nvidia-modeset), and so the GPUs,
        to one group; O(group) is required, O(mode) defaults to C(0660), may give
        others nothing and must give the group read and write. B(Consequence:) pods then need that GID in
        C(securityContext.supplementalGroups) (or run as it); the NVIDIA container toolkit creates the nodes
        inside containers with the host's owner and mode, so a pod without the group fails with
        C(Insufficient Permissions).
      - V(custom) takes O(owner) (default C(root)), O(group) (default C(root)) and O(mode) (required) as given.
      - C(/dev/nvidia-uvm*) stay C(root:root 0666) and C(/dev/nvidia-caps/*) C(root:root) with the driver's mode
        under every policy, because nothing keeps anything else (see the description). A policy that asks for
        other values there (any policy but V(default) or C(root:root 0666)) is reported in RV(not_persistable)
        and as a warning on every run.
    type: str
    choices: [default, restricted, custom]
    default: default
  owner:
    description: Owner of the device nodes, a user name or a numeric uid. Only with O(policy=restricted) or O(policy=custom).
    type: raw
  group:
    description:
      - Group of the device nodes, a group name or a numeric gid. Required with O(policy=restricted).
      - Names are resolved on the node (its C(/etc/group) when O(root) is not C(/)).
    type: raw
  mode:
    description:
      - Mode of the device nodes as octal digits, quoted (V('0660')). An unquoted YAML number like V(0660)
        is read as YAML does (octal); an unquoted V(660) is rejected.
    type: raw
  create_missing:
    description: Create device nodes that the driver's state calls for but that are missing.
    type: bool
    default: true
  char_links:
    description: Create or repair C(/dev/char/<major>:<minor>) symlinks for every managed node.
    type: bool
    default: true
  persist:
    description:
      - Write O(modprobe_file) so that the permissions of C(/dev/nvidia<N>), C(/dev/nvidiactl) and
        C(/dev/nvidia-modeset) survive driver reloads, reboots and nvidia-modprobe, and remove the ineffective udev
        rules earlier versions wrote to O(udev_rules_file).
    type: bool
    default: true
  modprobe_file:
    description:
      - The modprobe.d file for C(options nvidia NVreg_DeviceFileUID=... NVreg_DeviceFileGID=... NVreg_DeviceFileMode=...).
      - modprobe reads C(*.conf) files in name order and the last value wins, so the default name sorts after
        the usual C(nvidia.conf) and C(nvidia-*.conf) files. Other lines and parameters in the file are kept.
      - If C(nvidia) is loaded from the initramfs, rebuild it (for example C(update-initramfs -u)) after a change.
    type: path
    default: /etc/modprobe.d/zz-gpuharden-nvidia.conf
  udev_rules_file:
    description:
      - The udev rules file earlier versions of this module wrote for C(nvidia-uvm), C(nvidia-uvm-tools) and
        C(nvidia-cap<m>). Those rules never fire (the devices send no uevent); with O(persist=true) the module
        removes the lines it wrote there, and the file when nothing else is left. Other lines are kept.
    type: path
    default: /etc/udev/rules.d/70-gpuharden-nvidia.rules
  on_conflict:
    description:
      - What to do when another modprobe.d file (read after O(modprobe_file)) or the kernel command line sets
        C(NVreg_DeviceFile*) differently, or C(NVreg_ModifyDeviceFiles=0) is set.
      - V(warn) reports them in RV(conflicts) and as warnings; V(fail) fails before changing anything.
    type: str
    choices: [warn, fail]
    default: warn
requirements:
  - root on the node (mknod, chown)
notes:
  - The module does not reload the nvidia module. Until it is reloaded with the new options (RV(reboot_or_reload_required)),
    nvidia-modprobe resets C(/dev/nvidia<N>) and C(/dev/nvidiactl) to the running values at the next container start.
seealso:
  - module: gpuharden.k8s.gpu_facts
"""

EXAMPLES = r"""
- name: Make the device nodes what the driver would make them (root:root 0666)
  gpuharden.k8s.nvidia_device_nodes:

- name: Only members of the gpu group (pods need supplementalGroups with its GID)
  gpuharden.k8s.nvidia_device_nodes:
    policy: restricted
    group: gpu
    mode: "0660"
    backup: true

- name: Refuse to run when another modprobe.d file would override the options
  gpuharden.k8s.nvidia_device_nodes:
    on_conflict: fail
  register: device_nodes

- name: Tell when the running driver still uses other values
  ansible.builtin.debug:
    msg: "Reload the nvidia module or reboot to apply {{ device_nodes.driver_params.desired }}"
  when: device_nodes.reboot_or_reload_required
"""

RETURN = r"""
policy:
  description: The resolved policy.
  returned: always
  type: dict
  sample: {"policy": "default", "uid": 0, "gid": 0, "mode": "0666", "owner": "root", "group": "root"}
nodes:
  description:
    - Every managed device node, keyed by path, with C(action) (V(ok), V(create), V(replace), V(fix), V(missing)),
      C(before), C(after) and C(kept_by) (what makes its owner, group and mode stick, or resets them).
  returned: always
  type: dict
  sample: {"/dev/nvidia0": {"action": "fix", "before": "char 195:0 root:root 0600", "after": "char 195:0 root:root 0666",
                            "kept_by": "NVreg_DeviceFileUID/GID/Mode (nvidia-modprobe reads them from /proc/driver/nvidia/params)"}}
links:
  description: Every C(/dev/char) link for a managed node, keyed by path, with C(action), C(before) and C(after).
  returned: always
  type: dict
  sample: {"/dev/char/195:0": {"action": "create", "before": "absent", "after": "link -> ../nvidia0"}}
actions:
  description: The node, link and directory changes as text lines (planned in check mode, done otherwise).
  returned: always
  type: list
  elements: str
  sample: ["/dev/nvidia0: char 195:0 root:root 0600 -> char 195:0 root:root 0666"]
files:
  description: The files the module manages, with C(path), C(changed), C(action) (create, update, remove) and C(reason).
  returned: always
  type: list
  elements: dict
conflicts:
  description:
    - Settings elsewhere that differ from the wanted ones, with C(file), C(line), C(parameter), C(value),
      C(expected), C(overrides) (true when it wins over O(modprobe_file)) and C(message).
  returned: always
  type: list
  elements: dict
  sample: [{"file": "/etc/modprobe.d/nvidia.conf", "line": 3, "parameter": "NVreg_DeviceFileMode", "value": "0600",
            "expected": "0666", "overrides": false, "message": "read before ...: overridden"}]
reboot_or_reload_required:
  description: The running driver (C(/proc/driver/nvidia/params)) uses other C(DeviceFile*) values than wanted.
  returned: always
  type: bool
driver_params:
  description:
    - C(running) (V(null) without a driver) and C(desired) values of C(DeviceFileUID), C(DeviceFileGID) and
      C(DeviceFileMode), in decimal as the params file shows them.
  returned: always
  type: dict
  sample: {"running": {"DeviceFileUID": 0, "DeviceFileGID": 0, "DeviceFileMode": 438},
           "desired": {"DeviceFileUID": 0, "DeviceFileGID": 0, "DeviceFileMode": 438}}
driver_loaded:
  description: Whether the NVIDIA driver is loaded (no node is managed without it; the files still are).
  returned: always
  type: bool
not_persistable:
  description:
    - Nodes where the policy asks for an owner, group or mode that nothing keeps, with C(path), C(wanted) (what
      the policy asks for), C(kept) (what the node gets and keeps) and C(kept_by). Empty under O(policy=default).
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/dev/nvidia-uvm", "wanted": "root:video 0660", "kept": "root:root 0666",
            "kept_by": "nvidia-modprobe: always root:root 0666 (no parameter changes it)"}]
refused:
  description:
    - What the module refused to change and why, one C({what, why, fix}) each (the GPU Operator's driver container serves
      the driver); empty otherwise.
  returned: always
  type: list
  elements: dict
unknown_nodes:
  description: Existing C(/dev/nvidia*) entries the driver does not account for; reported, never touched.
  returned: always
  type: list
  elements: str
backup_files:
  description: Backup copies made, keyed by the edited file.
  returned: when backup is true and a file changed
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _files, _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _device_nodes, _gpu_operator


def build_module():
    return AnsibleModule(argument_spec=_device_nodes.argument_spec(), supports_check_mode=True)


def run(module):
    policy, planned = _device_nodes.decide(module.params)
    changed = _device_nodes.changed(planned)
    backups = {}
    if changed:
        _device_nodes.preflight(planned, module.params["root"])  # nothing changes unless every change can be made
    if changed and not module.check_mode:
        label = None
        if module.selinux_enabled():
            def label(path):
                module.set_default_selinux_context(path, False)
        _device_nodes.apply_nodes(planned, module.params["root"], label=label)
        backups = _files.apply_changes(module, planned["changes"], backup=module.params["backup"])
    for warning in planned["warnings"] + _gpu_operator.warnings(planned["refused"], planned["not_checked"]):
        module.warn(warning)
    for conflict in planned["conflicts"]:
        where = conflict["file"] if conflict["line"] is None else "%s line %d" % (conflict["file"], conflict["line"])
        module.warn("%s: %s=%s, wanted %s: %s" % (where, conflict["parameter"], conflict["value"], conflict["expected"], conflict["message"]))
    result = {
        "changed": changed,
        "policy": dict(policy, mode="%04o" % policy["mode"]),
        "nodes": planned["nodes"],
        "links": planned["links"],
        "actions": ["%s: directory created (0755)" % path for path in planned["dirs"]] + planned["actions"],
        "files": [change.as_dict() for change in planned["changes"]],
        "conflicts": planned["conflicts"],
        "reboot_or_reload_required": planned["reboot_or_reload_required"],
        "driver_params": planned["driver_params"],
        "driver_loaded": planned["driver_loaded"],
        "unknown_nodes": planned["unknown_nodes"],
        "not_persistable": planned["not_persistable"],
        "refused": planned["refused"],
    }
    if backups:
        result["backup_files"] = backups
    if module._diff:
        diffs = []
        if planned["diff_before"] or planned["diff_after"] or planned["dirs"]:
            diffs.append({"before": planned["diff_before"],
                          "after": "".join("%s: directory 0755\n" % path for path in planned["dirs"]) + planned["diff_after"],
                          "before_header": "device nodes (before)", "after_header": "device nodes (after)"})
        result["diff"] = diffs + _files.diffs(planned["changes"])
    return result


def main():
    _module_shell.run_module(build_module(), run)


if __name__ == "__main__":
    main()
