"""plugin_utils/_handover.py: a hand-over is taken only in the run that handed it over."""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.plugin_utils import _handover


def test_a_hand_over_is_taken_in_the_run_that_made_it():
    facts = _handover.handed_over("__stage_result", {"drain": True})
    assert _handover.taken_over(facts, "__stage_result") == {"drain": True}
    # Ansible without INJECT_FACTS_AS_VARS: under ansible_facts only
    assert _handover.taken_over({"ansible_facts": facts}, "__stage_result") == {"drain": True}


def test_a_hand_over_from_another_run_is_never_taken():
    """A fact cache keeps host facts from one run to the next: the earlier run's hand-over decides nothing now."""
    earlier = dict(_handover.this_run(), pid=1, start=0)
    facts = _handover.handed_over("__stage_result", {"drain": True}, run=earlier)
    assert _handover.taken_over(facts, "__stage_result", default="none") == "none"
    assert _handover.taken_over(facts, "__stage_result", run=earlier) == {"drain": True}


def test_a_missing_or_unstamped_value_is_the_default():
    assert _handover.taken_over({}, "__stage_result") is None
    assert _handover.taken_over({"__stage_result": {"drain": True}}, "__stage_result", default={}) == {}
    assert _handover.taken_over({"ansible_facts": "not a mapping"}, "__stage_result", default=0) == 0


def test_the_run_stamp_is_the_same_process_each_time():
    first, second = _handover.this_run(), _handover.this_run()
    assert first == second and first["pid"] and first["start"] is not None


def test_a_failed_module_run_s_result_is_handed_over_as_plain_data_the_fact_cache_keeps():
    """ansible-core 2.19 serialises host facts (the in-memory cache too): a failed run's captured exception object
    would stop ansible-playbook with an unexpected error instead of the step's failure being reported."""
    import json

    import pytest
    from ansible._internal._errors import _captured
    from ansible._internal._json._profiles import _cache_persistence

    failed = {"failed": True, "msg": "401 Unauthorized", "exception": "Traceback (most recent call last):\n  boom\n",
              "listed": {"nodes": ("gpu-a",), "odd": object()}}
    _captured.AnsibleModuleCapturedError.normalize_result_exception(failed)
    with pytest.raises(TypeError):
        json.dumps(failed, cls=_cache_persistence.Encoder)
    facts = _handover.handed_over("__stage_result", failed)
    assert json.loads(json.dumps(facts, cls=_cache_persistence.Encoder), cls=_cache_persistence.Decoder) == facts
    assert _handover.taken_over(facts, "__stage_result") == {"failed": True, "msg": "401 Unauthorized", "listed": {"nodes": ["gpu-a"]}}
