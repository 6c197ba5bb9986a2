# SPDX-License-Identifier: GPL-3.0-or-later
"""Do no harm, on the fresh-fleet lab: the fleet-wide disruption budget, with the real kubelet and containerd.

4 fresh nodes on the real kubelet's default manager policies (the scenario's 8 would double these serial rollouts
and prove nothing more); the lab inventory opts into the static CPU Manager, so every node needs a drain.  A watcher
samples the Nodes every 0.2 s during each run and keeps the most nodes it saw cordoned at once.  (The admission check
and the kubelet restart count are in test_admission_and_restarts.py: one lab per test module.)
"""

from __future__ import annotations

import os
import sys
import tempfile

import ansible_runner
import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.cluster._disruption import unavailable_reasons
from gpuharden_lab import REPO_ROOT

from tests.integration.cluster_side import GPUHARDEN_DROPIN, Sampler, admin, kubelet_config, sh, wait_for
from tests.labfixtures import running_lab

# real_nodes: fresh-fleet's nodes run the real kubelet and containerd (they need real-components; `make real-nodes` runs only these).
pytestmark = [pytest.mark.lab, pytest.mark.real_nodes]

ENV = {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"), "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
FRESH = ["fresh-%d" % n for n in range(4)]


def harden(state, *, extravars=None, tags=None, limit=None):
    """harden_gpu_nodes.yml through ansible-runner: (rc, events, stats)."""
    events = []
    cmdline = ["--tags", ",".join(tags)] if tags else []
    with tempfile.TemporaryDirectory(prefix="gpuharden-disruption-test-") as private:
        runner = ansible_runner.run(private_data_dir=private, envvars=ENV, inventory=state["inventory"],
                                    playbook=str(REPO_ROOT / "playbooks/harden_gpu_nodes.yml"), extravars=extravars or {},
                                    cmdline=" ".join(cmdline) or None, limit=limit, quiet=True,
                                    event_handler=lambda event: events.append(event) or True)
        stats = runner.stats or {}
        output = runner.stdout.read()
    return runner.rc, events, stats, output


class CordonWatcher(Sampler):
    """Samples the Nodes while a run goes on: the most of ``names`` cordoned at once, and every node ever cordoned."""

    def __init__(self, state, names):
        from kubernetes import client

        super().__init__()
        self.core = client.CoreV1Api(admin(state))
        self.names = set(names)
        self.most = 0
        self.ever = set()

    def sample(self):
        cordoned = {node.metadata.name for node in self.core.list_node().items if node.metadata.name in self.names and node.spec.unschedulable}
        self.most = max(self.most, len(cordoned))
        self.ever |= cordoned


def reset_to_defaults(state, nodes):
    """Back to the kubelet's default manager policies (as the scenario starts), kubelet restarted: config.yaml without
    them and gpuharden's drop-in gone (its directory stays, read through --config-dir).  The static policy's
    checkpoint goes too, as an admin removes it: the real kubelet refuses to start on a checkpoint of another policy
    (pkg/kubelet/cm/cpumanager/state/state_checkpoint.go) and writes a new one."""
    for node in nodes:
        config = yaml.safe_load(sh(state, node, "cat /var/lib/kubelet/config.yaml"))
        for key in ("cpuManagerPolicy", "reservedSystemCPUs", "topologyManagerPolicy", "topologyManagerScope"):
            config.pop(key, None)
        sh(state, node, "systemctl stop kubelet && cat > /var/lib/kubelet/config.yaml <<'EOF'\n%sEOF\n"
                        "rm -f /var/lib/kubelet/cpu_manager_state /var/lib/kubelet/config.yaml.*~ %s %s.*~ && systemctl start kubelet"
                        % (yaml.safe_dump(config, sort_keys=False), GPUHARDEN_DROPIN, GPUHARDEN_DROPIN))
    core = _core(state)
    for node in nodes:
        core.patch_node(node, {"spec": {"unschedulable": None}})
    # The rollout takes the nodes that are already unavailable first (playbooks/harden_gpu_nodes.yml), so a node still
    # NotReady from its restart would become the canary in place of the one a test names: wait until each Node counts
    # as available by the budget's own rule.  (A cold make test once saw fresh-1 go first: still NotReady.)
    try:
        wait_for(lambda: not unavailable_nodes(core, nodes), timeout=120, what="the nodes available again after the reset")
    except AssertionError as error:
        raise AssertionError("%s: still unavailable %s" % (error, unavailable_nodes(core, nodes))) from None


def unavailable_nodes(core, nodes):
    """{node: reasons} for the nodes the disruption budget counts as unavailable (cordoned or not Ready)."""
    reasons = {}
    for node in nodes:
        found = unavailable_reasons(core.api_client.sanitize_for_serialization(core.read_node(node)))
        if found:
            reasons[node] = found
    return reasons


def plugin_generation(state):
    """The managed plugin DaemonSet's generation, None while there is none."""
    from kubernetes import client

    try:
        return client.AppsV1Api(admin(state)).read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system").metadata.generation
    except client.ApiException as error:
        assert error.status == 404, error
        return None


def _core(state):
    from kubernetes import client

    return client.CoreV1Api(admin(state))


def failed_hosts(events):
    return sorted({event["event_data"]["host"] for event in events
                   if event.get("event") == "runner_on_failed" and not event["event_data"].get("ignore_errors")})


@pytest.fixture(scope="module")
def fresh():
    with running_lab("fresh-fleet", node_count=len(FRESH)) as state:
        yield state


def test_default_budget_never_has_more_than_one_node_cordoned(fresh):
    before = {node: kubelet_config(fresh, node) for node in FRESH}
    assert all("cpuManagerPolicy" not in config for config in before.values())
    with CordonWatcher(fresh, FRESH) as watcher:
        rc, events, _stats, output = harden(fresh)
    assert rc == 0, output[-4000:]
    assert watcher.samples > 20
    assert watcher.most == 1, (watcher.most, sorted(watcher.ever))
    assert watcher.ever == set(FRESH)  # each node was drained, one at a time
    for node in FRESH:
        config = kubelet_config(fresh, node)
        assert config["cpuManagerPolicy"] == "static" and config["topologyManagerPolicy"] == "single-numa-node", node
    assert not _core(fresh).read_node(FRESH[0]).spec.unschedulable


def test_percentage_budget_never_exceeds_its_share(fresh):
    reset_to_defaults(fresh, FRESH)
    with CordonWatcher(fresh, FRESH) as watcher:
        rc, _events, _stats, output = harden(fresh, extravars={"gpuharden_max_unavailable": "50%"}, tags=["kubelet_topology"])
    assert rc == 0, output[-4000:]
    assert 1 <= watcher.most <= 2, (watcher.most, sorted(watcher.ever))
    assert watcher.ever == set(FRESH)


def test_failing_canary_stops_the_rollout_and_stays_cordoned(fresh):
    reset_to_defaults(fresh, FRESH)
    canary = FRESH[0]
    # A flag value the kubelet refuses ("invalid argument"): it does not come back after the restart, nor after the
    # rollback, which restores only the files the role wrote.
    sh(fresh, canary, "printf 'KUBELET_EXTRA_ARGS=--max-pods=lots\\n' > /etc/default/kubelet")
    others = {node: kubelet_config(fresh, node) for node in FRESH[1:]}
    plugin = plugin_generation(fresh)
    try:
        with CordonWatcher(fresh, FRESH) as watcher:
            # the device plugin stage too, with a change to its DaemonSet: a stopped rollout must not apply it (the
            # canary's kubelet is stopped, and the plugin's rolling update would hang on its old pod)
            rc, events, _stats, output = harden(fresh, extravars={"kubelet_topology_health_timeout": 10,
                                                                  "device_plugin_pull_policy": "Always"},
                                                tags=["kubelet_topology", "device_plugin"])
        assert rc != 0
        assert plugin_generation(fresh) == plugin
        assert failed_hosts(events)[0] == canary or canary in failed_hosts(events), failed_hosts(events)
        assert watcher.ever == {canary}, sorted(watcher.ever)
        assert _core(fresh).read_node(canary).spec.unschedulable, "the failed canary must stay cordoned"
        for node, config in others.items():
            assert kubelet_config(fresh, node) == config, node
        assert "rollout stopped: %s failed" % canary in output
    finally:
        sh(fresh, canary, "rm -f /etc/default/kubelet && systemctl restart kubelet")
