# SPDX-License-Identifier: GPL-3.0-or-later
"""The operations files: example inventory, systemd drift units, drift CronJob, execution environment.

They are read by other tools (ansible-inventory, systemd, the API server, ansible-builder), so each test
feeds them to the real tool where there is one here, and checks them against what the collection really
accepts: role options and their types from meta/argument_specs.yml, the gpuharden_* variables the roles
read, the ServiceAccount of the shipped RBAC, the versions in galaxy.yml and pyproject.toml.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _role_options
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig

from gpuharden import drift_report
from gpuharden.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
INVENTORY = REPO / "inventories" / "example"
SYSTEMD = REPO / "deploy" / "systemd"
CRONJOB = REPO / "deploy" / "kubernetes" / "drift-cronjob.yaml"
RBAC = REPO / "deploy" / "rbac" / "gpuharden-rbac.yaml"
EE = REPO / "execution-environment.yml"
EE_DIR = REPO / "execution-environment"

SPDX = "SPDX-License-Identifier: GPL-3.0-or-later"
# Connection variables the example may set; anything else named ansible_* is a typo or a setting that
# belongs in ansible.cfg.
CONNECTION_VARS = {
    "ansible_host",
    "ansible_port",
    "ansible_user",
    "ansible_connection",
    "ansible_become",
    "ansible_become_method",
    "ansible_become_user",
    "ansible_ssh_private_key_file",
    "ansible_ssh_common_args",
    "ansible_python_interpreter",
}
# Variables Ansible itself defines, which templates in the inventory may use.
MAGIC_VARS = {"inventory_hostname", "inventory_hostname_short", "ansible_playbook_python", "groups", "group_names"}
DGX_HOSTS = {"dgx-a100-0%d.gpu.example.com" % n for n in range(1, 5)}
L4_HOSTS = {"l4-inf-0%d.edge.example.com" % n for n in range(1, 4)}


def ansible_env():
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    # A source that fails to parse is otherwise only a warning and an empty inventory.
    env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "true"
    env["ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED"] = "true"
    return env


def inventory_list(source):
    completed = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(source), "--list"],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def role_options():
    """{option: spec} over every entry point of every role."""
    options = {}
    for spec_file in sorted(REPO.glob("roles/*/meta/argument_specs.yml")):
        specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
        for entry in specs.values():
            for name, spec in (entry.get("options") or {}).items():
                options.setdefault(name, spec)
    return options


def gpuharden_vars_read():
    """gpuharden_* names used inside a Jinja expression in roles/ or playbooks/ (variables they read)."""
    names = set()
    files = list(REPO.glob("roles/*/*/*.yml")) + list(REPO.glob("playbooks/**/*.yml"))
    for path in files:
        text = path.read_text()
        expressions = re.findall(r"\{\{.*?\}\}", text, re.S)
        # when:/that: conditions are bare expressions
        expressions += re.findall(r"^\s*(?:when|that|- )\s*:?\s*(.*)$", text, re.M)
        for expression in expressions:
            names.update(re.findall(r"\bgpuharden_[a-z0-9_]+\b", expression))
    return names


def inventory_files():
    return sorted(INVENTORY.rglob("*.yml"))


def variables_set():
    """{file: {variable: value}} for group_vars/ and host_vars/ files, and hosts' own variables in hosts.yml."""
    found = {}
    for path in inventory_files():
        data = yaml.safe_load(path.read_text())
        if path.name == "hosts.yml":
            stack = [data["all"]]
            merged = {}
            while stack:
                group = stack.pop()
                merged.update(group.get("vars") or {})
                for host_vars in (group.get("hosts") or {}).values():
                    merged.update(host_vars or {})
                stack.extend((group.get("children") or {}).values())
            found[path] = merged
        else:
            found[path] = data or {}
    return found


def templated(value):
    return isinstance(value, str) and "{{" in value


def type_error(name, spec, value):
    """Why ``value`` does not fit the argument spec ``spec`` (None when it fits)."""
    kind = spec.get("type", "str")
    checks = {
        "str": lambda v: isinstance(v, str),
        "path": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "dict": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
        "raw": lambda v: True,
    }
    assert kind in checks, "%s: type %s not handled by this test" % (name, kind)
    if value is None:
        return None if "default" not in spec or spec["default"] is None else "%s is null" % name
    if not checks[kind](value):
        return "%s: %r is not a %s" % (name, value, kind)
    items = value if kind == "list" else [value]
    if kind == "list" and "elements" in spec:
        bad = [item for item in items if not checks[spec["elements"]](item)]
        if bad:
            return "%s: elements %r are not %s" % (name, bad, spec["elements"])
    if "choices" in spec:
        bad = [item for item in items if item not in spec["choices"]]
        if bad:
            return "%s: %r not among the choices %s" % (name, bad, spec["choices"])
    return None


# ---------------------------------------------------------------------------------------------------
# Example inventory


@pytest.fixture(scope="module")
def example():
    return inventory_list(INVENTORY)


def test_example_inventory_groups_and_hosts(example):
    assert sorted(example["gpu_nodes"]["children"]) == ["dgx_a100", "l4_inference"]
    assert set(example["dgx_a100"]["hosts"]) == DGX_HOSTS
    assert set(example["l4_inference"]["hosts"]) == L4_HOSTS
    assert "hosts" not in example.get("ungrouped", {})
    hostvars = example["_meta"]["hostvars"]
    assert set(hostvars) == DGX_HOSTS | L4_HOSTS


def test_example_inventory_uses_documentation_names_and_addresses(example):
    hostvars = example["_meta"]["hostvars"]
    for host, variables in hostvars.items():
        assert host.endswith(".example.com"), host
        address = variables["ansible_host"]
        assert address.startswith(("192.0.2.", "198.51.100.", "203.0.113.")), (host, address)
    assert len({variables["ansible_host"] for variables in hostvars.values()}) == len(hostvars)


def test_example_inventory_node_connection(example):
    hostvars = example["_meta"]["hostvars"]
    for host, variables in hostvars.items():
        assert variables["ansible_become"] is True, host
        assert variables["ansible_user"] != "root", host
        # the node tasks' Python is the venv's (playbooks/vars/node_python.yml), not the host's for everything
        assert variables["gpuharden_node_python"].startswith("/"), host
        assert "ansible_python_interpreter" not in variables, host
        assert "StrictHostKeyChecking=yes" in variables["ansible_ssh_common_args"], host
    # Controller settings reach the hosts (and the implicit localhost) through group all.
    all_vars = yaml.safe_load((INVENTORY / "group_vars" / "all.yml").read_text())
    assert "gpuharden_kubeconfig" in all_vars
    # Node-only connection settings must stay out of group all: the implicit localhost that cluster-side
    # tasks are delegated to reads it, and would ssh to itself with the node's Python.
    assert not {key for key in all_vars if key.startswith("ansible_")}


def test_example_inventory_every_key_is_known():
    options = role_options()
    read = gpuharden_vars_read()
    assert {"gpuharden_kubeconfig", "gpuharden_k8s_node_name"} <= read  # the scan works
    # the fleet-wide variables a role default follows in Python where it is left unset (core/_role_options.py FOLLOWED)
    followed = {name for follows, _default in _role_options.FOLLOWED.values() for name in follows}
    assert "gpuharden_mig_layout" in followed
    read |= followed
    unknown = []
    for path, variables in variables_set().items():
        for name in variables:
            if name in options or name in CONNECTION_VARS or (name.startswith("gpuharden_") and name in read):
                continue
            unknown.append("%s: %s" % (path.relative_to(REPO), name))
    assert not unknown, "variables no role option, gpuharden_* read or connection variable covers: %s" % unknown


def test_example_inventory_values_fit_the_argument_specs(example):
    options = role_options()
    errors = []
    for host, variables in example["_meta"]["hostvars"].items():
        for name, value in variables.items():
            if templated(value):
                for used in re.findall(r"\b[a-z_][a-z0-9_]*\b", value.split("{{", 1)[1].split("}}", 1)[0]):
                    if used not in variables and used not in MAGIC_VARS:
                        errors.append("%s: %s uses undefined %s" % (host, name, used))
                continue
            if name in options and (error := type_error(name, options[name], value)):
                errors.append("%s: %s" % (host, error))
    assert not errors, errors


def test_example_inventory_cross_field_rules(example):
    options = role_options()
    for host, variables in example["_meta"]["hostvars"].items():
        if variables.get("device_permissions_policy") == "restricted":
            assert variables.get("device_permissions_group") is not None, host
            group = str(variables["device_permissions_group"])
            # The unprivileged NVML post-check must be in that group, or it reports no_permission.
            assert group in [str(g) for g in variables.get("postcheck_unprivileged_groups", [])], host
        if variables.get("kubelet_topology_cpu_manager_policy") == "static":
            assert variables.get("kubelet_topology_reserved_system_cpus", options["kubelet_topology_reserved_system_cpus"]["default"])
        # The device plugin is one DaemonSet: every host must agree on the cluster-wide settings.
    for name in ("gpuharden_mig_strategy", "device_plugin_image_registry", "device_plugin_version", "device_plugin_taint"):
        values = {json.dumps(variables.get(name)) for variables in example["_meta"]["hostvars"].values()}
        assert len(values) == 1, (name, values)
    strategy = next(iter(example["_meta"]["hostvars"].values()))["gpuharden_mig_strategy"]
    assert strategy in options["mig_strategy"]["choices"]


def test_example_inventory_node_names(example):
    """Every role that names the Kubernetes node must get the same name for a host."""
    name_options = ("postcheck_node_name", "kubelet_topology_node_name")
    for host, variables in example["_meta"]["hostvars"].items():
        node_name = variables.get("gpuharden_k8s_node_name", host)
        if node_name == "{{ inventory_hostname_short }}":
            node_name = host.split(".")[0]
        for option in name_options:
            value = variables.get(option, host)
            if value == "{{ gpuharden_k8s_node_name }}":
                value = node_name
            assert value == node_name, (host, option, value, node_name)


def test_example_mig_layouts_fit_an_a100_80gb(example):
    table = _mig.BUILTIN_TABLES["A100-80GB"]
    gpus = [
        {"index": index, "name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": "00000000:%02X:00.0" % (0x07 + index),
         "pci_device_id": "0x20B210DE", "mig_capable": True}
        for index in range(8)
    ]
    hostvars = example["_meta"]["hostvars"]
    with_mig = 0
    for host, variables in hostvars.items():
        layout = variables.get("gpuharden_mig_layout")
        if host in L4_HOSTS:
            assert not layout, "%s: the L4 has no MIG" % host
            assert variables["postcheck_expected_mig_devices"] == 0
            continue
        assert variables["postcheck_expected_gpus"] == len(gpus)
        desired = _mig.resolve(_mig.parse_short(layout, source=host), gpus)
        devices = 0
        for gpu in gpus:
            want = desired[gpu["index"]]
            _mig.validate(gpu, want, table)
            if want["mig_enabled"]:
                devices += sum(want["mig_devices"].values())
        assert variables["postcheck_expected_mig_devices"] == devices, host
        with_mig += bool(devices)
        # The layout's profiles must be servable by the device plugin's strategy.
        assert variables["gpuharden_mig_strategy"] == "mixed" or devices == 0
    assert with_mig >= 1


# ---------------------------------------------------------------------------------------------------
# systemd units


def parse_unit(path):
    """{section: {key: [values]}} for a systemd unit file (repeated keys kept, continuation lines joined)."""
    sections = {}
    current = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("["):
            assert line.endswith("]"), line
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, "%s: assignment outside a section: %s" % (path.name, line)
        key, sep, value = line.partition("=")
        assert sep, "%s: not an assignment: %s" % (path.name, line)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(section, key):
    values = section[key]
    assert len(values) == 1, (key, values)
    return values[0]


def service_environment(service):
    env = {}
    for assignment in service.get("Environment", []):
        for word in shlex.split(assignment):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def parse_cli(words):
    """The CLI's own parser on a `gpuharden ...` command line (argparse exits 2 on anything it rejects)."""
    return build_parser().parse_args(words[1:])


def expand(argv, env):
    """systemd's ExecStart expansion: ${VAR} is one word, $VAR splits at whitespace."""
    words = []
    for word in argv:
        if re.fullmatch(r"\$\{\w+\}", word):
            words.append(env[word[2:-1]])
        elif re.fullmatch(r"\$\w+", word):
            words.extend(env[word[1:]].split())
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word))
    return words


@pytest.fixture(scope="module")
def service():
    return parse_unit(SYSTEMD / "gpuharden-drift.service")


def test_service_runs_gpuharden_drift(service):
    unit = service["Service"]
    assert one(unit, "Type") == "oneshot"
    argv = shlex.split(one(unit, "ExecStart"))
    assert argv[0].startswith("/") and argv[0].endswith("/gpuharden"), argv
    assert argv[1] == "drift"
    env = service_environment(unit)
    words = expand(argv, env)
    assert "--remediate" not in words, "a timer must not change nodes"
    options = dict(zip(words[2::2], words[3::2], strict=False))
    assert options["-i"] == "/etc/gpuharden/inventory"
    assert options["--report"] == "/var/lib/gpuharden/drift-report.json"
    assert options["--prometheus"].endswith(".prom")
    assert int(options["-f"]) > 0
    parsed = parse_cli(words)
    assert (parsed.inventory, parsed.report, parsed.prometheus) == (options["-i"], options["--report"], options["--prometheus"])
    assert not parsed.remediate
    # GPUHARDEN_DRIFT_ARGS as drift.env.example suggests it.
    example = re.search(r"^#GPUHARDEN_DRIFT_ARGS=(.+)$", (SYSTEMD / "drift.env.example").read_text(), re.M).group(1)
    env["GPUHARDEN_DRIFT_ARGS"] = example
    parsed = parse_cli(expand(argv, env))
    assert (parsed.limit, parsed.fail_severity, parsed.quiet) == ("dgx_a100", "error", True), example
    # The environment file can override every default, and is optional.
    assert one(unit, "EnvironmentFile") == "-/etc/gpuharden/drift.env"


def test_service_exit_status(service):
    unit = service["Service"]
    success = " ".join(unit["SuccessExitStatus"]).split()
    assert "1" in success, "drift (exit 1) must not fail the unit"
    assert "2" not in success, "a usage or environment error (exit 2) must fail the unit"
    assert str(drift_report.EXIT_NOT_CHECKED) not in success, "a run that could not check something (exit 4) must fail the unit"


def test_service_hardening_leaves_the_outputs_writable(service):
    unit = service["Service"]
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
    }
    for key, value in expected.items():
        assert one(unit, key) == value, key
    assert unit["CapabilityBoundingSet"] == [""]
    assert one(unit, "User") not in ("root", "0")
    families = one(unit, "RestrictAddressFamilies").split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families), "ssh needs these"
    env = service_environment(unit)
    writable = [path.lstrip("-") for path in " ".join(unit.get("ReadWritePaths", [])).split()]
    writable += ["/var/lib/" + one(unit, "StateDirectory"), "/var/cache/" + one(unit, "CacheDirectory")]
    for output in (env["GPUHARDEN_DRIFT_REPORT"], env["GPUHARDEN_DRIFT_PROMETHEUS"]):
        assert any(Path(output).parent == Path(path) or Path(path) in Path(output).parents for path in writable), output
    assert env["ANSIBLE_HOME"].startswith("%C/" + one(unit, "CacheDirectory"))


def test_env_example_names_only_known_settings(service):
    env = service_environment(service["Service"])
    text = (SYSTEMD / "drift.env.example").read_text()
    assert SPDX in text
    names = re.findall(r"^#?([A-Z][A-Z0-9_]*)=", text, re.M)
    assert names
    for name in names:
        assert name in env or name.startswith("ANSIBLE_"), name
    for name in env:
        if name.startswith("GPUHARDEN_"):
            assert name in names, "%s is not documented in drift.env.example" % name


def test_timer_starts_the_service():
    timer = parse_unit(SYSTEMD / "gpuharden-drift.timer")
    section = timer["Timer"]
    assert one(section, "Unit") == "gpuharden-drift.service"
    assert (SYSTEMD / one(section, "Unit")).is_file()
    assert one(section, "OnCalendar")
    assert one(section, "Persistent") == "true"
    assert re.fullmatch(r"\d+(min|h|s)?", one(section, "RandomizedDelaySec"))
    assert one(timer["Install"], "WantedBy") == "timers.target"


# ---------------------------------------------------------------------------------------------------
# Kubernetes CronJob


@pytest.fixture(scope="module")
def manifests():
    # One document, a List (as the RBAC file): ansible-test's yamllint refuses multi-document files.
    (listing,) = [doc for doc in yaml.safe_load_all(CRONJOB.read_text()) if doc]
    assert listing["apiVersion"] == "v1" and listing["kind"] == "List"
    documents = listing["items"]
    return {doc["kind"]: doc for doc in documents}, documents


def rbac_service_account():
    rbac = yaml.safe_load(RBAC.read_text())
    accounts = [item for item in rbac["items"] if item["kind"] == "ServiceAccount"]
    assert len(accounts) == 1
    return accounts[0]


def test_rbac_reads_gpu_operator_clusterpolicies_only():
    """device_plugin tells a GPU Operator install by its ClusterPolicies: get/list, never a write (it must not touch
    what the operator owns)."""
    rbac = yaml.safe_load(RBAC.read_text())
    (cluster_role,) = [item for item in rbac["items"] if item["kind"] == "ClusterRole"]
    rules = [rule for item in rbac["items"] if item["kind"] in ("ClusterRole", "Role") for rule in item["rules"]
             if "nvidia.com" in rule["apiGroups"]]
    assert rules == [{"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"], "verbs": ["get", "list"]}]
    assert rules[0] in cluster_role["rules"]
    runtime_classes = [rule for rule in cluster_role["rules"] if "runtimeclasses" in rule["resources"]]
    assert runtime_classes and "get" in runtime_classes[0]["verbs"]  # device_plugin reads the RuntimeClass its pods name


def test_cronjob_identity_and_schedule(manifests):
    kinds, documents = manifests
    assert "Secret" not in kinds, "no key material in the repository"
    assert {"ConfigMap", "CronJob"} <= set(kinds)
    for doc in documents:
        assert doc["metadata"]["namespace"] == rbac_service_account()["metadata"]["namespace"], doc["kind"]
    cronjob = kinds["CronJob"]["spec"]
    assert cronjob["concurrencyPolicy"] == "Forbid"
    assert len(cronjob["schedule"].split()) == 5
    pod = cronjob["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == rbac_service_account()["metadata"]["name"]
    if rbac_service_account().get("automountServiceAccountToken") is False:
        assert pod["automountServiceAccountToken"] is True, "the ServiceAccount turns the token off; the pod needs it"


def test_cronjob_security_context(manifests):
    kinds, _ = manifests
    pod = kinds["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context.get("privileged", False) is False
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), kind


def test_cronjob_command_volumes_and_secret(manifests):
    kinds, _ = manifests
    job = kinds["CronJob"]["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    # The command is a shell that pushes the metrics and counts drift as systemd does (tests/unit/test_incluster.py).
    assert container["command"][:2] == ["/bin/sh", "-c"]
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    line = re.search(r"^gpuharden drift .*?(?<!\\)$", container["command"][2], re.M | re.S).group(0).replace("\\\n", " ")
    argv = [word.replace("$REPORTS", env["REPORTS"]) for word in shlex.split(line)]
    assert argv[:2] == ["gpuharden", "drift"]
    parsed = parse_cli(argv)
    assert not parsed.remediate
    options = dict(zip(argv[2::2], argv[3::2], strict=False))
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    assert {mount["name"] for mount in mounts.values()} <= set(volumes)

    def mount_of(path):
        found = [m for p, m in mounts.items() if Path(p) == Path(path) or Path(p) in Path(path).parents]
        assert found, "%s is on no volume" % path
        return found[0]

    assert mount_of(options["-i"])["mountPath"] == options["-i"]
    for output in (options["--report"], options["--prometheus"]):
        mount = mount_of(output)
        assert not mount.get("readOnly"), output
        assert "persistentVolumeClaim" in volumes[mount["name"]], "the report must outlive the pod"
        claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
        assert kinds["PersistentVolumeClaim"]["metadata"]["name"] == claim
    # A writable /tmp for Ansible and the runner under the read-only root.
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert {"name": "ANSIBLE_HOME", "value": "/tmp/ansible"} in container["env"]

    # The inventory's ssh settings point into the mounted key and known_hosts.
    inventory = yaml.safe_load(kinds["ConfigMap"]["data"]["hosts.yml"])
    node_vars = inventory["all"]["children"]["gpu_nodes"]["vars"]
    key_mount = mount_of(node_vars["ansible_ssh_private_key_file"])
    secret = volumes[key_mount["name"]]["secret"]
    assert secret["defaultMode"] == 0o400
    assert Path(node_vars["ansible_ssh_private_key_file"]).name in [item["path"] for item in secret["items"]]
    assert key_mount["readOnly"] is True
    known_hosts = re.search(r"UserKnownHostsFile=(\S+)", node_vars["ansible_ssh_common_args"]).group(1)
    mount_of(known_hosts)
    # ConfigMap volumes only name keys the ConfigMap has; known_hosts is kept out of the inventory directory.
    for volume in volumes.values():
        if "configMap" in volume:
            assert volume["configMap"]["name"] == kinds["ConfigMap"]["metadata"]["name"]
            for item in volume["configMap"]["items"]:
                assert item["key"] in kinds["ConfigMap"]["data"]
    inventory_volume = volumes[mount_of(options["-i"])["name"]]
    assert [item["key"] for item in inventory_volume["configMap"]["items"]] == ["hosts.yml"]
    # In the cluster the API steps use the pod's token.
    assert inventory["all"]["vars"]["gpuharden_kubeconfig"] == ""

    # Usage errors (2) and blind runs (4) are final; drift (1) leaves the pod with 0; podFailurePolicy needs restartPolicy Never.
    assert pod["restartPolicy"] == "Never"
    rules = job["podFailurePolicy"]["rules"]
    exit_rule = next(rule for rule in rules if "onExitCodes" in rule)
    assert exit_rule["onExitCodes"]["containerName"] == container["name"]
    assert set(exit_rule["onExitCodes"]["values"]) == {2, 4}


def test_cronjob_inventory_parses(manifests, tmp_path):
    kinds, _ = manifests
    (tmp_path / "hosts.yml").write_text(kinds["ConfigMap"]["data"]["hosts.yml"])
    listed = inventory_list(tmp_path / "hosts.yml")
    assert set(listed["gpu_nodes"]["children"]) == {"dgx_a100", "l4_inference"}
    assert listed["_meta"]["hostvars"]


# ---------------------------------------------------------------------------------------------------
# Execution environment


@pytest.fixture(scope="module")
def ee():
    return yaml.safe_load(EE.read_text())


def requirement_specs(path):
    specs = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, spec = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", line).groups()
            specs[name.lower()] = spec.replace(" ", "")
    return specs


def test_ee_dependencies(ee):
    assert ee["version"] == 3
    deps = ee["dependencies"]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = {}
    for requirement in pyproject["project"]["dependencies"]:
        name, spec = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", requirement).groups()
        project[name.lower()] = spec.replace(" ", "")
    assert deps["ansible_core"]["package_pip"] == "ansible-core" + project["ansible-core"]
    assert "2.19" in deps["ansible_core"]["package_pip"]
    assert deps["ansible_runner"]["package_pip"] == "ansible-runner" + project["ansible-runner"]
    for key in ("galaxy", "python", "system"):
        assert (REPO / deps[key]).is_file(), deps[key]
    python = requirement_specs(REPO / deps["python"])
    assert "kubernetes" in python
    assert "nvidia-ml-py" not in python, "NVML runs on the nodes, never on the controller"
    for name, spec in python.items():
        assert project.get(name) == spec, "%s: %s here, %s in pyproject.toml" % (name, spec, project.get(name))
    bindep = (REPO / deps["system"]).read_text()
    assert re.search(r"^openssh-client\b", bindep, re.M)
    assert re.search(r"^openssh-clients \[platform:rpm\]", bindep, re.M), "the package name on the RPM base image"


def test_ee_collection_is_the_one_galaxy_yml_builds(ee):
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    requirements = yaml.safe_load((REPO / ee["dependencies"]["galaxy"]).read_text())
    (entry,) = requirements["collections"]
    assert entry["type"] == "file"
    assert Path(entry["name"]).name == "%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"])
    destinations = {Path(item["src"]).suffix: item["dest"] for item in ee["additional_build_files"]}
    assert Path(entry["name"]).parent == Path(destinations[".gz"])


def test_ops_files_carry_the_spdx_header():
    files = [EE, CRONJOB, *EE_DIR.iterdir(), *SYSTEMD.iterdir(), *inventory_files()]
    for path in files:
        assert SPDX in path.read_text().splitlines()[0], path


def test_ansible_builder_creates_the_context(ee, tmp_path):
    """`ansible-builder create` with the real collection tarball; then the galaxy stage's install, run here.

    create only copies the CLI's wheel into the context, so a placeholder of the right name stands in
    for it (building the real wheel needs setuptools from the package index).
    """
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(EE, project / EE.name)
    shutil.copytree(EE_DIR, project / EE_DIR.name)
    dist = project / "dist"
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist), str(REPO)],
        env=ansible_env(),
        capture_output=True,
        check=True,
    )
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    (dist / ("gpuharden-%s-py3-none-any.whl" % version)).write_bytes(b"placeholder")

    context = tmp_path / "context"
    completed = subprocess.run(
        [str(BIN / "ansible-builder"), "create", "--file", str(project / EE.name), "--context", str(context),
         "--output-filename", "Containerfile"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "No matches" not in completed.stdout + completed.stderr, "an additional_build_files glob matched nothing"
    containerfile = (context / "Containerfile").read_text()
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core>=2.19,<2.21 ansible-runner>=2.4,<3"' in containerfile
    assert "ansible-galaxy collection install" in containerfile and "-r requirements.yml" in containerfile
    assert "--user-pip=requirements.txt" in containerfile and "--user-bindep=bindep.txt" in containerfile
    assert "COPY _build/wheels/ /tmp/gpuharden-wheels/" in containerfile
    assert re.search(r"pip install .*gpuharden-\*-py3-none-any\.whl", containerfile)
    assert "USER 1000" in containerfile
    build = context / "_build"
    assert "kubernetes" in (build / "requirements.txt").read_text()
    assert "openssh-clients" in (build / "bindep.txt").read_text()
    assert (build / "wheels" / ("gpuharden-%s-py3-none-any.whl" % version)).is_file()

    # The galaxy stage: `COPY _build /build`, `WORKDIR /build`, install -r requirements.yml. Only the
    # target is a collections path here, or the checkout's link would count as "already installed".
    target = tmp_path / "collections"
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    env["ANSIBLE_COLLECTIONS_PATH"] = str(target)
    completed = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "-r", "requirements.yml", "-p", str(target)],
        cwd=build,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    manifest = json.loads((target / "ansible_collections" / "gpuharden" / "k8s" / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["version"] == yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    with tarfile.open(next((build / "collections").glob("*.tar.gz"))) as tarball:
        assert "roles/postcheck/meta/argument_specs.yml" in tarball.getnames()
