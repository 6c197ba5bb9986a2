# SPDX-License-Identifier: GPL-3.0-or-later
"""The pure MIG planner: both input forms, resolution, validation, minimal plans, device-plugin strategies."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig

FIXTURES = Path(__file__).parent / "fixtures" / "mig"
EXAMPLES = ["all-disabled", "all-enabled", "all-1g.10gb", "all-2g.20gb", "all-3g.40gb", "all-balanced",
            "mixed-per-index"]
TABLE = _mig.BUILTIN_TABLES["A100-80GB"]
A100 = "0x20B210DE"


def example(name):
    return yaml.safe_load((FIXTURES / (name + ".yaml")).read_text())


def gpu(index, mode=0, pending=None, instances=(), processes=(), capable=True, device_id=A100):
    return {
        "index": index, "name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": "00000000:%02X:00.0" % (7 + index),
        "pci_device_id": device_id, "mig_capable": capable, "mode_current": mode if capable else None,
        "mode_pending": (mode if pending is None else pending) if capable else None,
        "profile_table": TABLE if capable else None,
        "gpu_instances": [dict(gi, compute_instances=gi.get("compute_instances", [{"id": 0}])) for gi in instances],
        "processes": [{"pid": pid} for pid in processes],
    }


def gi(gi_id, profile, start):
    return {"id": gi_id, "profile": profile, "profile_id": TABLE[profile]["id"], "start": start,
            "size": TABLE[profile]["size"]}


EXPECTED = {
    "all-disabled": {i: (False, {}) for i in range(8)},
    "all-enabled": {i: (True, {}) for i in range(8)},
    "all-1g.10gb": {i: (True, {"1g.10gb": 7}) for i in range(8)},
    "all-2g.20gb": {i: (True, {"2g.20gb": 3}) for i in range(8)},
    "all-3g.40gb": {i: (True, {"3g.40gb": 2}) for i in range(8)},
    "all-balanced": {i: (True, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}) for i in range(8)},
    "mixed-per-index": {0: (True, {"1g.10gb": 7}), 1: (True, {"3g.40gb": 1, "4g.40gb": 1}), 2: (False, {}),
                        3: (True, {"1g.20gb": 1, "2g.20gb": 2, "1g.10gb": 1})},
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_mig_parted_examples_parse_and_resolve(name):
    entries = _mig.parse_mig_parted(example(name), name, str(FIXTURES / name))
    gpus = [gpu(i) for i in range(8)]
    desired = _mig.resolve(entries, gpus)
    assert {i: (d["mig_enabled"], d["mig_devices"]) for i, d in desired.items()} == EXPECTED[name]
    for index, want in desired.items():
        placed = _mig.validate(gpus[index], want, TABLE)
        assert len(placed) == sum(want["mig_devices"].values())


def test_short_form_is_the_same_plan_as_mig_parted():
    short = _mig.parse_short({"all": {"1g.10gb": 7}})
    parted = _mig.parse_mig_parted(example("all-1g.10gb"), "all-1g.10gb")
    gpus = [gpu(i) for i in range(4)]
    assert _mig.resolve(short, gpus) == _mig.resolve(parted, gpus)


def test_short_form_per_index_overrides_all_and_pins():
    entries = _mig.parse_short({"all": {"1g.10gb": 7}, 2: "disabled", "1,3": {"3g.40gb@4": 1, "2g.20gb": 2}})
    desired = _mig.resolve(entries, [gpu(i) for i in range(4)])
    assert desired[0]["mig_devices"] == {"1g.10gb": 7}
    assert desired[2]["mig_enabled"] is False
    assert desired[1] == desired[3] == {"mig_enabled": True, "mig_devices": {"3g.40gb": 1, "2g.20gb": 2},
                                        "pins": [("3g.40gb", 4)]}
    placed = _mig.validate(gpu(1), desired[1], TABLE)
    assert ("3g.40gb", 4) in placed


def test_short_form_false_and_empty_mapping():
    desired = _mig.resolve(_mig.parse_short({"0": False, "1": {}}), [gpu(0), gpu(1)])
    assert desired[0]["mig_enabled"] is False
    assert desired[1] == {"mig_enabled": True, "mig_devices": {}, "pins": []}


def test_device_filter_selects_boards():
    h100 = gpu(1, device_id="0x233010DE")
    l40 = gpu(2, device_id="0x26B510DE")
    desired = _mig.resolve(_mig.parse_mig_parted(example("all-balanced"), "all-balanced"), [gpu(0), h100, l40])
    assert set(desired) == {0, 1}


BAD_PARTED = [
    ({"mig-configs": {"x": [{"devices": "all", "mig-enabled": False}]}}, "x", "version must be v1"),
    ({"version": "v2", "mig-configs": {"x": []}}, "x", "version must be v1"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": False}]}, "extra": 1}, "x",
     "unknown top-level field(s) extra"),
    ({"version": "v1", "mig-configs": {}}, "x", "mig-configs must be a non-empty mapping"),
    ({"version": "v1", "mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}}, "b",
     "selected config 'b' is not in mig-configs (have: a)"),
    ({"version": "v1", "mig-configs": {"x": {"devices": "all"}}}, "x", "must be a non-empty list of entries"),
    ({"version": "v1", "mig-configs": {"x": ["all"]}}, "x", "mig-configs.x.0 must be a mapping"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "some", "mig-enabled": True}]}}, "x",
     "devices must be 'all' or a list of GPU indices, got 'some'"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": [0, -1], "mig-enabled": True}]}}, "x",
     "devices must be 'all' or a list"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all"}]}}, "x", "mig-enabled is required"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": "yes"}]}}, "x",
     "mig-enabled is required and must be true or false, got 'yes'"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True, "migdevices": {}}]}}, "x",
     "unknown field(s) migdevices"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": False,
                                              "mig-devices": {"1g.10gb": 1}}]}}, "x",
     "mig-devices must be empty when mig-enabled is false"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True,
                                              "mig-devices": {"1g.10gb": "seven"}}]}}, "x",
     "count of 1g.10gb must be a non-negative integer, got 'seven'"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True,
                                              "mig-devices": {"big": 1}}]}}, "x", "'big' is not a MIG profile name"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True,
                                              "device-filter": ["A100"]}]}}, "x", "device-filter must be a list of PCI ids"),
    (["version", "v1"], "x", "must be a mig-parted v1 mapping"),
]


@pytest.mark.parametrize(("config", "selected", "message"), BAD_PARTED)
def test_malformed_mig_parted_names_field_and_value(config, selected, message):
    with pytest.raises(GpuhardenError) as caught:
        _mig.parse_mig_parted(config, selected, "/etc/mig.yaml")
    assert message in caught.value.msg
    assert caught.value.msg.startswith("/etc/mig.yaml")


BAD_SHORT = [
    ({}, "must be a non-empty mapping"),
    ({"first": {"1g.10gb": 1}}, "key 'first' is neither 'all' nor a GPU index"),
    ({"all": 7}, "layout.all must be a mapping of MIG profile to count or 'disabled', got 7"),
    ({"all": {"1g.10gb": -1}}, "count of 1g.10gb must be a non-negative integer, got -1"),
    ({"all": {"3g.40gb@x": 1}}, "pins a placement that is not a number"),
    ({"all": {"3g.40gb@4": 2}}, "pinned profile 3g.40gb@4 can only have count 1"),
    ({"all": {"1g.10gb": True}}, "count of 1g.10gb must be a non-negative integer, got True"),
]


@pytest.mark.parametrize(("layout", "message"), BAD_SHORT)
def test_malformed_short_form(layout, message):
    with pytest.raises(GpuhardenError) as caught:
        _mig.parse_short(layout)
    assert message in caught.value.msg


@pytest.mark.parametrize(("layout", "message"), [
    ({"all": {"1g.5gb": 7}}, "GPU 0 (00000000:07:00.0, NVIDIA A100-SXM4-80GB) has no MIG profile 1g.5gb"),
    ({"all": {"3g.40gb": 3}}, "profile 3g.40gb allows at most 2 instance(s), the layout asks for 3"),
    ({"all": {"1g.10gb": 7, "2g.20gb": 1}}, "needs 9 compute slices, the GPU has 7"),
    ({"all": {"3g.40gb": 2, "1g.10gb": 1}}, "needs 9 memory slices"),
    ({"all": {"3g.40gb": 1, "4g.40gb": 1, "1g.10gb": 0}, "0": {"4g.40gb@4": 1}}, "profile 4g.40gb cannot start at 4"),
    ({"all": {"2g.20gb": 2, "3g.40gb@0": 1}}, "does not fit: no placement"),
])
def test_validation_names_gpu_and_profile(layout, message):
    desired = _mig.resolve(_mig.parse_short(layout), [gpu(0)])
    with pytest.raises(GpuhardenError) as caught:
        _mig.validate(gpu(0), desired[0], TABLE)
    assert message in caught.value.msg


def test_non_mig_gpu_asked_for_mig():
    l4 = gpu(0, capable=False)
    l4["name"] = "NVIDIA L4"
    want = {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}, "pins": []}
    with pytest.raises(GpuhardenError) as caught:
        _mig.validate(l4, want, None)
    assert "GPU 0" in caught.value.msg and "NVIDIA L4" in caught.value.msg and "1g.10gb" in caught.value.msg
    assert "does not support MIG" in caught.value.msg
    assert _mig.validate(l4, {"mig_enabled": False, "mig_devices": {}, "pins": []}, None) == []


# -- issue 13 item 19: entries that select no GPU are skipped, as mig-parted does ---------------


def test_item19_index_the_node_does_not_have_is_skipped_and_reported():
    config = {"version": "v1", "mig-configs": {"split": [
        {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"devices": [2, 3, 4, 5, 6, 7], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": [9], "mig-enabled": False},
    ]}}
    gpus = [gpu(i) for i in range(4)]
    desired, skipped = _mig.resolve_entries(_mig.parse_mig_parted(config, "split"), gpus)
    assert {i: d["mig_devices"] for i, d in desired.items()} == {0: {"1g.10gb": 7}, 1: {"1g.10gb": 7},
                                                                 2: {"3g.40gb": 2}, 3: {"3g.40gb": 2}}
    assert skipped == [
        {"entry": 1, "devices": [4, 5, 6, 7], "reason": "no GPU with index 4, 5, 6, 7 on the node (GPUs [0, 1, 2, 3])"},
        {"entry": 2, "devices": [9], "reason": "no GPU with index 9 on the node (GPUs [0, 1, 2, 3])"},
    ]
    # the short form too; GPU 0 keeps the layout of 'all'
    assert _mig.resolve(_mig.parse_short({"all": {"1g.10gb": 7}, "9": "disabled"}), [gpu(0)]) == {
        0: {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}, "pins": []}}


def test_item19_device_filter_matching_no_gpu_is_skipped_and_reported():
    config = {"version": "v1", "mig-configs": {"c": [
        {"device-filter": ["0x233010DE"], "devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"device-filter": "0x20B210DE", "devices": [1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
    ]}}
    decision = _mig.plan_node([gpu(0), gpu(1)], _mig.parse_mig_parted(config, "c"), False, "mixed")
    assert set(decision["desired"]) == {1}
    assert decision["unmatched_entries"] == [{"entry": 0, "device_filter": ["0x233010DE"],
                                    "reason": "no GPU on the node matches device-filter 0x233010DE (their PCI ids: 0x20B210DE)"}]
    assert [step["gpu"] for step in decision["plans"][1]["steps"]] and 0 not in decision["plans"]


# -- issue 13 item 20: layouts mig-parted rejects ------------------------------------------------


@pytest.mark.parametrize(("entry", "message"), [
    ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 0, "3g.40gb": 0}},
     "/etc/mig.yaml: mig-configs.x.1.mig-devices: every count is 0 (1g.10gb: 0, 3g.40gb: 0)"),
    ({"devices": [0], "mig-enabled": False, "mig-devices": {"1g.10gb": 0}},
     "/etc/mig.yaml: mig-configs.x.1.mig-devices: every count is 0"),
    ({"devices": "all", "mig-enabled": True},
     "/etc/mig.yaml: mig-configs.x.1: mig-devices is required when mig-enabled is true"),
    ({"devices": "all", "mig-enabled": True, "mig-devices": None},
     "/etc/mig.yaml: mig-configs.x.1: mig-devices is required when mig-enabled is true"),
])
def test_item20_mig_parted_rejects_all_zero_counts_and_enabled_without_devices(entry, message):
    config = {"version": "v1", "mig-configs": {"x": [{"devices": [1], "mig-enabled": False}, entry]}}
    with pytest.raises(GpuhardenError) as caught:
        _mig.parse_mig_parted(config, "x", "/etc/mig.yaml")
    assert message in caught.value.msg
    assert caught.value.result["field"] in ("mig-configs.x.1.mig-devices",)


def test_item20_short_form_all_zero_is_rejected_empty_mapping_is_not():
    with pytest.raises(GpuhardenError, match=r"layout: 3: every count is 0 \(2g.20gb: 0\)"):
        _mig.parse_short({"all": {"1g.10gb": 7}, 3: {"2g.20gb": 0}})
    assert _mig.parse_short({"all": {}})[0]["mig_devices"] == {}
    # MIG enabled without instances stays valid in mig-parted's form too (its all-enabled example)
    config = {"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}]}}
    assert _mig.parse_mig_parted(config, "x")[0]["mig_enabled"] is True


# -- issue 13 item 18: profile names with attributes ----------------------------------------------

# A board with attribute profiles (names as on RTX PRO 6000 Blackwell, mig-parted's config-default.yaml; slice
# geometry kept within the planner's 7 compute / 8 memory slices).
ATTR_TABLE = {
    "1g.24gb": {"id": 14, "enum": 0, "slices": 1, "size": 2, "instance_count": 4, "starts": [0, 2, 4, 6]},
    "1g.24gb+me.all": {"id": 21, "enum": 0xF, "slices": 1, "size": 2, "instance_count": 1, "starts": [0, 2, 4, 6]},
    "1g.24gb-me": {"id": 22, "enum": 0xD, "slices": 1, "size": 2, "instance_count": 4, "starts": [0, 2, 4, 6]},
    "1g.24gb+gfx": {"id": 23, "enum": 0xA, "slices": 1, "size": 2, "instance_count": 4, "starts": [0, 2, 4, 6]},
    "2g.48gb": {"id": 5, "enum": 1, "slices": 2, "size": 4, "instance_count": 2, "starts": [0, 4]},
}


def attr_gpu(index=0):
    return dict(gpu(index, device_id="0x2BB510DE"), name="NVIDIA RTX PRO 6000 Blackwell", profile_table=ATTR_TABLE)


@pytest.mark.parametrize(("name", "parsed"), [
    ("1g.10gb+me", {"c": 1, "g": 1, "gb": 10, "attributes": ("me",), "negative": ()}),
    ("1g.24gb+me.all", {"c": 1, "g": 1, "gb": 24, "attributes": ("me.all",), "negative": ()}),
    ("2g.48gb+gfx", {"c": 2, "g": 2, "gb": 48, "attributes": ("gfx",), "negative": ()}),
    ("1g.24gb-me", {"c": 1, "g": 1, "gb": 24, "attributes": (), "negative": ("me",)}),
    ("1c.3g.40gb", {"c": 1, "g": 3, "gb": 40, "attributes": (), "negative": ()}),
    ("1g.24gb+me,gfx", {"c": 1, "g": 1, "gb": 24, "attributes": ("gfx", "me"), "negative": ()}),
])
def test_item18_profile_names_parse_as_go_nvlib(name, parsed):
    assert _mig.parse_profile(name) == parsed


@pytest.mark.parametrize(("name", "message"), [
    ("1g.24gb+me-x", "both '+' and '-'"),
    ("1g.24gb+", "attribute ''"),
    ("1g.24gb+1me", "attribute '1me'"),
    ("1g.24gb+me.", "attribute 'me.'"),
    ("1g.24gb+me,me", "listed twice"),
    ("1g.24gb+m_e", "attribute 'm_e'"),
    ("1.24gb", "is not [<c>c.]<g>g.<gb>gb"),
])
def test_item18_malformed_attribute_profiles_are_refused(name, message):
    with pytest.raises(GpuhardenError) as caught:
        _mig.parse_short({"all": {name: 1}})
    assert "layout: all: %r is not a MIG profile name" % name in caught.value.msg and message in caught.value.msg


def test_item18_compute_instance_profiles_are_not_layout_entries():
    with pytest.raises(GpuhardenError, match=r"'1c.3g.40gb' names a compute-instance profile; layouts list GPU-instance "
                                             r"profiles \(3g.40gb\)"):
        _mig.parse_short({"all": {"1c.3g.40gb": 3}})


def test_item18_attribute_profiles_validate_and_plan():
    config = {"version": "v1", "mig-configs": {
        "no-me": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.24gb-me": 4}}],
        "mixed": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.24gb+me.all": 1, "1g.24gb+gfx": 1,
                                                                          "2g.48gb": 1}}],
    }}
    for name, expected in (("no-me", [("1g.24gb-me", 22)] * 4),
                           ("mixed", [("2g.48gb", 5), ("1g.24gb+gfx", 23), ("1g.24gb+me.all", 21)])):
        decision = _mig.plan_node([attr_gpu()], _mig.parse_mig_parted(config, name), False, "mixed")
        created = [(step["profile"], step["profile_id"]) for step in decision["plans"][0]["steps"]
                   if step["action"] == "create_gi"]
        assert sorted(created) == sorted(expected), name
    # the attribute order does not matter (go-nvlib Matches); the table's spelling is used
    want = _mig.spelled({"mig_enabled": True, "mig_devices": {"1g.24gb+gfx": 1}, "pins": [("1g.24gb+gfx", 2)]}, ATTR_TABLE)
    assert want["pins"] == [("1g.24gb+gfx", 2)]
    table = dict(ATTR_TABLE, **{"1g.24gb+gfx,me": dict(ATTR_TABLE["1g.24gb+gfx"], id=24)})
    assert _mig.spelled({"mig_enabled": True, "mig_devices": {"1g.24gb+me,gfx": 2}, "pins": []}, table)["mig_devices"] == {
        "1g.24gb+gfx,me": 2}
    # a profile the board does not have is still named
    with pytest.raises(GpuhardenError, match=r"has no MIG profile 1g.24gb\+me \(its profiles: "):
        _mig.plan_node([attr_gpu()], _mig.parse_short({"all": {"1g.24gb+me": 1}}), False, "mixed")
    # A100/H100's own attribute profile, from the built-in table
    decision = _mig.plan_node([gpu(0)], _mig.parse_short({"all": {"1g.10gb+me": 1, "1g.10gb": 6}}), False, "mixed")
    assert ("1g.10gb+me", 20) in [(s.get("profile"), s.get("profile_id")) for s in decision["plans"][0]["steps"]]


# -- minimal plans ---------------------------------------------------------------------------


def want(counts, enabled=True, pins=()):
    return {"mig_enabled": enabled, "mig_devices": counts, "pins": list(pins)}


def test_layout_that_holds_needs_nothing_whatever_the_placement():
    current = gpu(0, mode=1, instances=[gi(3, "2g.20gb", 0), gi(9, "1g.10gb", 2), gi(1, "3g.40gb", 4)])
    assert _mig.plan_gpu(current, want({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1}), TABLE)["steps"] == []


def test_pinned_layout_moves_an_instance():
    current = gpu(0, mode=1, instances=[gi(2, "3g.40gb", 0)])
    steps = _mig.plan_gpu(current, want({"3g.40gb": 1}, pins=[("3g.40gb", 4)]), TABLE)["steps"]
    assert [s["action"] for s in steps] == ["destroy_ci", "destroy_gi", "create_gi", "create_ci"]
    assert steps[2]["start"] == 4


def test_enable_then_create_with_explicit_placements():
    steps = _mig.plan_gpu(gpu(0), want({"4g.40gb": 1, "3g.40gb": 1}), TABLE)["steps"]
    assert steps[0] == {"action": "set_mode", "gpu": 0, "mode": 1}
    created = [(s["profile"], s["start"]) for s in steps if s["action"] == "create_gi"]
    assert created == [("4g.40gb", 0), ("3g.40gb", 4)]


def test_extra_instances_are_destroyed_cis_first_and_kept_ones_stay():
    current = gpu(0, mode=1, instances=[gi(7, "1g.10gb", 0), gi(8, "1g.10gb", 1), gi(1, "3g.40gb", 4)])
    steps = _mig.plan_gpu(current, want({"1g.10gb": 1, "3g.40gb": 1}), TABLE)["steps"]
    assert [(s["action"], s.get("gi_id")) for s in steps] == [("destroy_ci", 8), ("destroy_gi", 8)]


def test_kept_instances_that_block_a_fit_are_rebuilt():
    # 1g at 0 and at 4 leave no room for the 3g; the GPU is rebuilt
    current = gpu(0, mode=1, instances=[gi(7, "1g.10gb", 0), gi(11, "1g.10gb", 4)])
    steps = _mig.plan_gpu(current, want({"1g.10gb": 2, "3g.40gb": 1}), TABLE)["steps"]
    assert [s["action"] for s in steps].count("destroy_gi") == 2
    created = [(s["profile"], s["start"]) for s in steps if s["action"] == "create_gi"]
    assert sorted(created) == [("1g.10gb", 4), ("1g.10gb", 5), ("3g.40gb", 0)]


def test_instance_without_compute_instance_gets_one():
    current = gpu(0, mode=1, instances=[dict(gi(1, "3g.40gb", 4), compute_instances=[])])
    steps = _mig.plan_gpu(current, want({"3g.40gb": 1}), TABLE)["steps"]
    assert steps == [{"action": "create_ci", "gpu": 0, "profile": "3g.40gb", "start": 4}]


def test_disable_destroys_everything_then_sets_mode():
    current = gpu(0, mode=1, instances=[gi(0, "7g.80gb", 0)])
    steps = _mig.plan_gpu(current, want({}, enabled=False), TABLE)["steps"]
    assert [s["action"] for s in steps] == ["destroy_ci", "destroy_gi", "set_mode"]


def test_pending_mode_waits_for_reset():
    outcome = _mig.plan_gpu(gpu(0, mode=0, pending=1), want({"1g.10gb": 7}), TABLE)
    assert outcome == {"steps": [], "mode_change": False, "pending": True}


def test_pending_change_the_layout_does_not_want_is_cancelled():
    outcome = _mig.plan_gpu(gpu(0, mode=0, pending=1), want({}, enabled=False), TABLE)
    assert outcome["steps"] == [{"action": "set_mode", "gpu": 0, "mode": 0}]


def test_busy_gpus_only_where_the_plan_touches():
    gpus = [gpu(0, processes=[11]), gpu(1, processes=[12]), gpu(2)]
    plans = {0: {"steps": [{"action": "set_mode"}]}, 1: {"steps": []}, 2: {"steps": [{"action": "set_mode"}]}}
    assert _mig.busy_gpus(gpus, plans, force=False) == [{"index": 0, "pci_bus_id": "00000000:07:00.0", "pids": [11]}]
    assert _mig.busy_gpus(gpus, plans, force=True) == []


# -- device plugin ---------------------------------------------------------------------------


def test_advertised_resources_per_strategy():
    gpus = [gpu(0), gpu(1), gpu(2)]
    layouts = {0: {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}},
               1: {"mig_enabled": True, "mig_devices": {"1g.10gb": 7}},
               2: {"mig_enabled": False, "mig_devices": {}}}
    resources = _mig.advertised_resources(gpus, layouts)
    assert resources["none"] == {"nvidia.com/gpu": 3}
    assert resources["single"] is None
    assert resources["mixed"] == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 14}
    ids = [f["id"] for f in _mig.strategy_findings(gpus, layouts, "single")]
    assert ids == ["mig_strategy_single_mismatch"]
    assert [f["id"] for f in _mig.strategy_findings(gpus, layouts, "none")] == ["mig_strategy_none_hides_slices"]
    assert _mig.strategy_findings(gpus, layouts, "mixed") == []
    layouts[2] = dict(layouts[0])
    assert _mig.advertised_resources(gpus, layouts)["single"] == {"nvidia.com/gpu": 21}
    assert _mig.strategy_findings(gpus, layouts, "single") == []


def test_single_needs_one_profile():
    gpus = [gpu(0)]
    layouts = {0: {"mig_enabled": True, "mig_devices": {"3g.40gb": 1, "1g.10gb": 2}}}
    assert _mig.advertised_resources(gpus, layouts)["single"] is None
    assert _mig.strategy_findings(gpus, layouts, "single")[0]["severity"] == "error"


def test_layout_text_for_drift_reports():
    assert _mig.layout_text({"mig_enabled": True, "mig_devices": {"1g.10gb": 7}}) == "7x 1g.10gb"
    assert _mig.layout_text({"mig_enabled": False}) == "MIG disabled"
    assert _mig.layout_text({"mig_enabled": True, "mig_devices": {"1g.10gb": 1, "3g.40gb": 2}}) == "2x 3g.40gb + 1x 1g.10gb"


# -- issue 13 item 6: resource names as the real device plugin builds them ------------------------


def test_item06_mixed_names_attribute_profiles_as_the_plugin_does():
    gpus = [gpu(0), gpu(1)]
    layouts = {0: {"mig_enabled": True, "mig_devices": {"1g.10gb+me": 1, "1g.10gb": 6}},
               1: {"mig_enabled": False, "mig_devices": {}}}
    resources = _mig.advertised_resources(gpus, layouts)
    # v0.20.0+: anchored patterns, "+" becomes "." (internal/rm/rm.go)
    assert resources["mixed"] == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 6, "nvidia.com/mig-1g.10gb.me": 1}
    # up to v0.19.x: the unanchored pattern 1g.10gb (NVML enum 0) is tried before 1g.10gb+me (enum 7)
    assert resources["mixed_legacy"] == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 7}


@pytest.mark.parametrize(("profile", "mixed", "legacy"), [
    ("1c.3g.40gb", None, "nvidia.com/mig-3g.40gb"),  # the real v0.18.2 binary: mig-3g.40gb, one per compute instance
    ("2c.3g.40gb", None, "nvidia.com/mig-3g.40gb"),
    ("3g.40gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-3g.40gb"),
    ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me", "nvidia.com/mig-1g.10gb"),
    ("1g.24gb+me.all", "nvidia.com/mig-1g.24gb.me.all", "nvidia.com/mig-1g.24gb"),
    ("1g.24gb-me", "nvidia.com/mig-1g.24gb-me", "nvidia.com/mig-1g.24gb"),
    ("2g.48gb+gfx", "nvidia.com/mig-2g.48gb.gfx", "nvidia.com/mig-2g.48gb"),
    ("1c.2g.48gb+gfx", None, "nvidia.com/mig-2g.48gb"),
    ("big", None, None),
])
def test_item06_mig_resource_names(profile, mixed, legacy):
    assert _mig.mig_resource_names(profile) == {"mixed": mixed, "mixed_legacy": legacy}


def test_item06_legacy_names_follow_the_registered_patterns_in_enum_order():
    registered = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb"]
    assert _mig.mig_resource_name("1g.10gb+me", False, registered) == "nvidia.com/mig-1g.10gb"
    assert _mig.mig_resource_name("1c.4g.40gb", False, registered) == "nvidia.com/mig-4g.40gb"
    assert _mig.mig_resource_name("1g.20gb", False, registered) == "nvidia.com/mig-1g.20gb"
    assert _mig.mig_resource_name("1g.10gb+me", True, registered) == "nvidia.com/mig-1g.10gb.me"
    assert _mig.mig_resource_name("1c.4g.40gb", True, registered) is None


def test_item06_split_gpu_instance_is_advertised_per_compute_instance_under_the_gpu_instance_name():
    split = dict(gi(1, "3g.40gb", 4), compute_instances=[{"id": i, "size": 1} for i in range(3)])
    current = gpu(0, mode=1, instances=[split])
    plans = {0: _mig.plan_gpu(current, want({"3g.40gb": 1}), TABLE)}
    [finding] = _mig.custom_compute_findings([current], plans)
    assert finding["id"] == "mig_custom_compute_instances"
    assert "3 compute instance(s) of 1 slice(s) (MIG devices 1c.3g.40gb)" in finding["found"]
    assert "advertises each as one nvidia.com/mig-3g.40gb" in finding["found"]
    assert "mig-1c" not in finding["found"]


# -- issue 47: entries of one mig-parted config that select the same GPU; errors name the file and the config --------


@pytest.mark.parametrize("second", [
    {"devices": [1], "mig-enabled": False},  # mig-parted: the apply fails after the mode change and the reset
    {"devices": [1, 2], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},  # mig-parted: the earlier layout is lost
])
def test_entries_of_one_mig_parted_config_that_select_one_gpu_are_refused(second):
    config = {"version": "v1", "mig-configs": {"x": [
        {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}, second]}}
    entries = _mig.parse_mig_parted(config, "x", "/etc/mig.yaml")
    with pytest.raises(GpuhardenError) as caught:
        _mig.plan_node([gpu(0), gpu(1), gpu(2)], entries, False, "mixed")
    assert caught.value.msg.startswith("/etc/mig.yaml: mig-configs.x[1]: selects GPU 1 (00000000:08:00.0, NVIDIA A100-SXM4-80GB), "
                                       "which /etc/mig.yaml: mig-configs.x[0] selects already")
    assert caught.value.result["field"] == "devices" and caught.value.result["gpu"] == 1


def test_disjoint_entries_and_the_short_forms_overrides_are_not_overlaps():
    config = {"version": "v1", "mig-configs": {"x": [
        {"device-filter": "0x233010DE", "devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"device-filter": A100, "devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": [5], "mig-enabled": False}]}}
    assert set(_mig.plan_node([gpu(0), gpu(1)], _mig.parse_mig_parted(config, "x"), False, "mixed")["desired"]) == {0, 1}
    short = _mig.parse_short({"all": {"1g.10gb": 7}, 1: "disabled"})
    assert _mig.plan_node([gpu(0), gpu(1)], short, False, "mixed")["desired"][1]["mig_enabled"] is False


def test_a_layout_the_gpu_cannot_take_names_the_file_and_the_config():
    config = {"version": "v1", "mig-configs": {"big": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 2}}]}}
    with pytest.raises(GpuhardenError) as caught:
        _mig.plan_node([gpu(0)], _mig.parse_mig_parted(config, "big", "/etc/mig.yaml"), False, "mixed")
    assert caught.value.msg.startswith("/etc/mig.yaml: mig-configs.big[0]: GPU 0 (")
    assert "profile 7g.80gb allows at most 1 instance(s)" in caught.value.msg
    with pytest.raises(GpuhardenError, match=r"^layout\.0: GPU 0 "):
        _mig.plan_node([gpu(0)], _mig.parse_short({0: {"7g.80gb": 2}}), False, "mixed")
