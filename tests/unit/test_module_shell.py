# SPDX-License-Identifier: GPL-3.0-or-later
"""_module_shell.run_module: what every module's main() turns a result, a GpuhardenError or a missing library into."""

from __future__ import annotations

import pytest
from ansible.module_utils.basic import missing_required_lib
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._module_shell import run_module


class Ended(Exception):
    def __init__(self, how, result):
        super().__init__(how)
        self.how, self.result = how, result


class FakeModule:
    """fail_json/exit_json end the run, as AnsibleModule's do (there: sys.exit)."""

    def __init__(self, params=None):
        self.params = params or {}

    def fail_json(self, **result):
        raise Ended("fail", result)

    def exit_json(self, **result):
        raise Ended("exit", result)


def end(*args, **kwargs):
    with pytest.raises(Ended) as ended:
        run_module(*args, **kwargs)
    return ended.value.how, ended.value.result


def test_result_is_the_exit_as_is():
    assert end(FakeModule(), lambda module: {"changed": True, "n": 1}) == ("exit", {"changed": True, "n": 1})


def test_never_changed_says_unchanged():
    assert end(FakeModule(), lambda module: {"n": 1}, never_changed=True) == ("exit", {"changed": False, "n": 1})


def test_missing_library_fails_before_the_action():
    def action(module):
        raise AssertionError("must not run")

    requires = [("tomlkit", True, None), ("kubernetes", False, "Traceback: no kubernetes"), ("yaml", False, "x")]
    how, result = end(FakeModule(), action, requires=requires)
    assert how == "fail"
    assert result == {"msg": missing_required_lib("kubernetes"), "exception": "Traceback: no kubernetes"}


def test_error_fails_with_its_message_traceback_and_partial_result():
    def action(module):
        raise GpuhardenError("node n1: cannot read /x", api_requests=3)

    how, result = end(FakeModule(), action, never_changed=True)
    assert how == "fail"
    assert result["msg"] == "node n1: cannot read /x" and result["api_requests"] == 3
    assert "GpuhardenError: node n1: cannot read /x" in result["exception"]
    assert "changed" not in result


def test_fail_when_reports_the_whole_result():
    def fail_when(params, result):
        return "too many: %d > %d" % (result["n"], params["limit"]) if result["n"] > params["limit"] else None

    assert end(FakeModule({"limit": 1}), lambda module: {"n": 2}, never_changed=True, fail_when=fail_when) == (
        "fail", {"msg": "too many: 2 > 1", "changed": False, "n": 2})
    assert end(FakeModule({"limit": 2}), lambda module: {"n": 2}, never_changed=True, fail_when=fail_when) == (
        "exit", {"changed": False, "n": 2})
