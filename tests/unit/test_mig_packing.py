# SPDX-License-Identifier: GPL-3.0-or-later
"""Property test of the MIG packer: over EVERY multiset of GPU-instance profiles that the A100-80GB and
H100-80GB tables allow (instance limits, compute slices), ``pack`` finds a placement exactly when one
exists, and what it returns is always valid.  Existence is decided by an independent exhaustive search:
every set of (profile, start) placements that does not overlap, enumerated without any ordering heuristic."""

from __future__ import annotations

import itertools

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.node import _mig

TABLES = sorted(_mig.BUILTIN_TABLES)


def _mask(table, name, start):
    return ((1 << table[name]["size"]) - 1) << start


def _key(counts):
    return tuple(sorted((name, n) for name, n in counts.items() if n))


def all_valid_sets(table):
    """Every set of placements that a GPU can hold at once, by brute force over (profile, start) pairs."""
    pairs = [(name, start) for name in sorted(table) for start in table[name]["starts"]
             if start + table[name]["size"] <= _mig.MEMORY_SLICES]
    found = []

    def walk(position, mask, slices, chosen, counts):
        if position == len(pairs):
            found.append(tuple(chosen))
            return
        walk(position + 1, mask, slices, chosen, counts)  # without this pair
        name, start = pairs[position]
        bits = _mask(table, name, start)
        if (mask & bits or slices + table[name]["slices"] > _mig.COMPUTE_SLICES
                or counts.get(name, 0) >= table[name]["instance_count"]):
            return
        counts[name] = counts.get(name, 0) + 1
        chosen.append((name, start))
        walk(position + 1, mask | bits, slices + table[name]["slices"], chosen, counts)
        chosen.pop()
        counts[name] -= 1

    walk(0, 0, 0, [], {})
    return found


def all_multisets(table):
    """Every multiset within the instance limits and the compute-slice capacity (fitting or not)."""
    names = sorted(table)
    ranges = [range(table[name]["instance_count"] + 1) for name in names]
    for combo in itertools.product(*ranges):
        counts = dict(zip(names, combo, strict=True))
        if sum(table[name]["slices"] * n for name, n in counts.items()) <= _mig.COMPUTE_SLICES:
            yield {name: n for name, n in counts.items() if n}


def assert_valid(table, counts, placed, pinned=()):
    mask, slices, seen = 0, 0, {}
    for name, start in placed:
        assert start in table[name]["starts"], (name, start)
        bits = _mask(table, name, start)
        assert not mask & bits, ("overlap", placed)
        mask |= bits
        slices += table[name]["slices"]
        seen[name] = seen.get(name, 0) + 1
    assert slices <= _mig.COMPUTE_SLICES
    assert all(seen[name] <= table[name]["instance_count"] for name in seen)
    assert _key(seen) == _key(counts)
    assert set(pinned) <= set(placed)


@pytest.fixture(scope="module", params=TABLES)
def universe(request):
    table = _mig.BUILTIN_TABLES[request.param]
    by_multiset = {}
    for valid in all_valid_sets(table):
        counts = {}
        for name, _start in valid:
            counts[name] = counts.get(name, 0) + 1
        by_multiset.setdefault(_key(counts), []).append(set(valid))
    return table, by_multiset


def test_packer_finds_a_fit_exactly_when_one_exists(universe):
    table, by_multiset = universe
    checked = fitting = 0
    for counts in all_multisets(table):
        placed = _mig.pack(table, counts)
        exists = _key(counts) in by_multiset
        assert (placed is not None) == exists, (counts, placed)
        if placed is not None:
            assert_valid(table, counts, placed)
            fitting += 1
        checked += 1
    # every multiset the tables allow was looked at, and the universe is not trivial
    assert checked > 100 and fitting > 50
    assert fitting == len(by_multiset)


def test_packer_with_one_pinned_instance(universe):
    """Pins: a fit with the pinned placement is found exactly when some valid set contains it."""
    table, by_multiset = universe
    for counts in all_multisets(table):
        sets = by_multiset.get(_key(counts), [])
        for name in counts:
            for start in table[name]["starts"]:
                placed = _mig.pack(table, counts, pinned=[(name, start)])
                exists = any((name, start) in valid for valid in sets)
                assert (placed is not None) == exists, (counts, name, start, placed)
                if placed is not None:
                    assert_valid(table, counts, placed, pinned=[(name, start)])


def test_packer_next_to_occupied_instances(universe):
    """Instances kept in place: the packer fills around them, never over them."""
    table, by_multiset = universe
    for sets in by_multiset.values():
        for valid in sets[:3]:
            ordered = sorted(valid, key=lambda item: item[1])
            for cut in range(len(ordered) + 1):
                occupied, rest = ordered[:cut], ordered[cut:]
                counts = {}
                for name, _start in rest:
                    counts[name] = counts.get(name, 0) + 1
                placed = _mig.pack(table, counts, occupied=occupied)
                assert placed is not None, (occupied, counts)  # the valid set itself is a witness
                assert_valid(table, _merge(occupied, counts), list(occupied) + placed)


def _merge(occupied, counts):
    merged = dict(counts)
    for name, _start in occupied:
        merged[name] = merged.get(name, 0) + 1
    return merged


@pytest.mark.parametrize("counts", [
    {"3g.40gb": 1, "4g.40gb": 1},             # 4g only fits at 0, so 3g must go to 4
    {"2g.20gb": 2, "3g.40gb": 1},             # 3g at 4 blocks 2g@4; 2g at 0 and 2
    {"1g.20gb": 1, "2g.20gb": 2, "1g.10gb": 1},
    {"1g.10gb": 3, "3g.40gb": 1},
])
def test_known_tight_layouts_fit(counts):
    table = _mig.BUILTIN_TABLES["A100-80GB"]
    placed = _mig.pack(table, counts)
    assert placed is not None
    assert_valid(table, counts, placed)


@pytest.mark.parametrize("counts", [
    {"1g.10gb": 7, "1g.20gb": 1},            # 8 compute slices
    {"3g.40gb": 2, "1g.10gb": 1},            # 7 slices, but no memory slice left for the 1g at 0..6
    {"4g.40gb": 1, "2g.20gb": 2},            # 4g holds 0-3; only one 2g (at 4) fits beside it
])
def test_layouts_that_do_not_fit(counts):
    assert _mig.pack(_mig.BUILTIN_TABLES["H100-80GB"], counts) is None
