# SPDX-License-Identifier: GPL-3.0-or-later
"""Helpers for the cluster-side lab tests: run modules and playbooks with ansible-runner, read results from its
events, talk to the lab's apiserver as admin, and read what a lab node's kubelet runs with."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

import ansible_runner
import yaml
from gpuharden_lab import REPO_ROOT, manager
from gpuharden_lab.standins.kubelet import json_merge_patch
from kubernetes import client, config

from tests.labfixtures import discard_shared_lab

PLAYBOOKS = REPO_ROOT / "tests/integration/playbooks"
# kubeadm's kubelet config file, and where harden writes the kubelet's settings on the lab's kubeadm v1.36 nodes: its
# drop-in, which the kubelet reads through --config-dir in /etc/default/kubelet (the durable route,
# plugins/module_utils/node/_kubelet.py KUBEADM_CONFIG_DIR), over config.yaml.
KUBEADM_CONFIG = "/var/lib/kubelet/config.yaml"
GPUHARDEN_DROPIN = "/etc/kubernetes/kubelet.conf.d/50-gpuharden.conf"


def admin(state):
    return config.new_client_from_config(config_file=state["cluster"]["admin_kubeconfig"])


def token_kubeconfig(state, token, directory, name="gpuharden-sa.kubeconfig"):
    """A kubeconfig (mode 0600) for a bearer ``token`` against the lab's apiserver, TLS verified against the lab's CA."""
    with open(state["cluster"]["admin_kubeconfig"]) as handle:
        cluster = yaml.safe_load(handle)["clusters"][0]["cluster"]
    kubeconfig = {"apiVersion": "v1", "kind": "Config",
                  "clusters": [{"name": "lab", "cluster": {"server": cluster["server"],
                                                           "certificate-authority-data": cluster["certificate-authority-data"]}}],
                  "users": [{"name": "gpuharden", "user": {"token": token}}],
                  "contexts": [{"name": "gpuharden", "context": {"cluster": "lab", "user": "gpuharden"}}],
                  "current-context": "gpuharden"}
    path = os.path.join(directory, name)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        yaml.safe_dump(kubeconfig, handle)
    return path


def run(state, *, module=None, args=None, playbook=None, check=False, extravars=None, hosts="localhost"):
    """ansible-runner over the lab inventory: (results, stats, seconds). Module runs use this Python (it has the
    kubernetes client) on localhost."""
    envvars = {
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    extravars = dict(extravars or {})
    with tempfile.TemporaryDirectory(prefix="gpuharden-cluster-test-") as private:
        started = time.monotonic()
        if module:
            extravars.setdefault("ansible_python_interpreter", sys.executable)
            kwargs = {"module": module, "module_args": args, "host_pattern": hosts}
        else:
            kwargs = {"playbook": str(PLAYBOOKS / playbook)}
        runner = ansible_runner.run(
            private_data_dir=private, project_dir=str(REPO_ROOT), inventory=state["inventory"], envvars=envvars,
            extravars=extravars, cmdline="--check --diff" if check else None, quiet=True, **kwargs,
        )
        elapsed = time.monotonic() - started
        events = list(runner.events)
        stats = runner.stats or {}
    return results(events), stats, elapsed


def results(events, action=None):
    found = []
    for event in events:
        if event.get("event") not in ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable"):
            continue
        data = event["event_data"]
        if action and data.get("task_action") != action:
            continue
        found.append(dict(data.get("res") or {}, _host=data["host"], _event=event["event"], _task=data.get("task"),
                          _action=data.get("task_action")))
    return found


def failures(found):
    return [(r["_host"], r["_task"], r.get("msg")) for r in found if r["_event"] in ("runner_on_failed", "runner_on_unreachable")]


def module_args(**options):
    """Module arguments as the JSON ad-hoc ``-a`` accepts."""
    return json.dumps(options)


def wait_for(predicate, timeout=60.0, interval=0.5, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def ensure_namespace(core: client.CoreV1Api, name: str):
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except client.exceptions.ApiException as error:
        if error.status != 409:
            raise


def recap_changed(stdout: str) -> dict[str, int]:
    """{host: changed count} from ansible-playbook's PLAY RECAP."""
    recap = stdout[stdout.rfind("PLAY RECAP"):]
    return {line.split(":", 1)[0].strip(): int(line.split("changed=")[1].split()[0]) for line in recap.splitlines()[1:] if "changed=" in line}


def put_back(core: client.CoreV1Api, namespace: str, nodes, timeout: float = 120.0):
    """Give a shared lab back as the test found it: the test's namespace gone (the kubelets stopped its pods) and the
    nodes schedulable.  Where that fails, the next user gets a fresh lab (labfixtures.discard_shared_lab)."""
    try:
        for node in nodes:
            core.patch_node(node, {"spec": {"unschedulable": None}})
        try:
            core.delete_namespace(namespace)
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise

        def gone():
            try:
                core.read_namespace(namespace)
            except client.exceptions.ApiException as error:
                if error.status == 404:
                    return True
                raise
            return False

        wait_for(gone, timeout, interval=1.0, what="namespace %s deleted" % namespace)
    except Exception:
        discard_shared_lab()
        raise


class Sampler(threading.Thread):
    """Calls ``sample()`` every ``interval`` seconds while a run goes on (``with Sampler(...) as watcher:``), counting
    the samples; ``finish()`` runs once it has stopped."""

    interval = 0.2

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.samples = 0

    def sample(self):
        raise NotImplementedError

    def finish(self):
        pass

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.samples += 1
            self.stop.wait(self.interval)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(10)
        self.finish()


def run_on(state, node, command, check=True):
    """A shell command on a lab node over SSH; the finished process (with ``check``, a failure fails the test)."""
    done = manager.ssh(state["nodes"][node]["address"], command)
    if check:
        assert done.returncode == 0, "%s: %s: %s%s" % (node, command, done.stdout[-2000:], done.stderr[-2000:])
    return done


def kubelet_healthy(state, node):
    """The real kubelet answers its /healthz with ok."""
    done = run_on(state, node, "curl -sf --max-time 3 http://127.0.0.1:10248/healthz", check=False)
    return done.returncode == 0 and done.stdout.strip() == "ok"


def sh(state, node, command):
    """A shell command on a lab node over SSH; its stdout (a failure fails the test)."""
    done = manager.ssh(state["nodes"][node]["address"], command)
    assert done.returncode == 0, "%s: %s: %s" % (node, command, done.stderr)
    return done.stdout


def kubelet_config(state, node):
    """The kubelet's settings as its files give them: kubeadm's config.yaml with gpuharden's drop-in merged over it as
    the kubelet v1.36.3 merges each --config-dir drop-in (cmd/kubelet/app/server.go mergeKubeletConfigurations: an RFC
    7386 merge patch, the lab's json_merge_patch).  Read without a running kubelet, so also where it is stopped."""
    config = yaml.safe_load(sh(state, node, "cat %s" % KUBEADM_CONFIG))
    dropin = yaml.safe_load(sh(state, node, "cat %s 2>/dev/null || true" % GPUHARDEN_DROPIN)) or {}
    return json_merge_patch(config, dropin)


def kubelet_configz(state, node, timeout=60):
    """The configuration the real kubelet runs with, flags and drop-ins merged into its file: its /configz
    (kubernetes v1.36.3 pkg/kubelet/server/server.go), asked on the node with the admin's token, which the kubelet
    checks through the API server (the lab's kubelet config: webhook authentication and authorization)."""
    with open(state["cluster"]["admin_kubeconfig"]) as handle:
        token = yaml.safe_load(handle)["users"][0]["user"]["token"]
    command = "curl -sfk --max-time 5 -H 'Authorization: Bearer %s' https://127.0.0.1:10250/configz" % token
    # the kubelet may just have restarted: its server is not listening yet
    answer = wait_for(lambda: manager.ssh(state["nodes"][node]["address"], command).stdout, timeout=timeout, interval=2,
                      what="%s's kubelet to answer /configz" % node)
    return json.loads(answer)["kubeletconfig"]


def plugin_sees_the_node_s_pci_devices(state, namespace, daemonset):
    """The lab's one departure from a real node, for the device plugin's NUMA hints: a real node's sysfs shows every
    container its PCI devices, where the real plugin reads each GPU's numa_node (k8s-device-plugin v0.18.2
    internal/rm/nvml_devices.go; no file, no topology, and the kubelet aligns nothing).  A lab node's fixture devices
    are bound over /sys/bus/pci/devices in the node's mount namespace only (lab/src/gpuharden_lab/node.py), so the
    plugin's pods get that directory as a hostPath.  Returns whether the DaemonSet was patched (False: it had it)."""
    from kubernetes import client  # noqa: PLC0415

    api = admin(state)
    try:
        apps = client.AppsV1Api(api)
        volumes = apps.read_namespaced_daemon_set(daemonset, namespace).spec.template.spec.volumes or []
        if any(volume.name == "lab-pci-devices" for volume in volumes):
            return False  # the role's update keeps a volume it does not own
        apps.patch_namespaced_daemon_set(daemonset, namespace, [
            {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "lab-pci-devices", "hostPath": {"path": "/sys/bus/pci/devices"}}},
            {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-",
             "value": {"name": "lab-pci-devices", "mountPath": "/sys/bus/pci/devices", "readOnly": True}}])
        return True
    finally:
        api.close()
