# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 47's classes, one named case each at least, kept from what the harness found (tests/fuzz/engine.py CLASSES).

Each test runs one case through the harness (the module's real entry point, check mode then normal mode, then again)
and asserts the allowed outcome.
"""

from __future__ import annotations

import shutil

import pytest
from gpuharden_lab.noderoot import sysfs_bdf

from tests.fuzz import mutations
from tests.fuzz.engine import Case, run_case
from tests.fuzz.nodes import BUNDLE, KUBEADM_CONFIG, LOCK, MIG_FILE, MODPROBE, SPECS, _fixture, _pod_dirs, _record_rel
from tests.fuzz.test_hostile import workdir

SYSTEMD_POD, CGROUPFS_POD = _pod_dirs()
H100_BDF, L4_BDF, DGX_BDF1 = (sysfs_bdf(_fixture(name)["gpus"][index]["pci_bus_id"])
                              for name, index in (("h100-mig-enabled", 0), ("l4", 0), ("dgx-a100-80gb", 1)))


def outcome(module, variant, family, target, payload=()):
    case = Case(module, variant, family, target, payload)
    where = workdir()
    try:
        result, runs = run_case(case, SPECS[module].build, mutations.apply, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return result, runs


def assert_refused(module, variant, family, target, payload=(), needle=None):
    result, runs = outcome(module, variant, family, target, payload)
    assert result.kind == "refused", (result, runs)
    if needle:
        assert needle in result.detail, result.detail
    return result


def assert_succeeded(module, variant, family, target, payload=()):
    result, runs = outcome(module, variant, family, target, payload)
    assert result.kind == "succeeded", (result, runs)
    return result



# ---------------------------------------------------------------------------------------------------------------
# traceback: IsADirectoryError, NotADirectoryError, RecursionError, MemoryError became one-line refusals


@pytest.mark.parametrize(("family", "target", "needle"), [
    ("directory", "colon:/proc/driver/nvidia/params:0", "/proc/driver/nvidia/params: is a directory, expected a file"),
    ("directory", "colon:/proc/driver/nvidia/gpus/%s/information:0" % H100_BDF, "information: is a directory"),
    ("regular_file", "dir:/proc/driver/nvidia/gpus:0", "/proc/driver/nvidia/gpus: is a regular file, expected a directory"),
    ("device", "colon:/proc/driver/nvidia/params:0", "is a character device, expected a file"),
])
def test_traceback_driver_files_of_the_wrong_type_are_refused(family, target, needle):
    assert_refused("gpu_facts", "h100-mig-enabled", family, target, needle=needle)


def test_traceback_deeply_nested_mig_config_is_refused_not_a_recursion_error():
    assert_refused("mig_layout", "dgx-a100-80gb/all-balanced", "deep", "mig:%s:0" % MIG_FILE, (100000,),
                   needle="nested more than 64 levels deep")


def test_traceback_a_mig_config_that_is_an_endless_device_is_refused_not_a_memory_error():
    assert_refused("mig_layout", "dgx-a100-80gb/all-balanced", "device", "mig:%s:0" % MIG_FILE,
                   needle="is a character device, expected a file")


def test_traceback_an_edited_originals_record_is_refused():
    # found by make fuzz (seed 47): a record whose original_stat holds text made os.chmod raise TypeError
    assert_refused("unharden_files", "one-record", "edit", "json:/%s:1" % _record_rel(),
                   ("json_compact", (("set", 276, ("pool", 34)), ("add", 1177, ("pool", 1)), ("retype", 108864, ("int", -129627)))),
                   needle="not what gpuharden records")


def test_traceback_a_nul_byte_in_a_path_option_is_refused():
    # found by make fuzz (seed 47): ValueError: embedded null byte
    assert_refused("mig_layout", "h100-mig-enabled/mixed-per-index", "option_value", "option:config_file:0",
                   (("text", "Q\\\x17>\x00"),), needle="a path cannot hold a NUL byte")


def test_traceback_containerd_plugins_as_an_inline_table():
    # fixed in phase 2: the inline tables on the edited path become standard tables (same keys, values, comment),
    # and the harness has the real containerd (2.4.2, 1.7.35) load the result
    assert_succeeded("containerd_nvidia_runtime", "v2-single.toml", "edit", "toml:/etc/containerd/config.toml:1",
                     ("keep", (("inline_tables", 0, ("pool", 0)),)))


def test_traceback_kubelet_config_nested_too_deep():
    assert_refused("kubelet_config", "kubeadm", "deep", "yaml:%s:1" % KUBEADM_CONFIG, (100000,))


def test_traceback_device_plugin_when_the_api_answers_a_list_of_strings():
    # fixed in phase 2: cluster/_device_plugin_shapes.py checks every answer before the audit reads into it
    assert_refused("device_plugin", "one-old-plugin", "api_strings", "api:/api/v1/nodes:0",
                   needle="Node #0 of the list: the API server's answer has a string")


def test_traceback_device_plugin_when_the_api_answer_nests_too_deep():
    assert_refused("device_plugin", "one-old-plugin", "api_deep", "api:/apis/apps/v1/daemonsets:0", needle="nests too deep")


@pytest.mark.parametrize("target", ["api:/api/v1/nodes:0", "api:/apis/apps/v1/daemonsets:0",
                                    "api:/api/v1/namespaces/kube-system/configmaps/old-plugin-config:0"])
def test_traceback_device_plugin_fields_of_the_wrong_type_are_refused_naming_the_object_and_field(target):
    assert_refused("device_plugin", "one-old-plugin", "api_wrong_types", target, needle="at field metadata, expected an object")


def test_hang_device_plugin_config_billion_laughs_ends_at_once_and_sends_nothing():
    # the old plugin's ConfigMap holds a billion laughs: the bounded parse ends it (a plugin_config_invalid finding); the
    # run is refused for the competing plugin, and no request changed the cluster (the harness checks the double's log)
    result, runs = outcome("device_plugin", "one-old-plugin", "api_billion_laughs",
                           "api:/api/v1/namespaces/kube-system/configmaps/old-plugin-config:0")
    assert result.allowed and all(run.seconds < 10 for run in runs), (result, runs)


# ---------------------------------------------------------------------------------------------------------------
# hang: FIFOs where files are expected; a YAML billion laughs; a huge document


@pytest.mark.parametrize(("module", "variant", "target"), [
    ("mig_layout", "dgx-a100-80gb/all-balanced", "mig:%s:0" % MIG_FILE),
    ("cgroup_memory", "systemd-and-cgroupfs", "cgroup:%s/memory.high:1" % SYSTEMD_POD),
    ("cgroup_memory", "systemd-and-cgroupfs", "lines:/sys/fs/cgroup/cgroup.controllers:0"),
    ("gpu_facts", "dgx-a100-80gb", "colon:/proc/driver/nvidia/params:0"),
    ("nvml_check", "l4", "colon:/proc/driver/nvidia/gpus/%s/information:0" % L4_BDF),
    ("process_cgroup_info", "v1-and-v2", "lines:/proc/100/cgroup:0"),
    ("node_lock", "stale", "json:%s:1" % LOCK),
    ("unharden_files", "one-record", "json:/%s:1" % _record_rel()),
    ("device_cgroup_audit", "v1-tree", "json:%s:0" % BUNDLE),
])
def test_hang_a_fifo_is_refused_or_skipped_never_waited_on(module, variant, target):
    result, runs = outcome(module, variant, "fifo", target)
    assert result.allowed and all(run.seconds < 10 for run in runs), (result, runs)


def test_hang_a_yaml_billion_laughs_is_refused():
    assert_refused("mig_layout", "h100-mig-enabled/mixed-per-index", "billion_laughs", "mig:%s:0" % MIG_FILE, (9, 9),
                   needle="more than 50000 nodes once its aliases are expanded")


def test_hang_a_20_mb_mig_config_is_refused_at_once():
    result, runs = outcome("mig_layout", "dgx-a100-80gb/all-balanced", "huge_scalar", "mig:%s:0" % MIG_FILE, (20 * 1024 * 1024,))
    assert result.kind == "refused" and "larger than" in result.detail and runs[0].seconds < 5, (result, runs)


# Fixed for the phase-2 planners too: they read through _files.read_text, which refuses a FIFO before opening it.
def test_hang_kubelet_config_that_is_a_fifo_is_refused():
    assert_refused("kubelet_config", "kubeadm", "fifo", "yaml:%s:1" % KUBEADM_CONFIG, needle="is a FIFO (named pipe)")


def test_hang_containerd_import_that_is_a_fifo_is_refused():
    assert_refused("containerd_nvidia_runtime", "v3-confd", "fifo", "toml:/etc/containerd/conf.d/10-registry.toml:0",
                   needle="is a FIFO (named pipe)")


def test_hang_kubelet_config_with_100000_keys():
    assert_refused("kubelet_config", "kubeadm", "many_keys", "yaml:%s:1" % KUBEADM_CONFIG, (100000,))


def test_hang_containerd_config_with_100000_keys():
    # fixed in phase 2: refused at once by the stated bound (_containerd.MAX_CONFIG_BYTES), before tomlkit sees it
    result, runs = outcome("containerd_nvidia_runtime", "v2-comments.toml", "many_keys", "toml:/etc/containerd/config.toml:1", (100000,))
    assert result.kind == "refused" and "larger than 524288 bytes" in result.detail and runs[0].seconds < 5, (result, runs)


# ---------------------------------------------------------------------------------------------------------------
# write_through_link: links (absolute, relative, out of the root) and ".." in options


@pytest.mark.parametrize("family", ["link_in_abs", "link_in_rel", "link_out_abs", "link_out_rel"])
def test_write_through_link_memory_high_behind_a_link_is_refused(family):
    assert_refused("cgroup_memory", "systemd-and-cgroupfs", family, "cgroup:%s/memory.high:1" % CGROUPFS_POD,
                   needle="memory.high")


def test_write_through_link_unharden_never_restores_through_a_link():
    assert_refused("unharden_files", "one-record", "link_in_abs", "lines:%s:1" % MODPROBE, needle="gpuharden does not write through links")


@pytest.mark.parametrize("family", ["link_out_abs", "link_out_rel"])
def test_write_through_link_unharden_reads_a_link_out_of_the_root_inside_it(family):
    # resolved inside the root, the link names no file: a conflict, reported, and nothing written anywhere
    result, runs = outcome("unharden_files", "one-record", family, "lines:%s:1" % MODPROBE)
    assert result.kind == "succeeded" and result.detail == "changed=False", (result, runs)


def test_write_through_link_dotdot_in_cgroup_root_stays_inside_the_root():
    assert_refused("cgroup_memory", "systemd-and-cgroupfs", "option_dotdot", "option:cgroup_root:0", (8,), needle="cgroup_root")


def test_write_through_link_dotdot_in_the_containerd_path_stays_inside_the_root_and_names_the_option():
    # found by the phase-2 long run (seed 4124053173): the refusal named the file but not the option
    assert_refused("containerd_nvidia_runtime", "v2-single.toml", "option_dotdot", "option:path:0", (5,), needle="(option path)")


def test_write_through_link_dotdot_in_the_mig_config_path_stays_inside_the_root():
    assert_refused("mig_layout", "dgx-a100-80gb/all-balanced", "option_dotdot", "option:config_file:0", (8,), needle="no such file")


# Fixed for the phase-2 planners too: _files.check_change refuses a link at the target before anything is written.
def test_write_through_link_kubelet_config_that_is_a_link_is_not_written_through():
    assert_refused("kubelet_config", "kubeadm", "link_in_rel", "yaml:%s:1" % KUBEADM_CONFIG, needle="gpuharden does not write through links")


def test_traceback_kubelet_dropin_that_is_an_absolute_link_inside_the_root():
    assert_refused("kubelet_config", "k3s", "link_in_abs", "yaml:/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/50-gpuharden.conf:1")


def test_traceback_kubelet_dropin_that_is_a_dangling_link():
    # found by make fuzz, seed 1343715329: "TypeError: argument of type 'NoneType' is not iterable" in check mode
    assert_refused("kubelet_config", "k3s", "link_dangling", "yaml:/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/50-gpuharden.conf:1")


def test_rejected_by_component_a_modprobe_line_kmod_ignores_is_refused_not_kept():
    # found by make fuzz, seed 3217744106: gpuharden's own modprobe file with a junk line was edited and the line kept;
    # kmod skips such a line ("ignoring bad line"), so the file does not say what it seems to
    assert_refused("nvidia_device_nodes", "l4", "edit", "lines:/etc/modprobe.d/zz-gpuharden-nvidia.conf:1",
                   ("keep", (("set", 5108, ("pool", 28)), ("junk", 10693, ("text", "")), ("append_token", 14119, ("text", "è")))),
                   needle="zz-gpuharden-nvidia.conf")


def test_unclear_error_a_unit_drop_in_cut_short_is_named():
    # found by make fuzz, seed 1343715329: a 10-kubeadm.conf cut before its ExecStart= was refused naming only
    # kubelet.service, not the drop-in that lost the flags
    assert_refused("kubelet_config", "kubeadm", "truncate", "lines:/etc/systemd/system/kubelet.service.d/10-kubeadm.conf:0", (6,),
                   needle="10-kubeadm.conf")


def test_write_through_link_a_kubelet_config_linked_out_of_the_root_is_not_read():
    # fixed in phase 2: the kubelet planner's NodeReader reads with _files.read_text(path, root=root)
    assert_refused("kubelet_config", "kubeadm", "link_out_abs", "yaml:%s:1" % KUBEADM_CONFIG)


def test_write_through_link_a_containerd_config_linked_out_of_the_root_is_not_read():
    # fixed in phase 2: _containerd reads every file with _files.read_text(path, root=root)
    assert_refused("containerd_nvidia_runtime", "v2-single.toml", "link_out_abs", "toml:/etc/containerd/config.toml:1",
                   needle="is a symbolic link to")


@pytest.mark.parametrize("family", ["link_out_abs", "link_out_rel"])
def test_write_through_link_device_nodes_modprobe_file_linked_out_of_the_root_is_refused_before_any_change(family):
    # fixed in phase 2: read inside the root, and every file change checked (no write through a link) before the first
    # device node changes
    assert_refused("nvidia_device_nodes", "l4", family, "lines:%s:1" % MODPROBE, needle="gpuharden does not write through links")


# ---------------------------------------------------------------------------------------------------------------
# half_done and leftover_temp: immutable files and directories (chattr +i) end in one line, nothing changed


def test_half_done_an_immutable_file_is_refused_before_anything_changes():
    assert_refused("unharden_files", "one-record", "immutable", "lines:%s:1" % MODPROBE, needle="the file is immutable (chattr +i)")


def test_leftover_temp_an_immutable_directory_leaves_no_temporary_file():
    assert_refused("unharden_files", "one-record", "immutable_dir", "lines:%s:1" % MODPROBE, needle="is immutable (chattr +i)")


def test_half_done_an_immutable_memory_high_is_refused_before_the_first_write():
    assert_refused("cgroup_memory", "systemd-and-cgroupfs", "immutable", "cgroup:%s/memory.high:1" % CGROUPFS_POD,
                   needle="the file is immutable (chattr +i)")


def test_half_done_device_nodes_refuse_an_impossible_minor_before_the_first_change():
    # fixed by the shared read (_host.driver_gpus checks Device Minor against the driver's range)
    assert_refused("nvidia_device_nodes", "dgx-a100-80gb", "edit", "colon:/proc/driver/nvidia/gpus/%s/information:0" % DGX_BDF1,
                   ("keep", (("set", 4, ("int", 2 ** 40)),)), needle="Device Minor 1099511627776 is not a GPU minor")


# ---------------------------------------------------------------------------------------------------------------
# lost_update: another writer between the read and the rename


def test_lost_update_unharden_refuses_over_another_writers_change():
    assert_refused("unharden_files", "one-record", "race", "lines:%s:1" % MODPROBE, needle="changed by someone else")


@pytest.mark.parametrize(("module", "variant", "target"), [
    ("kubelet_config", "kubeadm", "yaml:%s:1" % KUBEADM_CONFIG),
    ("containerd_nvidia_runtime", "v2-single.toml", "toml:/etc/containerd/config.toml:1"),
])
def test_lost_update_the_phase_2_planners_refuse_over_another_writers_change(module, variant, target):
    # fixed in the core: _files compares the file with what the planner read just before the rename
    assert_refused(module, variant, "race", target, ("config-management agent",), needle="changed by someone else")


# ---------------------------------------------------------------------------------------------------------------
# wrong_result: values the driver cannot have are refused, not reported


def test_wrong_result_a_gpu_minor_the_driver_never_hands_out_is_refused():
    assert_refused("gpu_facts", "h100-mig-enabled", "edit", "colon:/proc/driver/nvidia/gpus/%s/information:0" % H100_BDF,
                   ("keep", (("set", 4, ("pool", 11)),)), needle="Device Minor 255 is not a GPU minor")


@pytest.mark.parametrize(("family", "needle"), [("fifo", "/etc/group: is a FIFO"), ("directory", "/etc/group: is a directory")])
def test_wrong_result_device_group_resolved_on_the_wrong_machine(family, needle):
    # fixed in phase 2: below a root, names come only from the root's own /etc files, read safely
    assert_refused("nvidia_device_nodes", "l4", family, "colon:/etc/group:0", needle=needle)


@pytest.mark.parametrize("family", ["link_out_abs", "link_dangling"])
def test_wrong_result_device_owner_never_resolved_without_the_nodes_passwd(family):
    # /etc/passwd names no file inside the root: the default owner "root" is not looked up on this machine
    assert_refused("nvidia_device_nodes", "l4", family, "colon:/etc/passwd:0", needle="etc/passwd: does not exist")


# ---------------------------------------------------------------------------------------------------------------
# not_idempotent


def test_not_idempotent_mig_layout_applies_once_then_changes_nothing():
    assert_succeeded("mig_layout", "dgx-a100-80gb/mixed-per-index", "none", "mig:%s:0" % MIG_FILE)


def test_not_idempotent_device_minor_255_is_refused():
    # fixed by the shared read: 255 is nvidiactl's minor, never a GPU's (it used to change on every run)
    assert_refused("nvidia_device_nodes", "l4", "edit", "colon:/proc/driver/nvidia/gpus/%s/information:0" % L4_BDF,
                   ("keep", (("set", 4, ("pool", 11)),)), needle="Device Minor 255 is not a GPU minor")


# ---------------------------------------------------------------------------------------------------------------
# invalid_accepted: what mig-parted v0.15.0 applies wrongly is refused


def test_invalid_accepted_two_entries_of_one_config_on_one_gpu_are_refused():
    assert_refused("mig_layout", "dgx-a100-80gb/mixed-per-index", "edit", "mig:%s:0" % MIG_FILE,
                   ("keep", (("overlap", 0, ("pool", 0)),)), needle="selects already")


def test_invalid_accepted_a_repeated_config_name_is_refused():
    assert_refused("mig_layout", "dgx-a100-80gb/mixed-per-index", "edit", "mig:%s:0" % MIG_FILE,
                   ("block", (("duplicate_name", 0, ("pool", 0)),)), needle="appears twice in one mapping")


# ---------------------------------------------------------------------------------------------------------------
# unclear_error: one line, the file and what is wrong; no parser internals, no Python type names


BROKEN_YAML = b"version: v1\nmig-configs:\n  all-balanced: [{devices: all,\n    mig-enabled: true\n"


def test_unclear_error_a_yaml_error_is_one_line_with_file_line_and_column():
    assert_refused("mig_layout", "dgx-a100-80gb/all-balanced", "raw", "mig:%s:0" % MIG_FILE, (BROKEN_YAML,),
                   needle="config.yaml: line 5, column 1: expected ',' or '}'")


def test_unclear_error_invalid_utf8_names_the_byte_offset():
    assert_refused("process_cgroup_info", "v1-and-v2", "invalid_utf8", "lines:/proc/200/cgroup:0", (50,), needle="at offset")


def test_unclear_error_a_relative_bundle_dir_names_the_option():
    # found by make fuzz (seed 47): a 300-character relative name ended in "File name too long" for a path
    assert_refused("device_cgroup_audit", "v1-tree", "option_value", "option:bundle_dirs:0", (("pool", 19),),
                   needle="option bundle_dirs")


def test_unclear_error_an_empty_mig_config_is_described_in_words():
    # found by make fuzz (seed 20261206): "got 'NoneType'" in node_audit's not_checked cause
    assert_refused("mig_layout", "dgx-a100-80gb/all-balanced", "raw", "mig:%s:0" % MIG_FILE, (b"# nothing here\n",),
                   needle="must be a mig-parted v1 mapping, got nothing (an empty document or value)")


def test_unclear_error_cgroup_controllers_without_memory_names_the_file():
    # found by make fuzz (seed 20261206): the message named the directory and "cgroup.controllers" apart
    assert_refused("cgroup_memory", "systemd-and-cgroupfs", "truncate", "lines:/sys/fs/cgroup/cgroup.controllers:0", (13,),
                   needle="/sys/fs/cgroup/cgroup.controllers (cpuse) has no memory controller")


def test_unclear_error_kubelet_yaml_error():
    assert_refused("kubelet_config", "kubeadm", "raw", "yaml:%s:1" % KUBEADM_CONFIG,
                   (b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfoo: [1,\n  2\nbar: x\n",))


# ---------------------------------------------------------------------------------------------------------------
# rejected_by_component: a success is one the component accepts


def test_rejected_by_component_an_applied_mig_layout_passes_mig_parteds_assert():
    assert_succeeded("mig_layout", "h100-mig-enabled/all-1g.10gb", "link_in_rel", "mig:%s:0" % MIG_FILE)


def test_rejected_by_component_a_json_kubelet_config_stays_json():
    assert_succeeded("kubelet_config", "kubeadm-json", "none", "json:%s:1" % KUBEADM_CONFIG)


def test_rejected_by_component_a_field_of_the_wrong_type_is_refused_before_any_write():
    assert_refused("kubelet_config", "kubeadm", "raw", "yaml:%s:1" % KUBEADM_CONFIG,
                   (b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates: [MemoryQoS]\n",))


# ---------------------------------------------------------------------------------------------------------------
# rejected_by_component: a value of a type containerd's decoder refuses, in a field gpuharden does not touch, is
# refused before any write (make fuzz, seed 3217744106)


def test_rejected_by_component_top_level_oom_score_string_is_refused():
    assert_refused("containerd_nvidia_runtime", "v2-single.toml", "edit", "toml:/etc/containerd/config.toml:1",
                   ("keep", (("retype", 3, ("text", "x")),)), needle="oom_score must be an integer, got string")


def test_rejected_by_component_cri_images_registry_string_in_a_drop_in_is_refused():
    assert_refused("containerd_nvidia_runtime", "v3-confd", "edit", "toml:/etc/containerd/conf.d/10-registry.toml:0",
                   ("keep", (("set", 238, ("text", "")), ("delete", 34288, ("text", "")))), needle="registry must be a table, got string")
