# SPDX-License-Identifier: GPL-3.0-or-later
"""The kubelet planner's field-type table and JSON handling, judged by the kubelet's own decoder.

kubelet-validate (lab/controlplane, built against k8s.io/kubernetes v1.36.3) runs the kubelet's config loader on a
file: rc 2 is a decode error, the one that stops the kubelet before it starts.  For every kind in
_kubelet.FIELD_TYPES a value of the right type must pass both gpuharden's check and the decoder, and a wrong one fail
both; a JSON config is written back as JSON the decoder accepts.
"""

from __future__ import annotations

import json

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _kubelet

from tests.fuzz.validators import KUBELET_DECODER_REFUSES, kubelet_validate_exit

HEAD = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"

# one field of each kind: (a value the decoder takes, a value it refuses), as YAML text
CASES = {
    "string": ("reservedSystemCPUs", '"0,1"', "[0, 1]"),
    "duration": ("syncFrequency", "1m30s", "10x"),
    "bool": ("failSwapOn", "yes", "'yes'"),
    "int32": ("maxPods", "1.0", "3000000000"),
    "int64": ("podPidsLimit", "4096", "1.5"),
    "number": ("memoryThrottlingFactor", "1", "'0.9'"),
    "map of strings": ("kubeReserved", "{cpu: '1'}", '"1Gi"'),
    "map of booleans": ("featureGates", "{MemoryQoS: true}", "[MemoryQoS]"),
    "map of string lists": ("staticPodURLHeader", "{a: [b]}", "{a: b}"),
    "list of strings": ("clusterDNS", "[10.96.0.10]", "10.96.0.10"),
    "list of int32": ("tlsCurvePreferences", "[23, 24]", "['x']"),
    "list of mappings": ("registerWithTaints", "[{key: a, effect: NoSchedule}]", "[a]"),
    "mapping": ("logging", "{format: text}", "[]"),
}


def decoder_refuses(tmp_path, text):
    return kubelet_validate_exit(tmp_path, text) == KUBELET_DECODER_REFUSES


def gpuharden_refuses(text):
    try:
        _kubelet.KubeletConfigFile("/var/lib/kubelet/config.yaml", text, dropin=False)
    except GpuhardenError as error:
        return error.msg
    return None


def test_every_kind_of_the_table_has_a_case():
    assert set(CASES) == set(_kubelet.FIELD_TYPES)
    assert all(_kubelet.FIELD_KIND[field] == kind for kind, (field, _good, _bad) in CASES.items())


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_right_value_passes_both_and_a_wrong_one_fails_both(tmp_path, kind):
    field, good, bad = CASES[kind]
    good_text, bad_text = HEAD + "%s: %s\n" % (field, good), HEAD + "%s: %s\n" % (field, bad)
    assert not decoder_refuses(tmp_path, good_text)
    assert gpuharden_refuses(good_text) is None
    assert decoder_refuses(tmp_path, bad_text)
    message = gpuharden_refuses(bad_text)
    assert message is not None and message.startswith("/var/lib/kubelet/config.yaml: field %s is " % field), message
    assert "\n" not in message and not any(name in message for name in ("NoneType", "'str'", "<class", "CommentedMap"))


def test_a_json_whole_number_written_as_1_0_is_refused_like_the_decoder_does(tmp_path):
    text = json.dumps({"apiVersion": _kubelet.API_VERSION, "kind": _kubelet.KIND, "maxPods": 1.0})
    assert decoder_refuses(tmp_path, text)
    assert "field maxPods is a number (1.0)" in gpuharden_refuses(text)


@pytest.mark.parametrize("text", [
    '{\n  "apiVersion": "kubelet.config.k8s.io/v1beta1",\n  "kind": "KubeletConfiguration",\n  "maxPods": 110\n}\n',
    '{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","featureGates":{"MemoryQoS":false}}',
    '\t{\n\t"apiVersion": "kubelet.config.k8s.io/v1beta1",\n\t"kind": "KubeletConfiguration"\n}',
])
def test_a_json_config_is_written_back_as_json_the_decoder_accepts(tmp_path, text):
    loaded = _kubelet.KubeletConfigFile("/c", text, dropin=False)
    assert loaded.assign(("topologyManagerPolicy",), "single-numa-node")
    assert loaded.assign(("featureGates", "MemoryQoS"), True)
    rendered = loaded.render()
    assert rendered.lstrip().startswith("{") and rendered.endswith("\n") == text.endswith("\n")
    doc = json.loads(rendered)
    assert list(doc)[:2] == ["apiVersion", "kind"] and doc["topologyManagerPolicy"] == "single-numa-node"
    assert ("\n" in rendered.strip()) == ("\n" in text.strip())
    assert not decoder_refuses(tmp_path, rendered)


def test_a_yaml_flow_mapping_that_starts_with_a_brace_is_refused_as_the_decoder_does(tmp_path):
    text = "{apiVersion: kubelet.config.k8s.io/v1beta1, kind: KubeletConfiguration}\n"
    assert decoder_refuses(tmp_path, text)
    assert "line 1, column 2: not JSON" in gpuharden_refuses(text)


def test_a_flow_mapping_after_a_comment_is_written_in_block_style(tmp_path):
    text = "# site config\n{apiVersion: kubelet.config.k8s.io/v1beta1, kind: KubeletConfiguration, failSwapOn: yes}\n"
    assert not decoder_refuses(tmp_path, text)
    loaded = _kubelet.KubeletConfigFile("/c", text, dropin=False)
    loaded.assign(("topologyManagerPolicy",), "single-numa-node")
    rendered = loaded.render()
    assert "\ntopologyManagerPolicy: single-numa-node\n" in rendered
    assert not decoder_refuses(tmp_path, rendered)
    assert "failSwapOn" in rendered and _kubelet.KubeletConfigFile("/c", rendered, dropin=False)


@pytest.mark.parametrize(("text", "needle"), [
    ('{"a": ' + "[" * 200 + "]" * 200 + "}", "line 1, column 70: nested more than 64 levels deep"),
    ('{"apiVersion": "x", "apiVersion": "y"}', 'key "apiVersion" appears twice'),
    ('{"maxPods": NaN}', "NaN is not a JSON value"),
    ("{" + ", ".join('"k%d": 1' % number for number in range(60000)) + "}", "more than 50000 values"),
])
def test_hostile_json_is_refused_in_one_line(text, needle):
    message = gpuharden_refuses(text)
    assert message is not None and needle in message and "\n" not in message, message
