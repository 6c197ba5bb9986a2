# SPDX-License-Identifier: GPL-3.0-or-later
"""``api_retries`` in the results of every module that talks to the API server (issue 45 item 4): the requests the one
retry policy (_k8s.RetryPolicy) sent again, counted over the module's run by _module_shell.run_module, on success and on
failure; documented in each module's RETURN.  One real module run per family (a reader, the fleet planner, an object
writer, the drain) against a fake API server that throttles the first request as the API server's flow control does."""

from __future__ import annotations

import ast
import json
import pathlib

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core import _module_shell
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.k8s import _k8s

from tests.unit.conftest import run_module
from tests.unit.test_k8s_retry import ScriptedServer, ok

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# APF's rejection (k8s.io/apiserver v0.36.3 priority-and-fairness.go tooManyRequests), Retry-After 0 so no test waits
THROTTLED = (429, {"Retry-After": "0"}, b"Too many requests, please try again later.\n", "text/plain; charset=utf-8")


def api_modules():
    """The modules that talk to the API server: they require the Kubernetes client (some build theirs in module_utils,
    as gpu_consistency does through the one cluster check)."""
    return sorted(path for path in (REPO_ROOT / "plugins" / "modules").glob("*.py") if "_k8s.REQUIREMENT" in path.read_text(encoding="utf-8"))


def test_every_api_module_counts_and_documents_its_retries():
    modules = api_modules()
    assert len(modules) >= 9  # the walk finds them
    for path in modules:
        text = path.read_text(encoding="utf-8")
        assert "counters=_k8s.RESULT_COUNTERS" in text, "%s does not hand run_module the API counters" % path.name
        returns = next(yaml.safe_load(node.value.value) for node in ast.parse(text).body
                       if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "RETURN" for target in node.targets))
        assert returns.get("api_retries", {}).get("type") == "int" and returns["api_retries"]["returned"] == "always", path.name


class Module:
    """What run_module needs of an AnsibleModule: params, and an exit or a failure it records."""

    def __init__(self):
        self.params, self.ended = {}, None

    def exit_json(self, **result):
        self.ended = ("exit", result)
        raise SystemExit

    def fail_json(self, **result):
        self.ended = ("fail", result)
        raise SystemExit


class Counter:
    def __init__(self, total):
        self.total = total

    def __call__(self):
        return self.total


@pytest.mark.parametrize("fails", [False, True])
def test_run_module_reports_the_growth_of_each_counter_over_the_run(fails):
    counter, module = Counter(7), Module()  # 7 retries made before this run: not this run's

    def action(_module):
        counter.total += 2
        if fails:
            raise GpuhardenError("m: the API server failed", status=503)
        return {"changed": False}

    with pytest.raises(SystemExit):
        _module_shell.run_module(module, action, counters={"api_retries": counter})
    kind, result = module.ended
    assert (kind, result["api_retries"]) == ("fail" if fails else "exit", 2)
    if fails:
        assert result["status"] == 503 and result["msg"] == "m: the API server failed"


def test_the_process_total_counts_every_policys_retries():
    before = _k8s.retries_total()
    first, second = _k8s.RetryPolicy(sleep=lambda _s: None), _k8s.RetryPolicy(sleep=lambda _s: None)
    first.wait(0)
    second.wait(0)
    second.wait(0)
    assert (first.retries, second.retries, _k8s.retries_total() - before) == (1, 2, 3)
    assert _k8s.RESULT_COUNTERS["api_retries"] is _k8s.retries_total


NODE_LIST = {"kind": "NodeList", "metadata": {}, "items": [
    {"metadata": {"name": "gpu-1", "labels": {}}, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}]}
POD_LIST = {"kind": "PodList", "metadata": {}, "items": []}


@pytest.mark.parametrize(("module", "args", "answer", "fails"), [
    ("gpu_pods_info", {"nodes": ["gpu-1"]}, POD_LIST, False),  # a reader
    ("disruption_budget", {"fleet": ["gpu-1"], "batch": ["gpu-1"]}, NODE_LIST, False),  # the fleet planner
    ("runtime_class", {"name": "nvidia", "handler": "nvidia"}, {"kind": "Status", "code": 500, "message": "boom"}, True),  # an object writer
    ("node_maintenance", {"nodes": ["gpu-1"], "state": "cordoned"}, {"kind": "Status", "code": 500, "message": "boom"}, True),  # the drain
])
def test_a_throttled_request_is_retried_and_counted_in_the_result(module, args, answer, fails):
    script = [THROTTLED, ok(answer)] if not fails else [THROTTLED, (500, {}, json.dumps(answer).encode(), "application/json")]
    server = ScriptedServer(*script)
    try:
        result = run_module(module, dict(args, host=server.url, api_key="t", request_timeout=10), {})
    finally:
        server.close()
    assert result.get("failed", False) is fails, result
    # the first request was sent twice (throttled, then answered): one retry; a failing writer's 500s are retried too
    assert server.requests[0] == server.requests[1]
    if fails:  # a read that keeps failing: 5 attempts (RetryPolicy.attempts), 4 retries, then the failure as it was
        assert result["api_retries"] == 4 and len(server.requests) == 5 and "500" in result["msg"], result
    else:
        assert result["api_retries"] == 1, result
