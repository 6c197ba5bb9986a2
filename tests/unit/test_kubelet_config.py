# SPDX-License-Identifier: GPL-3.0-or-later
"""kubelet_config: where the kubelet really reads its settings, the plan, and the module run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _kubelet

from tests.unit.conftest import run_module

FIXTURES = Path(__file__).parent / "fixtures" / "kubelet"
TOPOLOGY = {"topology_manager_policy": "single-numa-node", "cpu_manager_policy": "static", "reserved_system_cpus": "0-1"}
CONFIG = "/var/lib/kubelet/config.yaml"
K3S_CONFIG = "/etc/rancher/k3s/config.yaml"
K3S_DIR = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"


@pytest.fixture
def node(world_tmp):
    """node(flavor, **{node_path: text or None}) -> root of a copy of the fixture node."""

    def make(flavor="kubeadm", **files):
        root = world_tmp / flavor
        shutil.copytree(FIXTURES / flavor, root)
        for path, text in files.items():
            write(root, path, text)
        return root

    return make


def write(root, path, text):
    target = Path(str(root) + path)
    if text is None:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def read(root, path):
    target = Path(str(root) + path)
    return target.read_text() if target.exists() else None


def plan(root, cgroup_version=None, **params):
    return _kubelet.plan(_kubelet.NodeReader(str(root)), params, cgroup_version=cgroup_version)


def yaml_of(text):
    return yaml.safe_load(text)


def applied(root, result):
    """Write a plan's changes the simple way (the module uses _files.apply_changes)."""
    for change in result["changes"]:
        write(root, change.node_path, change.after)


def tree_digest(root):
    digest = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as handle:
                digest[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return digest


def changed_paths(result):
    return sorted(change.node_path for change in result["changes"] if change.changed)


# --------------------------------------------------------------------------------------------
# pure helpers


def test_flag_names_follow_the_kubelet():
    assert _kubelet.flag_for_field("topologyManagerPolicy") == "topology-manager-policy"
    assert _kubelet.flag_for_field("reservedSystemCPUs") == "reserved-cpus"
    assert _kubelet.flag_for_field("featureGates") == "feature-gates"
    assert _kubelet.flag_for_field("kubeAPIQPS") == "kube-api-qps"
    assert _kubelet.flag_for_field("enforceNodeAllocatable") == "enforce-node-allocatable"


def test_parse_flags_pflag_forms():
    words = ["--a=1", "--b", "2", "--fail-swap-on", "--c_d=3", "positional", "--", "--e=4"]
    flags = _kubelet.parse_flags([(word, None) for word in words])
    assert [(flag.name, flag.value) for flag in flags] == [("a", "1"), ("b", "2"), ("fail-swap-on", None), ("c-d", "3")]


def test_reserved_memory_flag_is_parsed_like_the_kubelet():
    assert _kubelet.parse_reserved_memory(["0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi"]) == [
        {"numaNode": 0, "limits": {"memory": "1Gi", "hugepages-1Gi": "2Gi"}},
        {"numaNode": 1, "limits": {"memory": "2Gi"}},
    ]


def test_env_file_keeps_quotes_comments_and_other_variables():
    env = _kubelet.EnvFile("/e", '# comment\nA="x y"\nexport B=\'z\'\nC=plain value\n')
    assert env.values == {"A": "x y", "B": "z", "C": "plain value"}
    env.set("A", 'new "q"')
    env.set("C", "v")
    assert env.render() == '# comment\nA="new \\"q\\""\nexport B=\'z\'\nC=v\n'


def test_unit_environment_file_beats_environment_and_drop_ins_sort(node):
    root = node("kubeadm", **{
        "/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--topology-manager-policy=restricted\n",
        "/lib/systemd/system/kubelet.service.d/20-extra.conf":
            '[Service]\nEnvironment="KUBELET_EXTRA_ARGS=--topology-manager-policy=best-effort"\n',
    })
    view = _kubelet.discover(_kubelet.NodeReader(str(root)))
    flag = _kubelet.last_flag(view["flags"], "topology-manager-policy")
    assert (flag.value, flag.origin.kind, flag.origin.path) == ("restricted", "envfile", "/etc/default/kubelet")
    assert view["unit"]["fragments"][-1] == "/lib/systemd/system/kubelet.service.d/20-extra.conf"


def test_etc_drop_in_masks_the_same_name_below_lib(node):
    root = node("kubeadm", **{
        "/lib/systemd/system/kubelet.service.d/10-kubeadm.conf": "[Service]\nExecStart=\nExecStart=/bin/false\n",
    })
    view = _kubelet.discover(_kubelet.NodeReader(str(root)))
    assert view["config"] == CONFIG


# --------------------------------------------------------------------------------------------
# planning: kubeadm


def test_kubeadm_sets_the_config_file_keeping_comments_and_order(node):
    root = node()
    result = plan(root, **TOPOLOGY)
    assert changed_paths(result) == [CONFIG]
    after = result["changes"][0].after
    assert after.startswith("# Written by kubeadm join; edited by hand since.\napiVersion:")
    assert "cpuManagerPolicy: static # TODO exclusive CPUs for training pods\n" in after
    assert after.index("cpuManagerPolicy") < after.index("topologyManagerPolicy") < after.index("reservedSystemCPUs")
    assert result["cpu_manager_policy_changed"] is True
    assert result["sources"]["topologyManagerPolicy"]["before"] == "none"
    assert result["sources"]["topologyManagerPolicy"]["source_after"] == {"kind": "file", "path": CONFIG}
    assert result["restart_required"] is True


def test_second_plan_after_apply_changes_nothing(node):
    root = node()
    applied(root, plan(root, **TOPOLOGY))
    again = plan(root, **TOPOLOGY)
    assert changed_paths(again) == []
    assert again["cpu_manager_policy_changed"] is False


def test_stale_cpu_checkpoint_is_reported_and_removed_on_request(node):
    root = node()
    result = plan(root, **TOPOLOGY)
    assert [entry["path"] for entry in result["stale_state_files"]] == ["/var/lib/kubelet/cpu_manager_state"]
    result = plan(root, remove_stale_state=True, **TOPOLOGY)
    removal = [change for change in result["changes"] if change.after is None]
    assert [change.node_path for change in removal] == ["/var/lib/kubelet/cpu_manager_state"]


def test_checkpoint_already_stale_without_a_config_change(node):
    root = node(**{"/var/lib/kubelet/cpu_manager_state": '{"policyName":"static"}'})
    result = plan(root, topology_manager_policy="none")
    assert changed_paths(result) == []
    assert result["stale_state_files"][0]["configured_policy"] == "none"
    assert result["restart_required"] is True


def test_only_a_checkpoint_the_change_made_stale_may_come_back(node):
    """A checkpoint the configuration before the change accepted (the policy gpuharden changes) is restorable by the
    uninstall; one the kubelet already refused is not (it would stop the kubelet again)."""
    made_stale = [change for change in plan(node(), remove_stale_state=True, **TOPOLOGY)["changes"] if change.after is None]
    assert [change.restorable for change in made_stale] == [True]


def test_an_already_refused_checkpoint_may_not_come_back(node):
    root = node(**{"/var/lib/kubelet/cpu_manager_state": '{"policyName":"static"}'})
    already = [change for change in plan(root, remove_stale_state=True, topology_manager_policy="none")["changes"] if change.after is None]
    assert [change.restorable for change in already] == [False]
    assert plan(root, topology_manager_policy="none")["stale_state_files"][0]["stale_before"] is True


def test_root_dir_flag_moves_the_checkpoints(node):
    root = node(**{"/var/lib/kubelet/kubeadm-flags.env": 'KUBELET_KUBEADM_ARGS="--root-dir=/data/kubelet"\n',
                   "/data/kubelet/memory_manager_state": "not json"})
    result = plan(root, **TOPOLOGY)
    assert [entry["path"] for entry in result["stale_state_files"]] == ["/data/kubelet/memory_manager_state"]


def test_flag_in_default_kubelet_is_removed_where_it_lives(node):
    root = node(**{"/etc/default/kubelet": "# site overrides\nKUBELET_EXTRA_ARGS=--max-pods=200 --cpu-manager-policy none\n"})
    result = plan(root, **TOPOLOGY)
    assert changed_paths(result) == ["/etc/default/kubelet", CONFIG]
    env = [change for change in result["changes"] if change.node_path == "/etc/default/kubelet"][0]
    assert env.after == "# site overrides\nKUBELET_EXTRA_ARGS=--max-pods=200\n"
    assert "--cpu-manager-policy=none" in env.reason
    source = result["sources"]["cpuManagerPolicy"]["source_before"]
    assert (source["kind"], source["path"], source["variable"]) == ("flag", "/etc/default/kubelet", "KUBELET_EXTRA_ARGS")


def test_flag_in_kubeadm_flags_env_fails_with_on_flag_conflict_fail(node):
    flags = 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=x --topology-manager-policy=best-effort"\n'
    root = node(**{"/var/lib/kubelet/kubeadm-flags.env": flags})
    with pytest.raises(GpuhardenError) as error:
        plan(root, on_flag_conflict="fail", **TOPOLOGY)
    assert "--topology-manager-policy=best-effort" in error.value.msg
    assert "KUBELET_KUBEADM_ARGS in /var/lib/kubelet/kubeadm-flags.env" in error.value.msg
    fixed = plan(root, **TOPOLOGY)
    env = [change for change in fixed["changes"] if change.node_path.endswith("kubeadm-flags.env")][0]
    assert env.after == 'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=x"\n'


def test_flag_that_agrees_is_left_alone(node):
    root = node(**{"/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--topology-manager-policy=single-numa-node\n"})
    result = plan(root, **TOPOLOGY)
    assert changed_paths(result) == [CONFIG]
    assert result["sources"]["topologyManagerPolicy"]["source_after"]["kind"] == "flag"


def test_feature_gate_flag_loses_only_the_managed_gate(node):
    root = node(**{"/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--feature-gates=MemoryQoS=false,Foo=true\n"})
    result = plan(root, settings={"featureGates": {"MemoryQoS": True}})
    env = [change for change in result["changes"] if change.node_path == "/etc/default/kubelet"][0]
    assert env.after == "KUBELET_EXTRA_ARGS=--feature-gates=Foo=true\n"


def test_flag_in_execstart_is_never_edited(node):
    root = node(**{"/etc/systemd/system/kubelet.service.d/99-local.conf":
                   "[Service]\nExecStart=\nExecStart=/usr/local/bin/kubelet --config=/var/lib/kubelet/config.yaml "
                   "--cpu-manager-policy=none\n"})
    with pytest.raises(GpuhardenError, match="ExecStart= in /etc/systemd/system/kubelet.service.d/99-local.conf"):
        plan(root, **TOPOLOGY)


def test_config_dir_gets_an_own_drop_in_and_later_drop_ins_are_fixed(node):
    root = node(**{
        "/var/lib/kubelet/kubeadm-flags.env": 'KUBELET_KUBEADM_ARGS="--config-dir=/etc/kubernetes/kubelet.conf.d"\n',
        "/etc/kubernetes/kubelet.conf.d/90-late.conf":
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: none\n"
            "maxPods: 200\n",
    })
    result = plan(root, **TOPOLOGY)
    assert changed_paths(result) == ["/etc/kubernetes/kubelet.conf.d/50-gpuharden.conf",
                                     "/etc/kubernetes/kubelet.conf.d/90-late.conf"]
    late = [change for change in result["changes"] if change.node_path.endswith("90-late.conf")][0]
    assert "topologyManagerPolicy" not in late.after and "maxPods: 200" in late.after
    assert result["changes"][0].before is None
    assert result["sources"]["topologyManagerPolicy"]["source_after"]["path"].endswith("50-gpuharden.conf")


def test_static_without_reserved_cpus_is_refused(node):
    with pytest.raises(GpuhardenError, match="static without reserved CPUs"):
        plan(node(), cpu_manager_policy="static")


def test_reserved_cpus_the_node_does_not_have_are_refused_before_anything_is_written(node):
    """The real kubelet v1.36.3 exits with "reserved-cpus: 0-7 is not a subset of online-cpus: 0-1" (measured on the
    real-nodes lab; cmd/kubelet/app/server.go getReservedCPUs): the planner refuses it first, naming both lists."""
    root = node(**{"/sys/devices/system/cpu/online": "0-1\n"})
    with pytest.raises(GpuhardenError, match=r"reservedSystemCPUs 0-7 .*CPU\(s\) 2,3,4,5,6,7 .*online CPUs are 0-1 \(/sys/devices/system/cpu/online\)"):
        plan(root, cpu_manager_policy="static", reserved_system_cpus="0-7")
    assert changed_paths(plan(root, cpu_manager_policy="static", reserved_system_cpus="0-1")) == [CONFIG]
    # without the sysfs file (another root) nothing is judged
    write(root, "/sys/devices/system/cpu/online", None)
    assert changed_paths(plan(root, cpu_manager_policy="static", reserved_system_cpus="0-7")) == [CONFIG]


def test_a_bad_reservation_already_on_the_node_is_not_a_refusal(node):
    root = node(**{"/sys/devices/system/cpu/online": "0-1\n",
                   "/var/lib/kubelet/config.yaml": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                                                   "reservedSystemCPUs: 0-7\n"})
    result = plan(root, topology_manager_policy="single-numa-node")
    assert changed_paths(result) == [CONFIG]


def test_kube_reserved_cpu_is_a_reservation_too(node):
    result = plan(node(), cpu_manager_policy="static", settings={"kubeReserved": {"cpu": "500m"}})
    assert changed_paths(result) == [CONFIG]


def test_memory_manager_static_needs_reserved_memory(node):
    with pytest.raises(GpuhardenError, match="reservedMemory"):
        plan(node(), memory_manager_policy="Static")


def test_memory_manager_static_with_reserved_memory(node):
    root = node()
    result = plan(root, memory_manager_policy="Static", reserved_memory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}],
                  settings={"kubeReserved": {"memory": "924Mi"}})
    assert result["memory_manager_policy_changed"] is True
    assert "reservedMemory:\n  - numaNode: 0\n    limits:\n      memory: 1Gi\n" in result["changes"][0].after


MEMORY_QOS = {"featureGates": {"MemoryQoS": True, "CPUManagerPolicyAlphaOptions": True}, "memoryThrottlingFactor": 0.9,
              "memoryReservationPolicy": "TieredReservation"}


@pytest.mark.parametrize("cgroup_version", [1, "hybrid"])
def test_memory_qos_is_left_out_on_cgroup_v1_and_the_rest_is_written(node, cgroup_version):
    """Issue 43 item 6: a cgroup v1 node used to lose the whole kubelet write.  Only the MemoryQoS gate goes (with
    memoryReservationPolicy, which the kubelet refuses without the gate: validation.go); the factor stays."""
    result = plan(node(), cgroup_version=cgroup_version, settings=MEMORY_QOS, **TOPOLOGY)
    after = yaml_of(change_of(result, CONFIG).after)
    assert after["topologyManagerPolicy"] == "single-numa-node" and after["cpuManagerPolicy"] == "static"
    assert after["memoryThrottlingFactor"] == 0.9
    assert after["featureGates"] == {"CPUManagerPolicyAlphaOptions": True}
    assert "memoryReservationPolicy" not in after
    [refused] = result["refused"]
    assert refused["what"] == "featureGates.MemoryQoS=true, memoryReservationPolicy=TieredReservation"
    assert "cgroup v1" in refused["why"] and "cgroup_limits_memory_qos_feature_gate=false" in refused["fix"]
    assert "featureGates.MemoryQoS" not in result["sources"]


def test_memory_qos_on_cgroup_v2_is_written_and_alone_on_v1_leaves_nothing_to_write(node):
    root = node()
    on_v2 = plan(root, cgroup_version=2, settings=MEMORY_QOS)
    assert yaml_of(change_of(on_v2, CONFIG).after)["featureGates"]["MemoryQoS"] is True and on_v2["refused"] == []
    only_gate = plan(root, cgroup_version=1, settings={"featureGates": {"MemoryQoS": True}})
    assert changed_paths(only_gate) == [] and only_gate["restart_required"] is False
    assert [entry["what"] for entry in only_gate["refused"]] == ["featureGates.MemoryQoS=true"]
    # without the gate (cgroup_limits_memory_qos_feature_gate=false) nothing is left out: clean once written
    factor_only = plan(root, cgroup_version=1, settings={"memoryThrottlingFactor": 0.8})
    assert factor_only["refused"] == [] and changed_paths(factor_only) == [CONFIG]


# --------------------------------------------------------------------------------------------
# planning: k3s


def test_k3s_drop_in_and_kubelet_arg_fix(node):
    root = node("k3s")
    result = plan(root, **TOPOLOGY)
    assert result["service"] == "k3s-agent" and result["flavor"] == "k3s"
    assert changed_paths(result) == [K3S_CONFIG, K3S_DIR + "/50-gpuharden.conf"]
    k3s = [change for change in result["changes"] if change.node_path == K3S_CONFIG][0]
    assert k3s.after == (
        "# k3s agent configuration\nnode-label:\n  - gpuharden.io/distribution=k3s\nkubelet-arg:\n  - max-pods=200\n")
    assert read(root, K3S_DIR + "/00-k3s-defaults.conf") is not None
    assert all("00-k3s-defaults" not in path for path in changed_paths(result))
    applied(root, result)
    assert changed_paths(plan(root, **TOPOLOGY)) == []


def test_k3s_config_yaml_d_replaces_and_appends(node):
    root = node("k3s", **{K3S_CONFIG + ".d/10-more.yaml": "kubelet-arg+:\n  - topology-manager-scope=pod\n"})
    result = plan(root, topology_manager_scope="container")
    more = [change for change in result["changes"] if change.node_path.endswith("10-more.yaml")][0]
    assert more.after == "kubelet-arg+: []\n"


def test_service_detection(node):
    root = node("k3s", **{"/etc/systemd/system/kubelet.service": "[Service]\nExecStart=/usr/bin/kubelet\n"})
    with pytest.raises(GpuhardenError, match="more than one kubelet service"):
        plan(root, **TOPOLOGY)
    assert plan(root, flavor="k3s", **TOPOLOGY)["service"] == "k3s-agent"


# --------------------------------------------------------------------------------------------
# malformed input: a clear message and every file byte-identical

MALFORMED = [
    ("broken config YAML", {CONFIG: "apiVersion: [unclosed\n"}, TOPOLOGY, "config.yaml: line 2, column 1: expected ',' or ']'"),
    ("config is a list", {CONFIG: "- a\n- b\n"}, TOPOLOGY, 'must be a mapping of fields, found a list (["a", "b"])'),
    ("config wrong kind", {CONFIG: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod\n"}, TOPOLOGY, "kind is 'Pod'"),
    ("config missing", {CONFIG: None}, TOPOLOGY, "--config file does not exist"),
    ("featureGates not a map", {CONFIG: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                                        "featureGates: [MemoryQoS]\n"},
     {"settings": {"featureGates": {"MemoryQoS": True}}}, "field featureGates is a list ([\"MemoryQoS\"]); the kubelet needs a mapping of true/false values"),
    ("env file unterminated quote", {"/etc/default/kubelet": 'KUBELET_EXTRA_ARGS="--max-pods=1\n'}, TOPOLOGY,
     "unterminated \" quote"),
    ("env file garbage line", {"/etc/default/kubelet": "this is not an assignment\n"}, TOPOLOGY, "is not KEY=VALUE"),
    ("unit without ExecStart", {"/etc/systemd/system/kubelet.service.d/10-kubeadm.conf": "[Service]\nExecStart=\n"},
     TOPOLOGY, "set no ExecStart="),
    ("unit unbalanced quote", {"/etc/systemd/system/kubelet.service.d/10-kubeadm.conf":
                               '[Service]\nExecStart=\nExecStart=/usr/bin/kubelet "--config=/x\n'}, TOPOLOGY, "ExecStart="),
    ("kubelet without config", {"/etc/systemd/system/kubelet.service.d/10-kubeadm.conf":
                                "[Service]\nExecStart=\nExecStart=/usr/bin/kubelet --v=2\n"}, TOPOLOGY,
     "without --config or --config-dir"),
    ("unknown topology policy", {}, {"topology_manager_policy": "numa-please"}, "must be one of"),
    ("unknown cpu policy in settings", {}, {"settings": {"cpuManagerPolicy": "dynamic"}}, "settings.cpuManagerPolicy"),
    ("bad cpulist", {}, {"cpu_manager_policy": "static", "reserved_system_cpus": "zero-one"}, "not a CPU list"),
    ("backwards cpulist", {}, {"cpu_manager_policy": "static", "reserved_system_cpus": "3-1"}, "runs backwards"),
    ("factor too big", {}, {"settings": {"memoryThrottlingFactor": 1.5}}, "at most 1"),
    ("factor is a string", {}, {"settings": {"memoryThrottlingFactor": "0.9"}}, "settings.memoryThrottlingFactor"),
    ("feature gate not bool", {}, {"settings": {"featureGates": {"MemoryQoS": "yes"}}}, "true/false"),
    ("unknown topology option", {}, {"topology_manager_policy_options": {"prefer-far": "true"}}, "prefer-far"),
    ("max numa not int", {}, {"topology_manager_policy_options": {"max-allowable-numa-nodes": "many"}},
     "max-allowable-numa-nodes must be an integer"),
    # kubernetes v1.36.3 pkg/kubelet/cm/topologymanager/policy_options.go: below 8 the kubelet exits at start
    ("max numa 4", {}, dict(TOPOLOGY, topology_manager_policy_options={"max-allowable-numa-nodes": 4}),
     'option topology_manager_policy_options={"max-allowable-numa-nodes": 4}: max-allowable-numa-nodes=4: the kubelet '
     "refuses a value below 8"),
    ("max numa 7 in settings", {}, {"settings": {"topologyManagerPolicyOptions": {"max-allowable-numa-nodes": "7"}}},
     "settings.topologyManagerPolicyOptions"),
    ("max numa float", {}, {"topology_manager_policy_options": {"max-allowable-numa-nodes": 8.5}}, "must be an integer"),
    ("max numa beyond int64", {}, {"topology_manager_policy_options": {"max-allowable-numa-nodes": str(2 ** 63)}},
     "must be an integer"),
    # strconv.ParseBool accepts 1, t, T, TRUE, true, True and the false forms only
    ("prefer closest yes", {}, {"topology_manager_policy_options": {"prefer-closest-numa-nodes": "yes"}}, "strconv.ParseBool"),
    ("prefer closest mixed case", {}, {"topology_manager_policy_options": {"prefer-closest-numa-nodes": "tRuE"}},
     "strconv.ParseBool"),
    ("reserved memory without limits", {}, {"memory_manager_policy": "Static", "reserved_memory": [{"numaNode": 0}]},
     "missing required arguments: limits found in reserved_memory"),
    ("reserved memory bad quantity", {}, {"memory_manager_policy": "Static",
                                          "reserved_memory": [{"numaNode": 0, "limits": {"memory": "lots"}}]},
     "not a Kubernetes quantity"),
    ("enforce bad value", {}, {"settings": {"enforceNodeAllocatable": ["pods", "gpus"]}}, "enforceNodeAllocatable"),
    ("settings field not camelCase", {}, {"settings": {"topology-manager-policy": "none"}}, "not a KubeletConfiguration"),
    ("settings kind", {}, {"settings": {"kind": "Pod"}}, "is fixed"),
    ("settings conflicts with option", {}, {"cpu_manager_policy": "none", "settings": {"cpuManagerPolicy": "static"}},
     "conflicts with option cpu_manager_policy"),
    ("nothing to manage", {}, {}, "nothing to manage"),
    ("bad drop-in name", {}, dict(TOPOLOGY, dropin_name="00-first.conf"), "dropin_name"),
]
K3S_MALFORMED = [
    ("k3s config broken", {K3S_CONFIG: "kubelet-arg: [\n"}, TOPOLOGY, "config.yaml: line 2, column 1: expected the node content"),
    ("k3s kubelet-arg is a map", {K3S_CONFIG: "kubelet-arg: {max-pods: 1}\n"}, TOPOLOGY, "must be a list of strings"),
    ("k3s drop-in without kind", {K3S_DIR + "/20-x.conf": "maxPods: 10\n"}, TOPOLOGY, "without apiVersion"),
    ("k3s drop-in broken", {K3S_DIR + "/20-x.conf": "apiVersion: : :\n"}, TOPOLOGY, "20-x.conf: line 1, column"),
    ("k3s config not UTF-8", {}, TOPOLOGY, "not UTF-8"),
]


def _module_args(root, params, **extra):
    args = {key: value for key, value in params.items()}
    args.update(root=str(root), **extra)
    return args


@pytest.mark.parametrize(("case", "files", "params", "message"), MALFORMED + K3S_MALFORMED,
                         ids=[case[0] for case in MALFORMED + K3S_MALFORMED])
def test_malformed_input_fails_clearly_and_touches_nothing(node, case, files, params, message):
    root = node("k3s" if (case, files, params, message) in K3S_MALFORMED else "kubeadm", **files)
    if case == "k3s config not UTF-8":
        Path(str(root) + K3S_CONFIG).write_bytes(b"kubelet-arg:\n- max-pods=\xff\n")
    before = tree_digest(root)
    result = run_module("kubelet_config", _module_args(root, params), {})
    assert result.get("failed") is True, result
    assert message in result["msg"], result["msg"]
    assert tree_digest(root) == before


# --------------------------------------------------------------------------------------------
# the module run: check mode, apply, re-apply, backup, diff


def test_module_check_apply_reapply(node):
    root = node(**{"/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--topology-manager-policy=none\n"})
    before = tree_digest(root)
    checked = run_module("kubelet_config", _module_args(root, TOPOLOGY, _ansible_check_mode=True, _ansible_diff=True), {})
    assert checked["changed"] is True and not checked.get("failed")
    assert tree_digest(root) == before
    assert {entry["path"] for entry in checked["files"]} == {CONFIG, "/etc/default/kubelet"}
    assert len(checked["diff"]) == 2 and checked["backup_files"] == {}

    config = Path(str(root) + CONFIG)
    os.chmod(config, 0o600)
    done = run_module("kubelet_config", _module_args(root, TOPOLOGY, backup=True), {})
    assert done["changed"] is True
    assert set(done["backup_files"]) == {CONFIG, "/etc/default/kubelet"}
    assert all(os.path.exists(path) for path in done["backup_files"].values())
    assert config.stat().st_mode & 0o777 == 0o600
    assert read(root, "/etc/default/kubelet") == "KUBELET_EXTRA_ARGS=\n"
    assert [entry["path"] for entry in done["stale_state_files"]] == ["/var/lib/kubelet/cpu_manager_state"]

    digest, mtime = tree_digest(root), config.stat().st_mtime_ns
    again = run_module("kubelet_config", _module_args(root, TOPOLOGY), {})
    assert again["changed"] is False
    assert tree_digest(root) == digest and config.stat().st_mtime_ns == mtime


def test_module_removes_stale_state_on_request(node):
    root = node()
    done = run_module("kubelet_config", _module_args(root, TOPOLOGY, remove_stale_state=True), {})
    assert done["changed"] is True
    assert read(root, "/var/lib/kubelet/cpu_manager_state") is None
    assert json.loads(json.dumps(done["sources"]))["cpuManagerPolicy"]["after"] == "static"


# --------------------------------------------------------------------------------------------
# issue 13: match what the real components do (items 12-16)

K3S_BINARY = "/usr/local/bin/kubelet"  # the fixture unit's ExecStart program
DROPIN_DIR = "/etc/kubernetes/kubelet.conf.d"
WITH_CONFIG_DIR = {"/var/lib/kubelet/kubeadm-flags.env":
                   'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=x --config-dir=%s"\n' % DROPIN_DIR}


def k3s_binary(version):
    return '#!/bin/sh\necho "k3s version %s (0123abcd)"\necho "go version go1.23.4"\n' % version


def old_k3s(node, version="v1.31.4+k3s1", **files):
    root = node("k3s", **files)
    write(root, K3S_BINARY, k3s_binary(version))
    os.chmod(str(root) + K3S_BINARY, 0o755)
    return root


def change_of(result, path):
    return [change for change in result["changes"] if change.node_path == path][0]


def test_item12_kubeadm_config_yaml_is_reported_as_reverting(node):
    result = plan(node(), **TOPOLOGY)
    assert changed_paths(result) == [CONFIG]
    assert result["persistence"] == "reverts_on_kubeadm_upgrade"
    assert "kubeadm upgrade node" in result["persistence_reason"]
    assert "--config-dir" in result["persistence_reason"]


def test_item12_kubeadm_config_dir_drop_in_is_durable(node):
    result = plan(node(**WITH_CONFIG_DIR), **TOPOLOGY)
    assert changed_paths(result) == [DROPIN_DIR + "/50-gpuharden.conf"]
    assert result["persistence"] == "durable"
    assert DROPIN_DIR in result["persistence_reason"]


def test_item12_flag_removed_from_kubeadm_flags_env_stays_removed_through_an_upgrade(node):
    """kubeadm v1.36.3 rewrites kubeadm-flags.env on `upgrade node` only from its own content (postupgrade.go), so a
    flag removed there does not come back with the upgrade; `kubeadm join` would write it anew (named in the reason)."""
    flags = 'KUBELET_KUBEADM_ARGS="--config-dir=%s --topology-manager-policy=none"\n' % DROPIN_DIR
    result = plan(node(**{"/var/lib/kubelet/kubeadm-flags.env": flags}), **TOPOLOGY)
    assert "/var/lib/kubelet/kubeadm-flags.env" in changed_paths(result)
    assert result["persistence"] == "durable"
    assert "kubeadm join" in result["persistence_reason"] and "kubeletExtraArgs" in result["persistence_reason"]


def test_item12_require_durable_writes_nothing_where_it_would_not_last(node):
    """A refusal (issue 43): nothing written nor restarted, changed false, the reason in ``refused`` and a warning."""
    root = node()
    before = tree_digest(root)
    refused = run_module("kubelet_config", _module_args(root, TOPOLOGY, require_durable=True, remove_stale_state=True,
                                                        restart="if_required"), {})
    assert not refused.get("failed"), refused
    assert refused["changed"] is False and refused["files"] == [] and refused["restarted"] is False
    assert refused["restart_required"] is False and refused["stale_state_files"] == []
    [entry] = refused["refused"]
    assert entry["why"].startswith("require_durable:") and CONFIG in entry["why"]
    assert "kubelet_topology_require_durable=false" in entry["fix"]
    warnings = str(refused["warnings"])  # structured warning events in ansible-core 2.19
    assert "kubelet_config: not written: the kubelet settings" in warnings and "persistence reverts" not in warnings
    assert tree_digest(root) == before
    durable = node_with_config_dir = run_module(
        "kubelet_config", _module_args(node_root_with(root, WITH_CONFIG_DIR), TOPOLOGY, require_durable=True), {})
    assert not durable.get("failed"), durable
    assert node_with_config_dir["persistence"] == "durable"


def node_root_with(root, files):
    for path, text in files.items():
        write(root, path, text)
    return root


def test_item13_k3s_before_1_32_keeps_kubelet_arg(node):
    root = old_k3s(node)
    result = plan(root, **TOPOLOGY)
    assert result["kubelet_args_only"] is True and result["distribution_version"] == "v1.31.4+k3s1"
    assert changed_paths(result) == [K3S_CONFIG]
    assert read(root, K3S_DIR + "/50-gpuharden.conf") is None
    assert change_of(result, K3S_CONFIG).after == (
        "# k3s agent configuration\nnode-label:\n  - gpuharden.io/distribution=k3s\nkubelet-arg:\n  - max-pods=200\n"
        "  - cpu-manager-policy=static\n  - topology-manager-policy=single-numa-node\n  - reserved-cpus=0-1\n")
    assert result["sources"]["topologyManagerPolicy"]["source_after"]["kind"] == "flag"
    assert result["persistence"] == "durable"
    applied(root, result)
    assert changed_paths(plan(root, **TOPOLOGY)) == []


def test_item13_k3s_before_1_32_keeps_its_own_eviction_flags_in_a_map(node):
    root = old_k3s(node)
    result = plan(root, settings={"evictionHard": {"memory.available": "500Mi"}, "kubeReserved": {"memory": "1Gi"}})
    after = change_of(result, K3S_CONFIG).after
    assert "  - eviction-hard=imagefs.available<5%,nodefs.available<5%,memory.available<500Mi\n" in after
    assert "  - kube-reserved=memory=1Gi\n" in after


def test_item13_k3s_config_yaml_d_list_gets_the_entries(node):
    root = old_k3s(node, **{K3S_CONFIG + ".d/20-gpu.yaml": "kubelet-arg+:\n  - cpu-manager-policy=none\n"})
    result = plan(root, **TOPOLOGY)
    assert change_of(result, K3S_CONFIG + ".d/20-gpu.yaml").after == (
        "kubelet-arg+:\n  - cpu-manager-policy=static\n  - topology-manager-policy=single-numa-node\n"
        "  - reserved-cpus=0-1\n")
    assert "cpu-manager-policy" not in change_of(result, K3S_CONFIG).after


def test_item13_unknown_k3s_version_is_not_guessed(node):
    root = node("k3s", **{K3S_BINARY: None})
    with pytest.raises(GpuhardenError, match="cannot tell the k3s version .*distribution_version"):
        plan(root, **TOPOLOGY)
    given = plan(root, distribution_version="v1.31.4+k3s1", **TOPOLOGY)
    assert given["kubelet_args_only"] is True and changed_paths(given) == [K3S_CONFIG]
    assert plan(root, distribution_version="v1.32.0+k3s1", **TOPOLOGY)["kubelet_args_only"] is False


def test_item13_version_comes_from_the_binary_through_run_command(node):
    root = node("k3s")
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, "k3s version v1.30.9+k3s2 (abcdef01)\ngo version go1.22.9\n", ""

    result = _kubelet.plan(_kubelet.NodeReader(str(root)), dict(TOPOLOGY), run_command=run)
    assert calls == [[str(root) + K3S_BINARY, "--version"]]
    assert result["distribution_version"] == "v1.30.9+k3s2" and result["kubelet_args_only"] is True
    with pytest.raises(GpuhardenError, match="rc=1"):
        _kubelet.plan(_kubelet.NodeReader(str(root)), dict(TOPOLOGY), run_command=lambda argv: (1, "", "boom"))


def test_item13_config_only_field_is_refused_on_old_k3s(node):
    with pytest.raises(GpuhardenError, match="memoryThrottlingFactor: k3s v1.31.4\\+k3s1 .*no flag"):
        plan(old_k3s(node), settings={"memoryThrottlingFactor": 0.9})


ITEM14 = [
    ("empty", "", "the kubelet config file is empty"),
    ("comments only", "# written by hand\n", "without apiVersion and kind"),
    ("no kind", "apiVersion: kubelet.config.k8s.io/v1beta1\ncpuManagerPolicy: none\n", "without kind"),
    ("no apiVersion", "kind: KubeletConfiguration\ncpuManagerPolicy: none\n", "without apiVersion"),
    ("neither", "cpuManagerPolicy: none\n", "without apiVersion and kind"),
]


@pytest.mark.parametrize(("case", "text", "message"), ITEM14, ids=[case[0] for case in ITEM14])
def test_item14_config_file_the_kubelet_refuses(node, case, text, message):
    root = node(**{CONFIG: text})
    before = tree_digest(root)
    result = run_module("kubelet_config", _module_args(root, TOPOLOGY), {})
    assert result.get("failed") is True, result
    assert result["msg"].startswith(CONFIG + ": ") and message in result["msg"], result["msg"]
    assert tree_digest(root) == before


def test_v1_is_not_a_kubelet_configuration_version(node):
    root = node(**{CONFIG: "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n"})
    with pytest.raises(GpuhardenError, match="apiVersion is 'kubelet.config.k8s.io/v1', expected"):
        plan(root, **TOPOLOGY)


MEMORY = {"memory_manager_policy": "Static"}
BASE_CONFIG = (FIXTURES / "kubeadm" / CONFIG.lstrip("/")).read_text()


def test_item15_reserved_memory_must_add_up_to_the_reservations(node):
    root = node()
    before = tree_digest(root)
    result = run_module("kubelet_config", _module_args(
        root, dict(MEMORY, reserved_memory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}])), {})
    assert result.get("failed") is True
    assert "reserves memory=1Gi over all NUMA nodes" in result["msg"]
    assert "evictionHard memory.available (the kubelet's default) 100Mi = 100Mi" in result["msg"]
    assert "memory_manager.go" in result["msg"]
    assert tree_digest(root) == before
    fine = plan(root, reserved_memory=[{"numaNode": 0, "limits": {"memory": "612Mi"}},
                                       {"numaNode": 1, "limits": {"memory": "512Mi"}}],
                settings={"kubeReserved": {"memory": "1Gi"}}, **MEMORY)
    assert changed_paths(fine) == [CONFIG]


def test_item15_effective_values_count_not_only_the_role_s(node):
    # The role reserves kubeReserved 1Gi + the default 100Mi eviction threshold, but on this node a flag raises the
    # threshold and the config file reserves memory for the system too.
    config = BASE_CONFIG + "systemReserved:\n  memory: 512Mi\n"
    flags = "KUBELET_EXTRA_ARGS=--eviction-hard=memory.available<200Mi,nodefs.available<10%\n"
    root = node(**{CONFIG: config, "/etc/default/kubelet": flags})
    role = dict(MEMORY, settings={"kubeReserved": {"memory": "1Gi"}})
    with pytest.raises(GpuhardenError, match=r"systemReserved.memory 512Mi \+ evictionHard memory.available "
                                             r"\(flag --eviction-hard=memory.available<200Mi"):
        plan(root, reserved_memory=[{"numaNode": 0, "limits": {"memory": "1124Mi"}}], **role)
    result = plan(root, reserved_memory=[{"numaNode": 0, "limits": {"memory": "1736Mi"}}], **role)
    assert changed_paths(result) == [CONFIG]


def test_item15_percentage_threshold_and_hugepages(node):
    root = node(**{CONFIG: BASE_CONFIG + "evictionHard:\n  memory.available: 10%\n",
                   "/proc/meminfo": "MemTotal:        1048576 kB\nMemFree:  1 kB\n"})
    # float32(10) / 100 of 1Gi, as the kubelet computes it: 107374184 bytes, not 107374182.4
    assert plan(root, reserved_memory=[{"numaNode": 0, "limits": {"memory": "107374184"}}], **MEMORY)["changes"]
    with pytest.raises(GpuhardenError, match="reserves hugepages-1Gi=2Gi"):
        plan(root, reserved_memory=[{"numaNode": 0, "limits": {"memory": "107374184", "hugepages-1Gi": "2Gi"}}],
             **MEMORY)
    write(root, CONFIG, BASE_CONFIG + "evictionHard:\n  nodefs.available: 10%\n")
    with pytest.raises(GpuhardenError, match="no memory.available"):
        plan(root, reserved_memory=[{"numaNode": 0, "limits": {"memory": "100Mi"}}], **MEMORY)


def test_item16_irregular_flag_names():
    assert {field: _kubelet.flag_for_field(field) for field in (
        "contentType", "registryPullQPS", "eventRecordQPS", "makeIPTablesUtilChains", "serverTLSBootstrap",
        "evictionHard")} == {
        "contentType": "kube-api-content-type", "registryPullQPS": "registry-qps", "eventRecordQPS": "event-qps",
        "makeIPTablesUtilChains": "make-iptables-util-chains", "serverTLSBootstrap": "rotate-server-certificates",
        "evictionHard": "eviction-hard"}


def test_item16_irregular_flag_is_found_and_fixed_where_it_lives(node):
    root = node(**{"/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--event-qps=5 --make-iptables-util-chains --max-pods=200\n"})
    result = plan(root, settings={"eventRecordQPS": 50, "makeIPTablesUtilChains": True})
    assert result["sources"]["eventRecordQPS"]["source_before"]["flag"] == "--event-qps=5"
    assert result["sources"]["makeIPTablesUtilChains"]["source_after"]["flag"] == "--make-iptables-util-chains"
    assert change_of(result, "/etc/default/kubelet").after == (
        "KUBELET_EXTRA_ARGS=--make-iptables-util-chains --max-pods=200\n")


def test_item16_eviction_hard_flag_uses_langle_and_agrees(node):
    root = node(**{"/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--eviction-hard=memory.available<500Mi,nodefs.available<10%\n"})
    result = plan(root, settings={"evictionHard": {"memory.available": "500Mi"}})
    assert result["sources"]["evictionHard.memory.available"]["before"] == "500Mi"
    assert "/etc/default/kubelet" not in changed_paths(result)
    assert result["restart_required"] is False


def test_item16_no_restart_when_a_flag_already_carries_the_value(node):
    root = node(**{"/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--topology-manager-policy=single-numa-node "
                                           "--topology-manager-policy-options=prefer-closest-numa-nodes=true\n",
                   "/var/lib/kubelet/cpu_manager_state": None})
    result = plan(root, topology_manager_policy="single-numa-node",
                  topology_manager_policy_options={"prefer-closest-numa-nodes": "true"})
    assert changed_paths(result) == [CONFIG]  # the file value is written too, for when the flag goes
    assert result["effective_changed"] is False
    assert result["restart_required"] is False
    assert plan(root, topology_manager_policy="restricted")["restart_required"] is True


# --------------------------------------------------------------------------------------------
# issue 43 item 7: kubeadm durability, the --config-dir route (what kubeadm v1.36.3 owns: _kubelet.KUBEADM_CONFIG)

KUBELET_BINARY = "/usr/local/bin/kubelet"  # the fixture unit's ExecStart program
EXTRA_ARGS_FILE = "/etc/default/kubelet"
ROUTE_DIR = "/etc/kubernetes/kubelet.conf.d"
ROUTE_DROPIN = ROUTE_DIR + "/50-gpuharden.conf"


def kubeadm_node(node, version="v1.36.3", **files):
    """The kubeadm fixture whose kubelet answers `--version` as the real one does ("Kubernetes v1.36.3")."""
    root = node("kubeadm", **files)
    write(root, KUBELET_BINARY, '#!/bin/sh\necho "Kubernetes %s"\n' % version)
    os.chmod(str(root) + KUBELET_BINARY, 0o755)
    return root


def test_kubeadm_route_adds_config_dir_where_kubeadm_never_writes(node):
    root = kubeadm_node(node)
    config_before = read(root, CONFIG)
    result = plan(root, **TOPOLOGY)
    assert changed_paths(result) == [EXTRA_ARGS_FILE, ROUTE_DROPIN]
    assert change_of(result, EXTRA_ARGS_FILE).before is None  # created: the unit's EnvironmentFile=- was absent
    assert change_of(result, EXTRA_ARGS_FILE).after == "KUBELET_EXTRA_ARGS=--config-dir=%s\n" % ROUTE_DIR
    assert yaml_of(change_of(result, ROUTE_DROPIN).after)["topologyManagerPolicy"] == "single-numa-node"
    assert result["persistence"] == "durable" and ROUTE_DIR in result["persistence_reason"]
    assert result["config_dir_route"] == {"config_dir": ROUTE_DIR, "file": EXTRA_ARGS_FILE, "variable": "KUBELET_EXTRA_ARGS",
                                          "kubelet_version": "v1.36.3"}
    assert result["sources"]["topologyManagerPolicy"]["source_after"] == {"kind": "dropin", "path": ROUTE_DROPIN}
    assert result["restart_required"] is True  # the flags change: restarted now, under the stage's health check
    assert _kubelet.kubeadm_upgrade_reverts(result) == {
        "fields": ["cpuManagerPolicy", "topologyManagerPolicy"], "values": {"cpuManagerPolicy": "none", "topologyManagerPolicy": "none"},
        "stops_kubelet": [], "fixed_by_plan": True}
    applied(root, result)
    assert read(root, CONFIG) == config_before  # kubeadm's file is left as kubeadm wrote it
    write(root, "/var/lib/kubelet/cpu_manager_state", '{"policyName": "static", "defaultCpuSet": "2-3", "checksum": 0}')
    again = plan(root, **TOPOLOGY)
    assert changed_paths(again) == [] and again["persistence"] == "durable" and again["config_dir_route"] is None
    assert again["restart_required"] is False
    assert _kubelet.kubeadm_upgrade_reverts(again) is None


def test_kubeadm_route_edits_the_extra_args_where_they_live_together_with_a_flag_fix(node):
    root = kubeadm_node(node, **{EXTRA_ARGS_FILE: '# site\nKUBELET_EXTRA_ARGS="--v=2 --topology-manager-policy=none"\nOTHER=1\n'})
    result = plan(root, topology_manager_policy="single-numa-node")
    assert change_of(result, EXTRA_ARGS_FILE).after == '# site\nKUBELET_EXTRA_ARGS="--v=2 --config-dir=%s"\nOTHER=1\n' % ROUTE_DIR
    assert changed_paths(result) == [EXTRA_ARGS_FILE, ROUTE_DROPIN]
    assert result["persistence"] == "durable"


def test_kubeadm_route_uses_the_rpm_sysconfig_file_the_unit_names(node):
    unit = "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf"
    root = kubeadm_node(node)
    write(root, unit, read(root, unit).replace("/etc/default/kubelet", "/etc/sysconfig/kubelet"))
    result = plan(root, topology_manager_policy="single-numa-node")
    assert changed_paths(result) == sorted(["/etc/sysconfig/kubelet", ROUTE_DROPIN])


@pytest.mark.parametrize(("case", "version", "files", "params", "why"), [
    ("kubelet before v1.32", "v1.31.4", {}, {}, "kubelet v1.31.4: gpuharden adds --config-dir only from v1.32"),
    ("unknown kubelet version", None, {}, {}, "cannot tell the kubelet's version"),
    ("directory with drop-ins the kubelet does not read yet", "v1.36.3",
     {ROUTE_DIR + "/10-site.conf": "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"}, {},
     "already holds drop-ins the kubelet does not read yet (10-site.conf)"),
    ("extra args from Environment= in the unit", "v1.36.3",
     {"/etc/systemd/system/kubelet.service.d/20-extra.conf": '[Service]\nEnvironment="KUBELET_EXTRA_ARGS=--v=2"\n'}, {},
     "KUBELET_EXTRA_ARGS is set by Environment=KUBELET_EXTRA_ARGS in /etc/systemd/system/kubelet.service.d/20-extra.conf"),
    ("ExecStart without $KUBELET_EXTRA_ARGS", "v1.36.3",
     {"/etc/systemd/system/kubelet.service.d/30-exec.conf":
      "[Service]\nExecStart=\nExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS\n"}, {},
     "would not reach the kubelet"),
    ("opted out", "v1.36.3", {}, {"kubeadm_config_dir": ""}, "option kubeadm_config_dir is empty"),
])
def test_kubeadm_route_not_taken_keeps_config_yaml_and_says_why(node, case, version, files, params, why):
    root = kubeadm_node(node, version, **files) if version else node("kubeadm", **files)
    result = plan(root, **dict(TOPOLOGY, **params))
    assert changed_paths(result) == [CONFIG], case
    assert result["config_dir_route"] is None
    assert result["persistence"] == "reverts_on_kubeadm_upgrade"
    assert why in result["persistence_reason"], result["persistence_reason"]
    # static lives in config.yaml now: a revert to the ConfigMap's none meets the kubelet's static checkpoint
    reverts = _kubelet.kubeadm_upgrade_reverts(result)
    assert reverts["stops_kubelet"] == ["cpuManagerPolicy"] and reverts["fixed_by_plan"] is False
    assert reverts["values"]["cpuManagerPolicy"] == "static"


def test_kubeadm_version_from_the_option_and_a_bad_one(node):
    root = node()  # no kubelet binary to ask
    result = plan(root, topology_manager_policy="single-numa-node", distribution_version="v1.33.2")
    assert result["config_dir_route"]["kubelet_version"] == "v1.33.2"
    with pytest.raises(GpuhardenError, match=r"option distribution_version='one-thirty': not a kubelet version"):
        plan(root, topology_manager_policy="single-numa-node", distribution_version="one-thirty")
    with pytest.raises(GpuhardenError, match=r"option kubeadm_config_dir=\"kubelet.conf.d\": must be an absolute directory"):
        plan(root, topology_manager_policy="single-numa-node", distribution_version="v1.33.2", kubeadm_config_dir="kubelet.conf.d")


def test_kubeadm_route_module_run_writes_both_files_and_backs_up_nothing_it_created(node):
    root = kubeadm_node(node)
    done = run_module("kubelet_config", _module_args(root, {"topology_manager_policy": "single-numa-node"}, backup=True), {})
    assert not done.get("failed"), done
    assert {entry["path"]: entry["action"] for entry in done["files"]} == {EXTRA_ARGS_FILE: "create", ROUTE_DROPIN: "create"}
    assert done["persistence"] == "durable" and "warnings" not in done
    assert read(root, EXTRA_ARGS_FILE) == "KUBELET_EXTRA_ARGS=--config-dir=%s\n" % ROUTE_DIR
    view = _kubelet.discover(_kubelet.NodeReader(str(root)))
    assert view["config_dir"] == ROUTE_DIR
    assert _kubelet.effective(view, ("topologyManagerPolicy",))["value"] == "single-numa-node"


def test_kubeadm_config_yaml_write_warns_about_its_persistence(node):
    done = run_module("kubelet_config", _module_args(node(), {"topology_manager_policy": "single-numa-node"}), {})
    assert done["persistence"] == "reverts_on_kubeadm_upgrade" and done["changed"] is True
    assert "kubelet_config: persistence reverts_on_kubeadm_upgrade" in str(done["warnings"])
