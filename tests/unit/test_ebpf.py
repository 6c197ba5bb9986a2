# SPDX-License-Identifier: GPL-3.0-or-later
"""The eBPF interpreter of the device-cgroup audit, instruction by instruction.

Values are checked through r0 at EXIT (``_ebpf.execute``); verdicts through ``Program``.  Operands are
set with LD_IMM64 so every test controls all 64 bits.
"""

from __future__ import annotations

import pytest
from ansible_collections.gpuharden.k8s.plugins.module_utils.bpf import _ebpf
from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

from tests.integration import devcg_shapes as shapes

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
INT64_MIN = 1 << 63
INT32_MIN = 1 << 31


def I(code, dst=0, src=0, off=0, imm=0):  # noqa: E743 - reads like the kernel's insn macros
    return (code, src << 4 | dst, off, imm)


def s32(value):
    value &= M32
    return value - (1 << 32) if value >> 31 else value


def ld64(dst, value):
    value &= M64
    return [I(0x18, dst, imm=s32(value)), I(0x00, imm=s32(value >> 32))]


EXIT = I(0x95)


def r0(*parts, ctx=bytes(12)):
    insns = []
    for part in parts:
        insns.extend(part if isinstance(part, list) else [part])
    return _ebpf.execute(insns + [EXIT], ctx)[0]


def unauditable(insns, ctx=bytes(12), match=None):
    verdict = _ebpf.run(insns, ctx)
    assert verdict.decision == _ebpf.UNAUDITABLE, verdict
    if match:
        assert match in verdict.reason, verdict.reason
    return verdict.reason


# ---------------------------------------------------------------------------------------------
# Decoding


def test_decode_encode_roundtrip():
    raw = bytes.fromhex("61210000000000005402000000ffff0018010000efbeadde0000000078563412950000000000000000")[:40]
    insns = _ebpf.decode(raw)
    assert insns[0] == _ebpf.Insn(0x61, 0x21, 0, 0)
    assert insns[1] == _ebpf.Insn(0x54, 0x02, 0, 0xFFFF00)
    assert insns[2] == _ebpf.Insn(0x18, 0x01, 0, -0x21524111) and insns[3] == _ebpf.Insn(0, 0, 0, 0x12345678)
    assert _ebpf.encode(insns) == raw
    assert _ebpf.decode(_ebpf.encode([(0x15, 0x03, -2, -1)])) == [_ebpf.Insn(0x15, 0x03, -2, -1)]
    with pytest.raises(GpuhardenError, match="8-byte"):
        _ebpf.decode(b"\x95" * 7)


def test_make_ctx_layout():
    assert _ebpf.make_ctx("c", 195, 3, "rw") == bytes.fromhex("02000600c300000003000000")
    assert _ebpf.make_ctx(1, 8, 0, _ebpf.ACC_MKNOD) == bytes.fromhex("010001000800000000000000")


# ---------------------------------------------------------------------------------------------
# ALU64 and ALU32, register (X) forms: r0 = a; r2 = b; r0 op= r2

ALU64_X = [
    ("add wraps", 0x0F, M64, 2, 1),
    ("sub wraps", 0x1F, 1, 2, M64),
    ("mul wraps", 0x2F, 1 << 32, 1 << 32, 0),
    ("div", 0x3F, 7, 2, 3),
    ("div by zero is 0", 0x3F, 7, 0, 0),
    ("or", 0x4F, 0xF0, 0x0F, 0xFF),
    ("and", 0x5F, 0xFF00FF, 0x0FF0F0, 0x0F00F0),
    ("lsh", 0x6F, 1, 63, INT64_MIN),
    ("lsh masks the shift to 6 bits", 0x6F, 1, 65, 2),
    ("rsh", 0x7F, INT64_MIN, 63, 1),
    ("rsh masks", 0x7F, INT64_MIN, 64 + 63, 1),
    ("mod", 0x9F, 7, 3, 1),
    ("mod by zero keeps dst", 0x9F, 7, 0, 7),
    ("xor", 0xAF, 0xFF, 0x0F, 0xF0),
    ("mov", 0xBF, 5, 0xDEADBEEF12345678, 0xDEADBEEF12345678),
    ("arsh sign-fills", 0xCF, INT64_MIN, 63, M64),
    ("arsh positive", 0xCF, 0x7000000000000000, 60, 7),
]

ALU32_X = [
    ("add wraps and clears the upper half", 0x0C, 0x1FFFFFFFF, 1, 0),
    ("sub wraps", 0x1C, 0, 1, M32),
    ("mul wraps", 0x2C, 0x10000, 0x10000, 0),
    ("div uses the low halves", 0x3C, 0x100000007, 0x200000002, 3),
    ("div by zero is 0", 0x3C, 7, 0, 0),
    ("or", 0x4C, 0xFFFFFFFF000000F0, 0x0F, 0xFF),
    ("and", 0x5C, 0xFFFFFFFFFFFFFFFF, 0xFFFF, 0xFFFF),
    ("lsh masks the shift to 5 bits", 0x6C, 1, 33, 2),
    ("lsh drops bits above 32", 0x6C, 0x80000000, 1, 0),
    ("rsh", 0x7C, 0xFFFFFFFF80000000, 31, 1),
    ("mod", 0x9C, 10, 4, 2),
    ("mod by zero keeps dst, zero-extended", 0x9C, 0x100000005, 0, 5),
    ("xor", 0xAC, 0xFFFFFFFF00000001, 3, 2),
    ("mov zero-extends", 0xBC, 0, 0xFFFFFFFFFFFFFFFF, M32),
    ("arsh sign-fills 32 bits", 0xCC, 0x80000000, 31, M32),
]


@pytest.mark.parametrize("name, code, a, b, expected", ALU64_X + ALU32_X, ids=[c[0] + hex(c[1]) for c in ALU64_X + ALU32_X])
def test_alu_register_forms(name, code, a, b, expected):
    assert r0(ld64(0, a), ld64(2, b), I(code, 0, 2)) == expected


SIGNED = [
    ("sdiv64", 0x3F, -7, 2, -3),
    ("sdiv64 both negative", 0x3F, -7, -2, 3),
    ("sdiv64 INT_MIN / -1 overflows to INT_MIN", 0x3F, -(1 << 63), -1, -(1 << 63)),
    ("sdiv64 by zero is 0", 0x3F, -7, 0, 0),
    ("smod64 sign follows the dividend", 0x9F, -7, 2, -1),
    ("smod64 positive dividend", 0x9F, 7, -2, 1),
    ("smod64 INT_MIN % -1 is 0", 0x9F, -(1 << 63), -1, 0),
    ("smod64 by zero keeps dst", 0x9F, -7, 0, -7),
]


@pytest.mark.parametrize("name, code, a, b, expected", SIGNED, ids=[c[0] for c in SIGNED])
def test_signed_div_mod_64(name, code, a, b, expected):
    assert r0(ld64(0, a), ld64(2, b), I(code, 0, 2, off=1)) == expected & M64


def test_signed_div_mod_32():
    assert r0(ld64(0, -7 & M32), ld64(2, 2), I(0x3C, 0, 2, off=1)) == (-3) & M32
    assert r0(ld64(0, INT32_MIN), ld64(2, M32), I(0x3C, 0, 2, off=1)) == INT32_MIN
    assert r0(ld64(0, -7 & M32), ld64(2, 2), I(0x9C, 0, 2, off=1)) == M32
    assert r0(ld64(0, 0xFFFFFFFF00000009), ld64(2, 0), I(0x9C, 0, 2, off=1)) == 9  # smod32 by zero: dst truncated
    assert r0(ld64(0, 9), I(0x34, 0, off=1, imm=-2)) == (-4) & M32  # SDIV K


# Immediate (K) forms: the immediate is sign-extended for ALU64, taken as 32 bits for ALU32.
ALU_K = [
    ("add64 K sign-extends", 0x07, 5, -1, 4),
    ("add32 K", 0x04, 0xFFFFFFFF, 1, 0),
    ("sub64 K", 0x17, 0, 1, M64),
    ("mul64 K", 0x27, 3, -1, (-3) & M64),
    ("div64 K", 0x37, 100, 7, 14),
    ("div32 K by zero", 0x34, 100, 0, 0),
    ("or64 K sign-extends", 0x47, 0, -256, (-256) & M64),
    ("and32 K", 0x54, 0x12345678, 0xFFFF, 0x5678),
    ("and64 K -1 keeps all", 0x57, M64, -1, M64),
    ("lsh64 K", 0x67, 1, 40, 1 << 40),
    ("rsh32 K", 0x74, 0x00060002, 16, 6),
    ("mod64 K by zero", 0x97, 11, 0, 11),
    ("xor64 K", 0xA7, 0xFF, -1, (~0xFF) & M64),
    ("xor32 K", 0xA4, 0xFF, -1, 0xFFFFFF00),
    ("mov64 K sign-extends", 0xB7, 0, -1, M64),
    ("mov32 K does not", 0xB4, 0, -1, M32),
    ("arsh64 K", 0xC7, (-16) & M64, 2, (-4) & M64),
    ("arsh32 K", 0xC4, 0xFFFFFFF0, 2, 0xFFFFFFFC),
]


@pytest.mark.parametrize("name, code, a, imm, expected", ALU_K, ids=[c[0] for c in ALU_K])
def test_alu_immediate_forms(name, code, a, imm, expected):
    assert r0(ld64(0, a), I(code, 0, imm=imm)) == expected


def test_neg():
    assert r0(ld64(0, 1), I(0x87, 0)) == M64
    assert r0(ld64(0, 1), I(0x84, 0)) == M32
    assert r0(ld64(0, 0xFFFFFFFF00000000), I(0x84, 0)) == 0
    unauditable([I(0xB7, 0, imm=1), I(0x8F, 0, 2), EXIT], match="unknown opcode")  # NEG has no X form


def test_movsx():
    assert r0(ld64(2, 0x80), I(0xBF, 0, 2, off=8)) == (-128) & M64
    assert r0(ld64(2, 0x7F), I(0xBF, 0, 2, off=8)) == 0x7F
    assert r0(ld64(2, 0x12348000), I(0xBF, 0, 2, off=16)) == (-0x8000) & M64
    assert r0(ld64(2, 0x80000000), I(0xBF, 0, 2, off=32)) == (-(1 << 31)) & M64
    assert r0(ld64(2, 0x80), I(0xBC, 0, 2, off=8)) == 0xFFFFFF80
    assert r0(ld64(2, 0x8000), I(0xBC, 0, 2, off=16)) == 0xFFFF8000
    unauditable(ld64(2, 1) + [I(0xBC, 0, 2, off=32), EXIT], match="offset 32")
    unauditable(ld64(2, 1) + [I(0xBF, 0, 2, off=1, imm=1), EXIT], match="offset 1")  # arena address-space cast
    unauditable([I(0xB7, 0, off=8, imm=1), EXIT], match="immediate with offset")


def test_zero_extension_hint_is_a_plain_mov32():
    # Verifier-inserted `w2 = w2` (imm 1) on JITs that want explicit zero-extension.
    assert r0(ld64(0, 0xFFFFFFFF00000007), I(0xBC, 0, 0, imm=1)) == 7


def test_byte_swaps():
    value = 0x1122334455667788
    assert r0(ld64(0, value), I(0xD4, 0, imm=16)) == 0x7788  # le16: truncate on little endian
    assert r0(ld64(0, value), I(0xD4, 0, imm=32)) == 0x55667788
    assert r0(ld64(0, value), I(0xD4, 0, imm=64)) == value
    assert r0(ld64(0, value), I(0xDC, 0, imm=16)) == 0x8877  # be16: swap
    assert r0(ld64(0, value), I(0xDC, 0, imm=32)) == 0x88776655
    assert r0(ld64(0, value), I(0xDC, 0, imm=64)) == 0x8877665544332211
    assert r0(ld64(0, value), I(0xD7, 0, imm=16)) == 0x8877  # bswap16 (ALU64 class)
    assert r0(ld64(0, value), I(0xD7, 0, imm=32)) == 0x88776655
    assert r0(ld64(0, value), I(0xD7, 0, imm=64)) == 0x8877665544332211
    unauditable(ld64(0, 1) + [I(0xD4, 0, imm=8), EXIT], match="byte swap of 8 bits")
    unauditable(ld64(0, 1) + [I(0xDF, 0, imm=16), EXIT], match="unknown opcode")


def test_alu_offset_only_for_div_mod():
    unauditable(ld64(0, 1) + [I(0x07, 0, off=1, imm=1), EXIT], match="offset")
    unauditable(ld64(0, 1) + [I(0x37, 0, off=2, imm=1), EXIT], match="offset 2")


def test_unknown_alu_operation():
    unauditable(ld64(0, 1) + [I(0xE7, 0, imm=1), EXIT], match="unknown ALU")


# ---------------------------------------------------------------------------------------------
# JMP and JMP32: r2 = a; r3 = b; if (r2 op r3) r0 = 1 else r0 = 0


def jump_taken(code, a, b, imm=None):
    branch = I(code, 2, 3, off=2) if imm is None else I(code, 2, off=2, imm=imm)
    return r0(ld64(2, a), ld64(3, b), branch, I(0xB7, 0, imm=0), EXIT, I(0xB7, 0, imm=1)) == 1


JUMPS = [
    # (name, op, a, b, taken in JMP, taken in JMP32)
    ("jeq", 0x10, 5, 5, True, True),
    ("jeq upper bits", 0x10, 0x100000005, 5, False, True),
    ("jne", 0x50, 5, 6, True, True),
    ("jne upper bits", 0x50, 0x100000005, 5, True, False),
    ("jgt unsigned", 0x20, M64, 1, True, True),
    ("jgt equal", 0x20, 1, 1, False, False),
    ("jge", 0x30, 1, 1, True, True),
    ("jge less", 0x30, 0, 1, False, False),
    ("jlt unsigned", 0xA0, 1, M64, True, True),
    ("jlt upper bits", 0xA0, 0x100000000, 1, False, True),
    ("jle", 0xB0, 2, 2, True, True),
    ("jle greater", 0xB0, 3, 2, False, False),
    ("jset", 0x40, 0b1010, 0b0010, True, True),
    ("jset none", 0x40, 0b1010, 0b0101, False, False),
    ("jset upper bits", 0x40, 1 << 40, 1 << 40, True, False),
    ("jsgt signed", 0x60, M64, 1, False, False),
    ("jsgt 32-bit sign", 0x60, 0x80000000, 1, True, False),
    ("jsge", 0x70, (-1) & M64, (-1) & M64, True, True),
    ("jsge negative", 0x70, (-2) & M64, (-1) & M64, False, False),
    ("jslt", 0xC0, (-5) & M64, 3, True, True),
    ("jslt 32-bit sign", 0xC0, 0x80000000, 1, False, True),
    ("jsle", 0xD0, 3, 3, True, True),
    ("jsle greater", 0xD0, 4, 3, False, False),
]


@pytest.mark.parametrize("name, op, a, b, taken64, taken32", JUMPS, ids=[j[0] for j in JUMPS])
def test_conditional_jumps(name, op, a, b, taken64, taken32):
    assert jump_taken(0x05 | op | 0x08, a, b) is taken64  # JMP, X
    assert jump_taken(0x06 | op | 0x08, a, b) is taken32  # JMP32, X


def test_conditional_jump_immediates():
    assert jump_taken(0x15, M64, 0, imm=-1)  # JMP K: imm sign-extended to 64 bits
    assert not jump_taken(0x15, M32, 0, imm=-1)
    assert jump_taken(0x16, M32, 0, imm=-1)  # JMP32 K: 32 bits
    assert jump_taken(0x16, 0xABCDEF00FFFFFFFF, 0, imm=-1)
    assert jump_taken(0x65, 5, 0, imm=-1)  # jsgt 5 > -1
    assert not jump_taken(0x25, 5, 0, imm=-1)  # jgt 5 > 0xffff...
    assert jump_taken(0xA6, 5, 0, imm=-1)  # jlt32 5 < 0xffffffff
    assert jump_taken(0x46, 0x100000001, 0, imm=1)  # jset32


def test_ja_and_gotol():
    assert r0(I(0xB7, 0, imm=1), I(0x05, off=1), I(0xB7, 0, imm=2)) == 1
    assert r0(I(0xB7, 0, imm=1), I(0x06, off=0, imm=1), I(0xB7, 0, imm=2)) == 1  # JMP32 JA uses imm
    assert r0(I(0xB7, 0, imm=1), I(0x05, off=0), I(0xB7, 0, imm=2)) == 2  # ja +0
    unauditable([I(0xB7, 0, imm=1), I(0x0D), EXIT], match="unknown opcode")


def test_jump_unknown_and_misplaced():
    unauditable(ld64(2, 1) + [I(0xE5, 2, off=0, imm=1), I(0xB7, 0), EXIT], match="unknown jump")
    unauditable([I(0xB7, 0, imm=1), I(0x96)], match="unknown opcode")  # EXIT in JMP32
    unauditable([I(0xB7, 0, imm=1), I(0x86, imm=1), EXIT], match="unknown opcode")  # CALL in JMP32


def test_jump_outside_the_program():
    unauditable([I(0xB7, 0, imm=1), I(0x05, off=5), EXIT], match="outside")
    unauditable([I(0xB7, 0, imm=1), I(0x05, off=-3), EXIT], match="outside")
    unauditable([I(0xB7, 0, imm=1)], match="falls off the end")
    unauditable([I(0xB7, 0, imm=1), I(0x05, off=1), EXIT], match="falls off the end")


# ---------------------------------------------------------------------------------------------
# Registers: 12 of them, r10 read-only, r11 as constant blinding uses it


def test_all_general_registers():
    insns = [I(0xB7, reg, imm=reg) for reg in range(0, 10) if reg != 1] + [I(0xB7, 11, imm=11)]
    insns += [I(0x0F, 0, reg) for reg in (2, 3, 4, 5, 6, 7, 8, 9, 11)]
    assert r0(insns) == sum(range(10)) - 1 + 11


def test_r10_is_read_only_and_r12_does_not_exist():
    unauditable([I(0xB7, 10, imm=1), I(0xB7, 0), EXIT], match="r10")
    unauditable([I(0x61, 10, 1, 0), I(0xB7, 0), EXIT], match="r10")
    unauditable([I(0xB7, 12, imm=1), EXIT], match="r12")
    unauditable([I(0xBF, 0, 15), EXIT], match="r15")


def blind(plain, rnd):
    """What net.core.bpf_jit_harden=2 makes of a program: every immediate goes through r11 (AX), and
    `w0 = 0` becomes `r0 ^= r0`; jump offsets are remapped to the grown program."""
    groups = []
    for code, regs, off, imm in plain:
        dst = regs & 0xF
        if code in (0xB4, 0xB7) and imm == 0:
            groups.append([I(0xAF, dst, dst)])
        elif code == 0x55:  # if rX != imm -> mov r11, rnd^imm; xor r11, rnd; if rX != r11
            groups.append([I(0xB7, 11, imm=rnd ^ imm), I(0xA7, 11, imm=rnd), ("jump", 0x5D, dst, 11, off)])
        elif code == 0x54:  # w2 &= imm
            groups.append([I(0xB4, 11, imm=rnd ^ imm), I(0xA4, 11, imm=rnd), I(0x5C, dst, 11)])
        elif code in (0xB4, 0xB7):  # w0 = imm
            groups.append([I(0xB4, 11, imm=rnd ^ imm), I(0xA4, 11, imm=rnd), I(0xBC, dst, 11)])
        elif code & 7 in (5, 6) and code not in (0x85, 0x95):
            groups.append([("jump", code, dst, regs >> 4, off)])
        else:
            groups.append([(code, regs, off, imm)])
    starts = [0]
    for group in groups:
        starts.append(starts[-1] + len(group))
    out = []
    for index, group in enumerate(groups):
        for insn in group:
            if insn[0] == "jump":
                _tag, code, dst, src, off = insn
                out.append(I(code, dst, src, off=starts[index + 1 + off] - len(out) - 1))
            else:
                out.append(insn)
    return out


def test_blinded_constants_through_r11():
    plain = shapes.runc_like([("c", 195, 1, "rw", True), ("c", 1, 3, "rwm", True), ("c", 195, 2, "r", False)]).insns()
    blinded = blind(plain, 0x5A5AC3C3)
    assert {code for code, *_ in blinded} >= {0xB4, 0xB7, 0xA4, 0xA7, 0xAF, 0x5C, 0x5D}
    assert any(regs & 0xF == 11 or regs >> 4 == 11 for _code, regs, _off, _imm in blinded)
    plain_prog, blinded_prog = _ebpf.Program(plain), _ebpf.Program(blinded)
    for dev in (("c", 195, 1), ("c", 195, 0), ("c", 195, 2), ("c", 1, 3), ("b", 1, 3), ("c", 195, 255)):
        for access in ("r", "w", "rw", "m", "rwm"):
            assert blinded_prog.decide(*dev, access).decision == plain_prog.decide(*dev, access).decision, (dev, access)
    assert blinded_prog.decide("c", 195, 1, "rw").decision == _ebpf.ALLOW
    assert blinded_prog.decide("c", 195, 1, "m").decision == _ebpf.DENY


def test_xor_and_sub_of_a_register_with_itself_is_zero():
    # Blinding writes `w0 = 0` as `r0 ^= r0`, also where r0 was never written.
    assert r0(I(0xAF, 0, 0)) == 0
    assert r0(I(0xAC, 0, 0)) == 0
    assert r0(I(0x1F, 0, 0)) == 0
    assert r0(ld64(0, 77), I(0xAF, 0, 0)) == 0


def test_read_before_write():
    unauditable([I(0xBF, 0, 2), EXIT], match="reads r2 before")
    unauditable([EXIT], match="reads r0 before")
    unauditable([I(0xB7, 0), I(0x5D, 0, 4, off=0), EXIT], match="reads r4 before")


# ---------------------------------------------------------------------------------------------
# LD_IMM64


def test_ld_imm64():
    assert r0(ld64(0, 0xDEADBEEFCAFEF00D)) == 0xDEADBEEFCAFEF00D
    assert r0(ld64(0, M64)) == M64
    unauditable([I(0x18, 0, 1, imm=3), I(0x00), EXIT], match="map fd")
    unauditable([I(0x18, 0, 2, imm=3), I(0x00), EXIT], match="map value")
    unauditable([I(0x18, 0, 4, imm=3), I(0x00), EXIT], match="function")
    unauditable([I(0x18, 0, imm=3)], match="second half")
    unauditable([I(0x18, 0, imm=3), I(0xB7, 0), EXIT], match="second half")
    unauditable([I(0x20, 0, imm=3), EXIT], match="legacy packet load")


# ---------------------------------------------------------------------------------------------
# Context loads: only from the 12-byte context, with the kernel's rules

CTX = _ebpf.make_ctx("c", 0x1C3, 0x0A0B0C0D, "rw")  # access_type 0x00060002, major 451, minor 0x0a0b0c0d


def test_context_loads():
    assert r0(I(0x61, 0, 1, 0), ctx=CTX) == 0x00060002
    assert r0(I(0x61, 0, 1, 4), ctx=CTX) == 0x1C3
    assert r0(I(0x61, 0, 1, 8), ctx=CTX) == 0x0A0B0C0D
    assert r0(I(0x69, 0, 1, 0), ctx=CTX) == 2  # u16: type (NVIDIA's prologue)
    assert r0(I(0x69, 0, 1, 2), ctx=CTX) == 6  # u16: access
    assert r0(I(0x71, 0, 1, 0), ctx=CTX) == 2
    assert r0(I(0x71, 0, 1, 2), ctx=CTX) == 6
    assert r0(I(0x71, 0, 1, 3), ctx=CTX) == 0


def test_context_loads_through_a_moved_and_offset_pointer():
    assert r0(I(0xBF, 6, 1), I(0x07, 6, imm=8), I(0x61, 0, 6, -4), ctx=CTX) == 0x1C3
    assert r0(I(0xBF, 6, 1), I(0xB7, 7, imm=4), I(0x0F, 6, 7), I(0x61, 0, 6, 0), ctx=CTX) == 0x1C3
    assert r0(I(0xBF, 6, 1), I(0x17, 6, imm=-8), I(0x61, 0, 6, 0), ctx=CTX) == 0x0A0B0C0D


def test_sign_extending_context_load():
    ctx = _ebpf.make_ctx(0x80, 0, 0, 0)
    assert r0(I(0x91, 0, 1, 0), ctx=ctx) == (-128) & M64  # LDX MEMSX B
    assert r0(I(0x71, 0, 1, 0), ctx=ctx) == 0x80


@pytest.mark.parametrize(
    "insn, why",
    [
        (I(0x61, 0, 1, 12), "past the end"),
        (I(0x61, 0, 1, -4), "before the start"),
        (I(0x61, 0, 1, 2), "misaligned"),
        (I(0x69, 0, 1, 4), "narrow load of major"),
        (I(0x71, 0, 1, 9), "narrow load of minor"),
        (I(0x79, 0, 1, 0), "8-byte load"),
        (I(0x69, 0, 1, 1), "misaligned u16"),
    ],
)
def test_context_loads_the_kernel_would_refuse(insn, why):
    unauditable([insn, EXIT], ctx=CTX, match="context offset")


def test_loads_from_elsewhere_are_unauditable():
    unauditable([I(0x61, 0, 10, -8), EXIT], match="points to the stack")  # the stack
    unauditable([I(0xB7, 2, imm=0), I(0x61, 0, 2, 0), EXIT], match="a scalar")  # a number
    unauditable([I(0x61, 0, 3, 0), EXIT], match="before it is written")
    unauditable([I(0x81, 0, 10, 0), EXIT])  # unknown load mode
    unauditable([I(0x41, 0, 1, 0), EXIT], match="unknown load")


def test_stores_and_atomics_are_unauditable():
    unauditable([I(0x62, 10, off=-8, imm=1), I(0xB7, 0), EXIT], match="stores")  # ST
    unauditable([I(0xB7, 2), I(0x63, 10, 2, off=-8), I(0xB7, 0), EXIT], match="stores")  # STX
    unauditable([I(0xB7, 2), I(0xDB, 10, 2, off=-8), I(0xB7, 0), EXIT], match="stores")  # atomic add


def test_pointers_in_arithmetic_comparisons_and_exit():
    unauditable([I(0x27, 1, imm=2), I(0xB7, 0), EXIT], match="mul on a pointer")
    unauditable([I(0xBC, 2, 1), I(0xB7, 0), EXIT], match="pointer")  # mov32 of a pointer
    unauditable([I(0xB7, 2, imm=3), I(0x0F, 2, 1), I(0xB7, 0), EXIT], match="add on a pointer")
    unauditable([I(0x04, 1, imm=2), I(0xB7, 0), EXIT], match="on a pointer")  # 32-bit add to a pointer
    unauditable([I(0xB7, 0), I(0x15, 1, off=0, imm=0), EXIT], match="compares a pointer")
    unauditable([I(0xBF, 0, 1), EXIT], match="returns a pointer")
    unauditable([I(0xBF, 0, 10), EXIT], match="returns a pointer")
    unauditable([I(0xBF, 2, 1), I(0xD4, 2, imm=16), I(0xB7, 0), EXIT], match="pointer")


# ---------------------------------------------------------------------------------------------
# Calls, loops, malformed programs


def test_calls_are_unauditable():
    unauditable([I(0x85, imm=14), EXIT], match="helper")  # bpf_get_current_pid_tgid
    unauditable([I(0x85, 0, 1, imm=1), EXIT, I(0xB7, 0), EXIT], match="BPF-to-BPF")
    unauditable([I(0x85, 0, 2, imm=1), EXIT], match="kfunc")


def test_loops_are_bounded():
    counted = [I(0xB7, 2, imm=0), I(0x07, 2, imm=1), I(0xA5, 2, off=-2, imm=10), I(0xBF, 0, 2), EXIT]
    assert _ebpf.execute(counted)[0] == 10
    reason = unauditable([I(0xB7, 0, imm=1), I(0x05, off=-1), EXIT], match="loop")
    assert str(_ebpf.MAX_STEPS) in reason
    assert _ebpf.Program(counted, max_steps=10).run(bytes(12)).decision == _ebpf.UNAUDITABLE


@pytest.mark.parametrize(
    "program, match",
    [
        ([], "empty"),
        ([(0x95, 0, 0)], "not a (code, regs, off, imm)"),
        (["not an insn"], "not a (code, regs, off, imm)"),
        ([(0x95, 0x00, 0, 0.5)], "invalid fields"),
        ([(0x195, 0x00, 0, 0)], "invalid fields"),
        ([(0xB7, 0x100, 0, 0), (0x95, 0, 0, 0)], "invalid fields"),
        ([(0xFF, 0, 0, 0)], "unknown"),
    ],
)
def test_malformed_programs(program, match):
    verdict = _ebpf.run(program, bytes(12))
    assert verdict.decision == _ebpf.UNAUDITABLE and match in verdict.reason, verdict


def test_bad_context_size():
    assert _ebpf.run([I(0xB7, 0, imm=1), EXIT], bytes(8)).decision == _ebpf.UNAUDITABLE
    with pytest.raises(_ebpf.Unauditable, match="8 bytes"):
        _ebpf.execute([I(0xB7, 0, imm=1), EXIT], bytes(8))


# ---------------------------------------------------------------------------------------------
# Verdicts


def test_return_value_is_read_as_u32():
    assert _ebpf.run([I(0xB7, 0, imm=1), EXIT], bytes(12)).decision == _ebpf.ALLOW
    assert _ebpf.run([I(0xB7, 0, imm=2), EXIT], bytes(12)).decision == _ebpf.ALLOW
    assert _ebpf.run([I(0xB7, 0, imm=0), EXIT], bytes(12)).decision == _ebpf.DENY
    assert _ebpf.run(ld64(0, 1 << 32) + [EXIT], bytes(12)).decision == _ebpf.DENY


def test_combine_is_an_and():
    allow, deny = _ebpf.Verdict(_ebpf.ALLOW, "a"), _ebpf.Verdict(_ebpf.DENY, "d")
    unknown = _ebpf.Verdict(_ebpf.UNAUDITABLE, "u")
    assert _ebpf.combine([]).decision == _ebpf.ALLOW
    assert _ebpf.combine([allow, allow]).decision == _ebpf.ALLOW
    assert _ebpf.combine([allow, deny]) == deny
    assert _ebpf.combine([unknown, deny]) == deny  # one certain deny decides
    assert _ebpf.combine([allow, unknown]) == unknown


def test_program_memoises_per_context():
    program = _ebpf.Program([I(0x61, 0, 1, 8), EXIT])
    ctx = _ebpf.make_ctx("c", 195, 1, "r")
    first = program.run(ctx)
    assert program.run(ctx) is first
    assert program.decide("c", 195, 0, "r").decision == _ebpf.DENY


# ---------------------------------------------------------------------------------------------
# Generator shapes, against the ground truth of the reference sheet (section 6)

GROUND_TRUTH_RULES = [
    ("c", 1, 3, "rwm", True), ("c", 195, 1, "rw", True), ("c", 195, 254, "r", True), ("c", 10, 200, "m", True),
    ("c", 195, None, "m", True),
]  # fmt: skip


def test_runc_shape_ground_truth():
    program = _ebpf.Program(shapes.runc_like(GROUND_TRUTH_RULES).insns())
    expect = {
        (195, 0, "r"): _ebpf.DENY, (195, 0, "w"): _ebpf.DENY, (195, 0, "rw"): _ebpf.DENY,
        (195, 1, "r"): _ebpf.ALLOW, (195, 1, "w"): _ebpf.ALLOW, (195, 1, "rw"): _ebpf.ALLOW,
        (195, 254, "r"): _ebpf.ALLOW, (195, 254, "w"): _ebpf.DENY, (195, 254, "rw"): _ebpf.DENY,
        (10, 200, "r"): _ebpf.DENY, (10, 200, "m"): _ebpf.ALLOW, (1, 3, "rw"): _ebpf.ALLOW, (1, 3, "m"): _ebpf.ALLOW,
        (195, 0, "m"): _ebpf.ALLOW, (195, 7, "m"): _ebpf.ALLOW,
    }  # fmt: skip
    for (major, minor, access), decision in expect.items():
        assert program.decide("c", major, minor, access).decision == decision, (major, minor, access)
    assert program.decide("b", 1, 3, "r").decision == _ebpf.DENY


def test_nvidia_shape_uses_u16_load_and_jmp32():
    base = shapes.runc_like([("c", 1, 3, "rwm", True)]).bytes()
    program = _ebpf.decode(shapes.nvidia_prepend([("c", 195, 0, "rw")], base))
    assert {0x69, 0x5E} <= {insn.code for insn in program}
    prog = _ebpf.Program(program)
    assert prog.decide("c", 195, 0, "rw").decision == _ebpf.ALLOW
    assert prog.decide("c", 195, 0, "m").decision == _ebpf.DENY
    assert prog.decide("c", 1, 3, "m").decision == _ebpf.ALLOW
    assert prog.decide("b", 195, 0, "r").decision == _ebpf.DENY


def test_systemd_and_crun_shapes():
    systemd = _ebpf.Program(shapes.systemd_like([("c", 195, 0, "rw"), ("a", 1, None, "rwm")]).insns())
    assert systemd.decide("c", 195, 0, "r").decision == _ebpf.ALLOW
    assert systemd.decide("c", 195, 0, "m").decision == _ebpf.DENY
    assert systemd.decide("b", 1, 7, "rwm").decision == _ebpf.ALLOW
    crun = _ebpf.Program(shapes.crun_like([("c", 195, 3, "rwm", False), ("c", 195, None, "rw", True), ("a", None, None, "rwm", False)]).insns())
    assert crun.decide("c", 195, 3, "r").decision == _ebpf.DENY
    assert crun.decide("c", 195, 4, "r").decision == _ebpf.ALLOW
    assert crun.decide("c", 1, 3, "r").decision == _ebpf.DENY
