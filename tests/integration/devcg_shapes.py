# SPDX-License-Identifier: GPL-3.0-or-later
"""Device-cgroup programs shaped like the ones runc, crun, systemd and libnvidia-container generate.

Written from the generators' documented output (see shared reference ebpf-devcg.md section 3), for loading
directly with BPF_PROG_LOAD in tests and the benchmark.  A rule is ``(type, major, minor, access, allow)``
with type "c", "b" or "a" and None for a wildcard number.
"""

from __future__ import annotations

from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf._ebpf import encode

ACC = {"m": 1, "r": 2, "w": 4}
TYPES = {"b": 1, "c": 2}


def _acc(access):
    bits = 0
    for letter in access:
        bits |= ACC[letter]
    return bits


class Asm:
    """Instructions with symbolic jump targets: ``jump(code, dst, src, target, imm)``, ``label(name)``."""

    def __init__(self):
        self.items = []
        self.labels = {}

    def op(self, code, dst=0, src=0, off=0, imm=0):
        self.items.append((code, dst, src, off, imm))
        return self

    def jump(self, code, dst=0, src=0, target=None, imm=0):
        self.items.append((code, dst, src, target, imm))
        return self

    def label(self, name):
        self.labels[name] = len(self.items)
        return self

    def insns(self):
        out = []
        for index, (code, dst, src, off, imm) in enumerate(self.items):
            if isinstance(off, str):
                off = self.labels[off] - index - 1
            out.append((code, src << 4 | dst, off, imm))
        return out

    def bytes(self):
        return encode(self.insns())


def _prologue(asm, type_load=0x61):
    asm.op(type_load, 2, 1, 0)  # r2 = ctx->access_type (u32 or u16)
    if type_load == 0x61:
        asm.op(0x54, 2, imm=0xFFFF)  # w2 &= 0xffff (type)
    asm.op(0x61, 3, 1, 0).op(0x74, 3, imm=16)  # w3 = access
    asm.op(0x61, 4, 1, 4)  # r4 = major
    asm.op(0x61, 5, 1, 8)  # r5 = minor


def runc_like(rules, default_allow=False):
    """runc <= 1.1 devicefilter: first match wins; w0 via 0xb4; tail returns the default."""
    asm = Asm()
    _prologue(asm)
    for index, (kind, major, minor, access, allow) in enumerate(rules):
        nxt = "r%d" % index
        if kind != "a":
            asm.jump(0x55, 2, target=nxt, imm=TYPES[kind])
        if set(access) != set("rwm"):
            asm.op(0xBC, 1, 3).op(0x54, 1, imm=_acc(access)).jump(0x5D, 1, 3, target=nxt)
        if major is not None:
            asm.jump(0x55, 4, target=nxt, imm=major)
        if minor is not None:
            asm.jump(0x55, 5, target=nxt, imm=minor)
        asm.op(0xB4, 0, imm=1 if allow else 0).op(0x95)
        asm.label(nxt)
    asm.op(0xB4, 0, imm=1 if default_allow else 0).op(0x95)
    return asm


def crun_like(rules):
    """crun: verdicts with ALU64 mov (0xb7), type "a" without a type test, an all-wildcard rule ends
    generation (no tail after it); ``rules`` in evaluation order (crun emits them reversed)."""
    asm = Asm()
    _prologue(asm)
    for index, (kind, major, minor, access, allow) in enumerate(rules):
        nxt = "c%d" % index
        wildcard = kind == "a" and major is None and minor is None and set(access) == set("rwm")
        if kind != "a":
            asm.jump(0x55, 2, target=nxt, imm=TYPES[kind])
        if set(access) != set("rwm"):
            asm.op(0xBC, 1, 3).op(0x54, 1, imm=_acc(access)).jump(0x5D, 1, 3, target=nxt)
        if major is not None:
            asm.jump(0x55, 4, target=nxt, imm=major)
        if minor is not None:
            asm.jump(0x55, 5, target=nxt, imm=minor)
        asm.op(0xB7, 0, imm=1 if allow else 0).op(0x95)
        if wildcard:
            return asm
        asm.label(nxt)
    asm.op(0xB7, 0, imm=0).op(0x95)
    return asm


def systemd_like(allows):
    """systemd bpf-devices: allow-list blocks ending in ``ja PASS``; tail r0=0, ja +1, PASS: r0=1, exit."""
    asm = Asm()
    _prologue(asm)
    for index, (kind, major, minor, access) in enumerate(allows):
        nxt = "s%d" % index
        if set(access) != set("rwm"):
            asm.op(0xBC, 1, 3).op(0x54, 1, imm=_acc(access)).jump(0x5D, 1, 3, target=nxt)
        if kind != "a":
            asm.jump(0x55, 2, target=nxt, imm=TYPES[kind])
        if major is not None:
            asm.jump(0x55, 4, target=nxt, imm=major)
        if minor is not None:
            asm.jump(0x55, 5, target=nxt, imm=minor)
        asm.jump(0x05, target="pass")
        asm.label(nxt)
    asm.op(0xB7, 0, imm=0).jump(0x05, target="exit").label("pass").op(0xB7, 0, imm=1).label("exit").op(0x95)
    return asm


def nvidia_prepend(allows, base_insns):
    """libnvidia-container: its blocks prepended to an existing program's xlated instructions; the type
    is loaded with a 16-bit ctx load (0x69), r2 is scratch for the access test (JMP32 0x5e)."""
    asm = Asm()
    asm.op(0x61, 3, 1, 0).op(0x74, 3, imm=16).op(0x61, 4, 1, 4).op(0x61, 5, 1, 8)
    for index, (kind, major, minor, access) in enumerate(allows):
        nxt = "n%d" % index
        asm.op(0x69, 2, 1, 0)  # r2 = *(u16 *)(ctx + 0): the type
        asm.jump(0x55, 2, target=nxt, imm=TYPES[kind])
        asm.op(0xBC, 2, 3).op(0x54, 2, imm=_acc(access)).jump(0x5E, 2, 3, target=nxt)
        asm.jump(0x55, 4, target=nxt, imm=major)
        asm.jump(0x55, 5, target=nxt, imm=minor)
        asm.op(0xB7, 0, imm=1).op(0x95)
        asm.label(nxt)
    return encode(asm.insns()) + bytes(base_insns)


# A typical runc allow-list for a container given GPU ``minor`` (standard devices, then the GPU rules).
def runc_gpu_rules(minors, uvm_major=510):
    rules = [
        ("c", None, None, "m", True), ("b", None, None, "m", True), ("c", 1, 3, "rwm", True), ("c", 1, 8, "rwm", True),
        ("c", 1, 7, "rwm", True), ("c", 5, 0, "rwm", True), ("c", 1, 5, "rwm", True), ("c", 1, 9, "rwm", True),
        ("c", 136, None, "rwm", True), ("c", 5, 2, "rwm", True), ("c", 10, 200, "rwm", True),
    ]  # fmt: skip
    rules += [("c", 195, minor, "rw", True) for minor in minors]
    rules += [("c", 195, 255, "rw", True), ("c", uvm_major, None, "rw", True)]
    return rules
