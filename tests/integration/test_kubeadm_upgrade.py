# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 43, kubeadm durability: the real `kubeadm upgrade node phase kubelet-config` (kubeadm built from the control
plane's own k8s.io/kubernetes module, `make real-kubeadm`) against the lab's real API server, on a fresh kubeadm-like
node running the real kubelet v1.36.

The node is first made what `kubeadm init`/`join` v1.36 leave: the kube-system/kubeadm-config and kubelet-config
ConfigMaps with the Roles and RoleBindings that let nodes read them (cmd/kubeadm/app/phases/uploadconfig,
phases/kubelet/config.go CreateConfigMap), the cluster CA at /etc/kubernetes/pki/ca.crt (kubeadm's kubelet defaults
name it as the client CA) and /var/lib/kubelet/instance-config.yaml (NodeLocalCRISocket, GA in v1.36).  The real phase
then runs once before gpuharden, so that config.yaml is kubeadm's own and the node is shown to survive the phase by
itself.

- Settings kept in config.yaml (the route to a drop-in turned off) with the static CPU Manager: drift says beforehand
  that a kubeadm upgrade would stop the kubelet on its checkpoint, and the real phase plus a restart does exactly that.
- A default harden: the settings go to a --config-dir drop-in enabled in /etc/default/kubelet; the real phase rewrites
  config.yaml and leaves those files alone, and after the restart the kubelet runs with gpuharden's settings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from gpuharden_lab import REPO_ROOT, layout, manager, realnode
from gpuharden_lab.system import LabError
from kubernetes import client

from tests.builds import skip_unbuilt
from tests.integration.cluster_side import admin, failures, kubelet_configz, kubelet_healthy, run, run_on, wait_for
from tests.labfixtures import running_lab

pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

NODE = "fresh-0"
CONFIG = "/var/lib/kubelet/config.yaml"
FLAGS_ENV = "/var/lib/kubelet/kubeadm-flags.env"
EXTRA_ARGS = "/etc/default/kubelet"
DROPIN = "/etc/kubernetes/kubelet.conf.d/50-gpuharden.conf"
CHECKPOINT = "/var/lib/kubelet/cpu_manager_state"
WATCHED = (CONFIG, FLAGS_ENV, EXTRA_ARGS, DROPIN)
ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}


@pytest.fixture(scope="module")
def lab():
    try:
        kubeadm = realnode.kubeadm_binary()
    except LabError:
        skip_unbuilt("kubeadm is not built: run `make real-kubeadm` (or `make real-components`)")
    if not realnode.available():
        skip_unbuilt("the real kubelet and containerd are not built: run `make real-lab` (or `make real-components`)")
    with running_lab("fresh-fleet", node_count=1) as state:
        state["kubeadm"] = str(kubeadm)
        as_kubeadm_leaves_it(state)
        yield state


def sh(state, command, check=True):
    return run_on(state, NODE, command, check)


def as_kubeadm_leaves_it(state):
    """What `kubeadm init` uploads and `kubeadm join` v1.36 writes on the node, with the admin identity."""
    config_text = sh(state, "cat %s" % CONFIG).stdout
    config = yaml.safe_load(config_text)
    cluster_configuration = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "ClusterConfiguration",
                             "kubernetesVersion": realnode.versions()["K8S_VERSION"], "certificatesDir": "/etc/kubernetes/pki",
                             "networking": {"serviceSubnet": "10.96.0.0/12", "dnsDomain": "cluster.local"}}
    core, rbac = client.CoreV1Api(admin(state)), client.RbacAuthorizationV1Api(admin(state))
    for name, key, text in (("kubeadm-config", "ClusterConfiguration", yaml.safe_dump(cluster_configuration)),
                            ("kubelet-config", "kubelet", config_text)):
        core.create_namespaced_config_map("kube-system", {"metadata": {"name": name}, "data": {key: text}})
        role = "kubeadm:nodes-kubeadm-config" if name == "kubeadm-config" else "kubeadm:kubelet-config"
        rbac.create_namespaced_role("kube-system", {
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [name], "verbs": ["get"]}]})
        rbac.create_namespaced_role_binding("kube-system", {
            "metadata": {"name": role}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "Group", "name": group} for group in ("system:bootstrappers:kubeadm:default-node-token", "system:nodes")]})
    ca = (layout.CONTROL_PLANE_DIR / "pki" / "ca.crt").read_text()
    sh(state, "mkdir -p /etc/kubernetes/pki && cat > /etc/kubernetes/pki/ca.crt <<'EOF'\n%sEOF\n" % ca)
    sh(state, "printf 'containerRuntimeEndpoint: \"%s\"\\n' > /var/lib/kubelet/instance-config.yaml" % config["containerRuntimeEndpoint"])
    # The node as kubeadm itself writes it: the real phase once, and the kubelet restarted on its config.yaml.
    done = kubeadm_upgrade_phase(state)
    assert "[upgrade/kubelet-config] The kubelet configuration for this node was successfully upgraded!" in done.stdout, done.stdout
    restart_kubelet(state)
    assert wait_healthy(state), kubelet_log(state)


def kubeadm_upgrade_phase(state):
    """The real `kubeadm upgrade node phase kubelet-config`, on the node, with its kubelet.conf identity (a worker)."""
    done = sh(state, "%s upgrade node phase kubelet-config 2>&1" % state["kubeadm"])
    return done


def restart_kubelet(state):
    sh(state, "systemctl restart kubelet")


def healthy(state):
    return kubelet_healthy(state, NODE)


def wait_healthy(state, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if healthy(state):
            return True
        time.sleep(2)
    return False


def kubelet_log(state, lines=40):
    return sh(state, "tail -n %d /var/log/kubelet.log" % lines, check=False).stdout


def digests(state):
    script = "for f in %s; do if [ -e $f ]; then echo $f $(sha256sum < $f | cut -c1-64); else echo $f -; fi; done" % " ".join(WATCHED)
    return dict(line.split(" ", 1) for line in sh(state, script).stdout.splitlines())


def drift(state, extravars=None):
    """`gpuharden drift` on the node, as an operator runs it (with the harden run's own variables): (exit code, the
    node's report)."""
    extra = ["-e", json.dumps(extravars)] if extravars else []
    done = subprocess.run([sys.executable, "-m", "gpuharden.cli", "drift", "-i", state["inventory"], "-l", NODE, *extra, "--json", "-q"],
                          cwd=REPO_ROOT, env=dict(os.environ, **ENV), capture_output=True, text=True, check=False, timeout=600)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as error:
        raise AssertionError("drift printed no JSON (rc %d): %s %s" % (done.returncode, done.stdout[-2000:], done.stderr[-2000:])) from error
    return done.returncode, report["nodes"][NODE]


def reverts_finding(node_report):
    return [entry for entry in node_report["findings"] if entry["id"] == "kubelet_reverts_on_kubeadm_upgrade"]


def test_settings_kept_in_config_yaml_drift_predicts_the_kubelet_refusing_its_checkpoint(lab):
    extravars = {"kubelet_topology_kubeadm_config_dir": "", "kubelet_topology_cpu_manager_policy": "static",
                 "kubelet_topology_reserved_system_cpus": "0"}
    found, _stats, _seconds = run(lab, playbook="kubelet_topology.yml", extravars=extravars)
    assert not failures(found), failures(found)
    assert wait_healthy(lab) and kubelet_configz(lab, NODE)["cpuManagerPolicy"] == "static"
    written = [result for result in found if result["_task"] == "Kubelet | write the configuration, restart the kubelet and wait until healthy"]
    assert written[0]["persistence"] == "reverts_on_kubeadm_upgrade", written
    assert '"policyName":"static"' in sh(lab, "cat %s" % CHECKPOINT).stdout
    # drift, beforehand, with the variables of that run: a kubeadm upgrade would stop the kubelet, and the stage
    # (its drop-in route turned off) cannot prevent it
    _rc, node = drift(lab, extravars)
    [revert] = reverts_finding(node)
    assert revert["severity"] == "error" and revert["remediable"] is False, revert
    assert "cpuManagerPolicy=static" in revert["found"] and "refuses its checkpoint" in revert["hint"]
    assert node["checks"]["kubelet"]["details"]["persistence"] == "reverts_on_kubeadm_upgrade"
    # with the default variables, the same prediction, and the stage would move the settings to its drop-in
    _rc, node = drift(lab, {"kubelet_topology_cpu_manager_policy": "static", "kubelet_topology_reserved_system_cpus": "0"})
    [revert] = reverts_finding(node)
    assert revert["severity"] == "error" and revert["remediable"] is True, revert
    assert node["checks"]["kubelet"]["details"]["persistence"] == "durable"
    # the real upgrade phase, then the restart an upgrade ends with: the kubelet refuses to start, as predicted
    kubeadm_upgrade_phase(lab)
    assert "cpuManagerPolicy" not in yaml.safe_load(sh(lab, "cat %s" % CONFIG).stdout)
    restart_kubelet(lab)
    # The real kubelet answers /healthz (a ping) before its container manager reads the checkpoint and exits on it
    # (kubernetes v1.36.3 cmd/kubelet/app/server.go run; pkg/kubelet/kubelet.go initializeRuntimeDependentModules), so
    # one probe may see "ok" in between (a loaded machine once did): wait for the refusal, with the kubelet down.
    wait_for(lambda: "could not restore state from checkpoint" in kubelet_log(lab) and not healthy(lab), timeout=90, interval=1,
             what="the kubelet to refuse its checkpoint and be down")
    # back to what kubeadm left (the admin's fix: the checkpoint goes), for the next test
    sh(lab, "systemctl stop kubelet && rm -f %s && systemctl start kubelet" % CHECKPOINT)
    assert wait_healthy(lab), kubelet_log(lab)


def test_after_a_default_harden_the_real_kubeadm_upgrade_keeps_gpuharden_s_settings(lab):
    done = manager.run_harden(lab["inventory"], {}, timeout=900, limit=NODE)
    assert done.returncode == 0, done.stdout[-6000:]
    assert "persistence durable" in done.stdout, done.stdout[-6000:]
    before = kubelet_configz(lab, NODE)
    assert before["topologyManagerPolicy"] == "single-numa-node"
    settings = {key: before.get(key) for key in ("topologyManagerPolicy", "topologyManagerScope", "memoryThrottlingFactor")}
    gates = before.get("featureGates", {})
    assert "--config-dir=/etc/kubernetes/kubelet.conf.d" in sh(lab, "cat %s" % EXTRA_ARGS).stdout
    # drift says the settings are durable
    _rc, node = drift(lab)
    assert reverts_finding(node) == [], node["findings"]
    assert node["checks"]["kubelet"]["details"]["persistence"] == "durable"
    # a hand edit in config.yaml, which the upgrade must take away: it rewrites that file whole from the ConfigMap
    sh(lab, "echo '# edited by hand' >> %s" % CONFIG)
    files = digests(lab)
    kubeadm_upgrade_phase(lab)
    after_phase = digests(lab)
    assert after_phase[CONFIG] != files[CONFIG] and "edited by hand" not in sh(lab, "cat %s" % CONFIG).stdout
    assert {path: after_phase[path] for path in (FLAGS_ENV, EXTRA_ARGS, DROPIN)} == {path: files[path] for path in (FLAGS_ENV, EXTRA_ARGS, DROPIN)}
    assert yaml.safe_load(sh(lab, "cat %s" % CONFIG).stdout).get("topologyManagerPolicy") in (None, "none")
    restart_kubelet(lab)
    assert wait_healthy(lab), kubelet_log(lab)
    after = kubelet_configz(lab, NODE)
    assert {key: after.get(key) for key in settings} == settings
    assert {gate: after.get("featureGates", {}).get(gate) for gate in gates} == gates
    _rc, node = drift(lab)
    assert node["checks"]["kubelet"]["status"] == "ok", node["checks"]["kubelet"]
