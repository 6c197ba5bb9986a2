# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
"""A small, general eBPF interpreter for BPF_CGROUP_DEVICE programs (pure; no I/O).

The kernel's device-cgroup hook calls each program with a 12-byte ``struct bpf_cgroup_dev_ctx``
(``access_type`` u32 @0 = access << 16 | type, ``major`` u32 @4, ``minor`` u32 @8) and allows the
access when the program returns non-zero.  Programs come from runc, crun, systemd and
libnvidia-container, and what the kernel dumps back (the *translated* instructions) may differ from
what was loaded: dead code removed, zero-extension inserted, constants blinded through the hidden
register r11.  So this is an interpreter of the instruction set, not a pattern matcher:

* 12 registers (r0-r10 and r11, the verifier's auxiliary register used by constant blinding);
* every ALU and ALU64 operation (signed DIV/MOD and MOVSX included, byte swaps), every JMP and
  JMP32 condition, JA (and JMP32 ``gotol``), LD_IMM64 with a plain constant, EXIT;
* loads only from the context, with the kernel's own rules (in bounds, aligned, narrow loads only
  inside ``access_type``).

Anything else (helper or BPF-to-BPF calls, map loads, stack or other memory, stores, atomics, a
pointer used in arithmetic or comparisons, a run past the step limit) makes the verdict
"unauditable" with a reason: it is never guessed.  Malformed programs (bad opcode, jump outside the
program, a read of an unwritten register) are unauditable too.

Verdicts: ``Verdict(decision, reason)`` with ``decision`` one of ALLOW, DENY, UNAUDITABLE.
"""

from __future__ import annotations

import struct
from collections import namedtuple

from ansible_collections.gpuharden.k8s.plugins.module_utils.core._errors import GpuhardenError

ALLOW = "allow"
DENY = "deny"
UNAUDITABLE = "unauditable"

Insn = namedtuple("Insn", "code regs off imm")
Verdict = namedtuple("Verdict", "decision reason")

# struct bpf_cgroup_dev_ctx
CTX_SIZE = 12
DEV_BLOCK = 1
DEV_CHAR = 2
ACC_MKNOD = 1
ACC_READ = 2
ACC_WRITE = 4
ACCESS_BITS = {"m": ACC_MKNOD, "r": ACC_READ, "w": ACC_WRITE}
DEVICE_TYPES = {"b": DEV_BLOCK, "c": DEV_CHAR}

MAX_STEPS = 65536
MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF
SIGN32 = 0x80000000
SIGN64 = 0x8000000000000000

# Instruction classes and fields (linux/bpf_common.h, linux/bpf.h).
CLS_LD, CLS_LDX, CLS_ST, CLS_STX, CLS_ALU, CLS_JMP, CLS_JMP32, CLS_ALU64 = range(8)
SRC_X = 0x08
MODE_IMM, MODE_ABS, MODE_IND, MODE_MEM, MODE_MEMSX = 0x00, 0x20, 0x40, 0x60, 0x80
LOAD_SIZES = {0x00: 4, 0x08: 2, 0x10: 1, 0x18: 8}
ALU_ADD, ALU_SUB, ALU_MUL, ALU_DIV, ALU_OR, ALU_AND, ALU_LSH, ALU_RSH = 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70
ALU_NEG, ALU_MOD, ALU_XOR, ALU_MOV, ALU_ARSH, ALU_END = 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0
JMP_JA, JMP_JEQ, JMP_JGT, JMP_JGE, JMP_JSET, JMP_JNE, JMP_JSGT, JMP_JSGE = 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70
JMP_CALL, JMP_EXIT, JMP_JLT, JMP_JLE, JMP_JSLT, JMP_JSLE = 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0

ALU_NAMES = {
    ALU_ADD: "add", ALU_SUB: "sub", ALU_MUL: "mul", ALU_DIV: "div", ALU_OR: "or", ALU_AND: "and", ALU_LSH: "lsh",
    ALU_RSH: "rsh", ALU_NEG: "neg", ALU_MOD: "mod", ALU_XOR: "xor", ALU_MOV: "mov", ALU_ARSH: "arsh", ALU_END: "end",
}  # fmt: skip

# Register values: a scalar is an int in [0, 2**64); pointers are tuples; None = never written.
CTX_PTR = ("ctx", 0)
FRAME_PTR = ("stack", 0)


class Unauditable(GpuhardenError):
    """The program cannot be audited (or is malformed); ``args[0]`` says why.  Internal to this module:
    ``Program.run`` turns it into an UNAUDITABLE verdict."""


def decode(data):
    """8-byte little-endian instructions -> list of ``Insn(code, regs, off, imm)``.

    ``regs`` is the raw byte (dst in the low nibble, src in the high one); ``off`` and ``imm`` are signed.
    Raises GpuhardenError when the length is not a multiple of 8.
    """
    if len(data) % 8:
        raise GpuhardenError("program of %d bytes is not a whole number of 8-byte instructions" % len(data))
    return [Insn(*fields) for fields in struct.iter_unpack("<BBhi", bytes(data))]


def encode(insns):
    """The inverse of ``decode``."""
    return b"".join(struct.pack("<BBhi", code, regs, off, imm) for code, regs, off, imm in insns)


def make_ctx(dev_type, major, minor, access):
    """The 12-byte context for a device type ("c"/"b" or 2/1), numbers and access ("rw", "m"... or bits)."""
    if isinstance(dev_type, str):
        dev_type = DEVICE_TYPES[dev_type]
    if isinstance(access, str):
        bits = 0
        for letter in access:
            bits |= ACCESS_BITS[letter]
        access = bits
    return struct.pack("<III", (access << 16 | dev_type) & MASK32, major & MASK32, minor & MASK32)


def _s64(value):
    return value - (1 << 64) if value & SIGN64 else value


def _s32(value):
    value &= MASK32
    return value - (1 << 32) if value & SIGN32 else value


def _sext(value, bits):
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) & 1 else value


def _tdiv(a, b):
    """C division (truncation toward zero) of signed ints, b != 0."""
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _bswap(value, bits):
    return int.from_bytes((value & ((1 << bits) - 1)).to_bytes(bits // 8, "little"), "big")


def _prepare(program):
    """(code, dst, src, off, imm) tuples, fields and registers checked once."""
    prepared = []
    for index, insn in enumerate(program):
        try:
            code, regs, off, imm = insn
        except (TypeError, ValueError):
            raise Unauditable("instruction %d is not a (code, regs, off, imm) tuple: %r" % (index, insn)) from None
        if (
            not isinstance(code, int)
            or not isinstance(regs, int)
            or not isinstance(off, int)
            or not isinstance(imm, int)
            or code >> 8
            or regs >> 8
            or code < 0
            or regs < 0
        ):
            raise Unauditable("instruction %d has invalid fields: %r" % (index, tuple(insn)))
        dst, src = regs & 0xF, regs >> 4
        if dst > 11 or src > 11:
            raise Unauditable("instruction %d uses register r%d (only r0-r11 exist)" % (index, max(dst, src)))
        prepared.append((code, dst, src, off, imm))
    return prepared


def _read(regs, reg, pc):
    value = regs[reg]
    if value is None:
        raise Unauditable("insn %d reads r%d before it is written" % (pc, reg))
    return value


def _scalar(regs, reg, pc, what):
    value = _read(regs, reg, pc)
    if isinstance(value, tuple):
        raise Unauditable("insn %d uses a pointer (r%d, %s) in %s" % (pc, reg, value[0], what))
    return value


def _load(regs, ctx, src, off, size, signed, pc):
    pointer = _read(regs, src, pc)
    if not isinstance(pointer, tuple) or pointer[0] != "ctx":
        kind = "a scalar" if not isinstance(pointer, tuple) else "the %s" % pointer[0]
        raise Unauditable("insn %d loads through r%d, which points to %s, not the device context" % (pc, src, kind))
    addr = pointer[1] + off
    # The kernel's cgroup_dev_is_valid_access: in bounds, aligned, narrow loads only in access_type.
    if addr < 0 or addr + size > CTX_SIZE or addr % size or (addr >= 4 and size != 4) or size > 4:
        raise Unauditable("insn %d loads %d bytes at context offset %d, outside what the kernel allows" % (pc, size, addr))
    value = int.from_bytes(ctx[addr : addr + size], "little")
    if signed:
        value = _sext(value, size * 8) & MASK64
    return value


def _alu(op, is64, a, b, off, pc):
    bits = 64 if is64 else 32
    mask = MASK64 if is64 else MASK32
    a &= mask
    b &= mask
    if op == ALU_ADD:
        return (a + b) & mask
    if op == ALU_SUB:
        return (a - b) & mask
    if op == ALU_MUL:
        return (a * b) & mask
    if op == ALU_OR:
        return a | b
    if op == ALU_AND:
        return a & b
    if op == ALU_XOR:
        return a ^ b
    if op == ALU_LSH:
        return (a << (b & (bits - 1))) & mask
    if op == ALU_RSH:
        return a >> (b & (bits - 1))
    if op == ALU_ARSH:
        return (_sext(a, bits) >> (b & (bits - 1))) & mask
    if op in (ALU_DIV, ALU_MOD):
        if off == 0:
            if b == 0:  # division by zero yields 0; modulo by zero leaves dst (truncated for ALU32)
                return 0 if op == ALU_DIV else a
            return a // b if op == ALU_DIV else a % b
        if off == 1:  # SDIV / SMOD
            sa, sb = _sext(a, bits), _sext(b, bits)
            if sb == 0:
                return 0 if op == ALU_DIV else a
            q = _tdiv(sa, sb)
            return (q if op == ALU_DIV else sa - sb * q) & mask
        raise Unauditable("insn %d: %s with offset %d is not an instruction" % (pc, ALU_NAMES[op], off))
    raise Unauditable("insn %d: unknown ALU operation 0x%02x" % (pc, op))


_EXIT = -1


def _execute(compiled, ctx, max_steps):
    prog, ops, loops = compiled
    regs = [None] * 12
    regs[1] = CTX_PTR
    regs[10] = FRAME_PTR
    pc = 0
    steps = 0
    try:
        if not loops:  # only forward jumps: at most len(prog) steps, no need to count
            while pc >= 0:
                pc = ops[pc](regs, ctx, prog, pc)
            return regs[0], steps
        while pc >= 0:
            steps += 1
            if steps > max_steps:
                raise Unauditable("still running after %d steps (loop)" % max_steps)
            pc = ops[pc](regs, ctx, prog, pc)
    except IndexError:  # a forward jump past the end (fast closures do not check bounds)
        raise Unauditable("a jump reaches insn %d, outside the %d-insn program" % (pc, len(prog))) from None
    return regs[0], steps


def _target(prog, pc, delta):
    target = pc + delta
    if not 0 <= target <= len(prog):
        raise Unauditable("insn %d jumps to insn %d, outside the %d-insn program" % (pc, target, len(prog)))
    return target


def _step(prog, regs, ctx, pc):
    """Execute instruction ``pc``; returns the next pc, or _EXIT with the result in r0."""
    code, dst, src, off, imm = prog[pc]
    cls = code & 7
    if cls in (CLS_ALU, CLS_ALU64):
        is64 = cls == CLS_ALU64
        op = code & 0xF0
        if dst == 10:
            raise Unauditable("insn %d writes r10 (read-only frame pointer)" % pc)
        if op == ALU_MOV:
            if code & SRC_X:
                value = _read(regs, src, pc)
                if isinstance(value, tuple):
                    if not is64 or off:
                        raise Unauditable("insn %d: 32-bit or sign-extending move of a pointer (r%d)" % (pc, src))
                    regs[dst] = value
                elif off == 0:
                    regs[dst] = value if is64 else value & MASK32
                elif off in (8, 16) or (off == 32 and is64):  # MOVSX
                    regs[dst] = _sext(value, off) & (MASK64 if is64 else MASK32)
                else:
                    raise Unauditable("insn %d: mov with offset %d is not supported" % (pc, off))
            else:
                if off:
                    raise Unauditable("insn %d: mov of an immediate with offset %d" % (pc, off))
                regs[dst] = imm & (MASK64 if is64 else MASK32)
        elif op == ALU_END:
            if imm not in (16, 32, 64):
                raise Unauditable("insn %d: byte swap of %d bits" % (pc, imm))
            value = _scalar(regs, dst, pc, "a byte swap")
            if is64:
                if code & SRC_X:
                    raise Unauditable("insn %d: unknown opcode 0x%02x" % (pc, code))
                regs[dst] = _bswap(value, imm)  # BSWAP (unconditional)
            elif code & SRC_X:
                regs[dst] = _bswap(value, imm)  # TO_BE on a little-endian kernel
            else:
                regs[dst] = value & ((1 << imm) - 1)  # TO_LE: truncate
        elif op == ALU_NEG:
            if code & SRC_X or off:
                raise Unauditable("insn %d: unknown opcode 0x%02x" % (pc, code))
            value = _scalar(regs, dst, pc, "neg")
            regs[dst] = (-value) & (MASK64 if is64 else MASK32)
        else:
            if op not in ALU_NAMES:
                raise Unauditable("insn %d: unknown ALU operation in opcode 0x%02x" % (pc, code))
            if off and op not in (ALU_DIV, ALU_MOD):
                raise Unauditable("insn %d: %s with offset %d is not an instruction" % (pc, ALU_NAMES[op], off))
            if code & SRC_X and src == dst and op in (ALU_XOR, ALU_SUB) and not isinstance(regs[dst], tuple):
                # x ^ x and x - x are 0 whatever x holds; constant blinding writes `w0 = 0` as `r0 ^= r0`.
                regs[dst] = 0
                return pc + 1
            operand = _read(regs, src, pc) if code & SRC_X else imm & (MASK64 if is64 else MASK32)
            value = _read(regs, dst, pc)
            if isinstance(value, tuple) or isinstance(operand, tuple):
                if is64 and isinstance(value, tuple) and not isinstance(operand, tuple) and value[0] == "ctx" and op in (ALU_ADD, ALU_SUB):
                    delta = _s64(operand)
                    regs[dst] = ("ctx", value[1] + (delta if op == ALU_ADD else -delta))
                else:
                    raise Unauditable("insn %d: %s on a pointer" % (pc, ALU_NAMES[op]))
            else:
                regs[dst] = _alu(op, is64, value, operand, off, pc)
        return pc + 1
    if cls in (CLS_JMP, CLS_JMP32):
        op = code & 0xF0
        if op == JMP_JA:
            if code & SRC_X:
                raise Unauditable("insn %d: unknown opcode 0x%02x" % (pc, code))
            return _target(prog, pc, (off if cls == CLS_JMP else imm) + 1)
        if op == JMP_EXIT:
            if cls != CLS_JMP or code & SRC_X:
                raise Unauditable("insn %d: unknown opcode 0x%02x" % (pc, code))
            value = _read(regs, 0, pc)
            if isinstance(value, tuple):
                raise Unauditable("insn %d returns a pointer" % pc)
            return _EXIT
        if op == JMP_CALL:
            if cls != CLS_JMP:
                raise Unauditable("insn %d: unknown opcode 0x%02x" % (pc, code))
            kind = {0: "helper", 1: "BPF-to-BPF", 2: "kfunc"}.get(src, "unknown")
            raise Unauditable("insn %d calls a %s function (imm %d)" % (pc, kind, imm))
        a = _read(regs, dst, pc)
        b = _read(regs, src, pc) if code & SRC_X else imm & MASK64
        if isinstance(a, tuple) or isinstance(b, tuple):
            raise Unauditable("insn %d compares a pointer" % pc)
        if cls == CLS_JMP32:
            a &= MASK32
            b &= MASK32
            sa, sb = _s32(a), _s32(b)
        else:
            sa, sb = _s64(a), _s64(b)
        if op == JMP_JEQ:
            taken = a == b
        elif op == JMP_JNE:
            taken = a != b
        elif op == JMP_JGT:
            taken = a > b
        elif op == JMP_JGE:
            taken = a >= b
        elif op == JMP_JLT:
            taken = a < b
        elif op == JMP_JLE:
            taken = a <= b
        elif op == JMP_JSET:
            taken = bool(a & b)
        elif op == JMP_JSGT:
            taken = sa > sb
        elif op == JMP_JSGE:
            taken = sa >= sb
        elif op == JMP_JSLT:
            taken = sa < sb
        elif op == JMP_JSLE:
            taken = sa <= sb
        else:
            raise Unauditable("insn %d: unknown jump opcode 0x%02x" % (pc, code))
        return _target(prog, pc, off + 1) if taken else pc + 1
    if cls == CLS_LDX:
        mode, size = code & 0xE0, LOAD_SIZES[code & 0x18]
        if mode not in (MODE_MEM, MODE_MEMSX):
            raise Unauditable("insn %d: unknown load opcode 0x%02x" % (pc, code))
        if dst == 10:
            raise Unauditable("insn %d writes r10 (read-only frame pointer)" % pc)
        regs[dst] = _load(regs, ctx, src, off, size, mode == MODE_MEMSX, pc)
        return pc + 1
    if cls == CLS_LD:
        if code != 0x18:
            raise Unauditable("insn %d: legacy packet load (opcode 0x%02x)" % (pc, code))
        if src:
            kind = {1: "map fd", 2: "map value", 3: "BTF id", 4: "function", 5: "map index", 6: "map index value"}
            raise Unauditable("insn %d loads a %s (LD_IMM64 pseudo source %d)" % (pc, kind.get(src, "pseudo"), src))
        if pc + 1 >= len(prog) or prog[pc + 1][0] != 0 or prog[pc + 1][1:4] != (0, 0, 0):
            raise Unauditable("insn %d: LD_IMM64 without its second half" % pc)
        if dst == 10:
            raise Unauditable("insn %d writes r10 (read-only frame pointer)" % pc)
        regs[dst] = (imm & MASK32) | (prog[pc + 1][4] & MASK32) << 32
        return pc + 2
    # ST, STX (stores and atomics)
    raise Unauditable("insn %d stores to memory (opcode 0x%02x); only context loads are audited" % (pc, code))


# ---------------------------------------------------------------------------------------------
# Compilation: one closure per instruction.  The common forms (context loads, MOV/AND/RSH..., JEQ/JNE...
# on scalars, JA, EXIT) get a fast closure; anything else, and any fast closure that meets a pointer or
# an unwritten register, goes through ``_step``, which has the complete semantics and the error messages.

_UNSIGNED_CMP = {
    JMP_JGT: lambda a, b: a > b,
    JMP_JGE: lambda a, b: a >= b,
    JMP_JLT: lambda a, b: a < b,
    JMP_JLE: lambda a, b: a <= b,
    JMP_JSET: lambda a, b: bool(a & b),
}
_FAST_ALU = (ALU_ADD, ALU_SUB, ALU_MUL, ALU_OR, ALU_AND, ALU_LSH, ALU_RSH, ALU_XOR)
_OP_CACHE = {}
_OP_CACHE_LIMIT = 65536


def _slow(regs, ctx, prog, pc):
    return _step(prog, regs, ctx, pc)


def _fast(insn):
    """A closure ``op(regs, ctx, prog, pc) -> next pc (or _EXIT)`` for one instruction; it depends on the
    instruction only (never on its position), so identical instructions share it across programs."""
    code, dst, src, off, imm = insn
    cls = code & 7
    if cls == CLS_LDX and code & 0xE0 == MODE_MEM and dst != 10:
        size = LOAD_SIZES[code & 0x18]
        if off < 0 or off + size > CTX_SIZE or off % size or (off >= 4 and size != 4) or size > 4:
            return _slow
        end = off + size

        def load(regs, ctx, prog, pc):
            if regs[src] != CTX_PTR:
                return _step(prog, regs, ctx, pc)
            regs[dst] = int.from_bytes(ctx[off:end], "little")
            return pc + 1

        return load
    if (cls in (CLS_ALU, CLS_ALU64)) and dst != 10 and off == 0:
        is64 = cls == CLS_ALU64
        mask = MASK64 if is64 else MASK32
        op = code & 0xF0
        if op == ALU_MOV and not code & SRC_X:
            value = imm & mask

            def mov_k(regs, ctx, prog, pc):
                regs[dst] = value
                return pc + 1

            return mov_k
        if op == ALU_MOV:

            def mov_x(regs, ctx, prog, pc):
                value = regs[src]
                if not isinstance(value, int):
                    return _step(prog, regs, ctx, pc)
                regs[dst] = value & mask
                return pc + 1

            return mov_x
        if op == ALU_AND and not code & SRC_X:
            operand = imm & mask

            def and_k(regs, ctx, prog, pc):
                value = regs[dst]
                if not isinstance(value, int):
                    return _step(prog, regs, ctx, pc)
                regs[dst] = value & operand
                return pc + 1

            return and_k
        if op == ALU_RSH and not code & SRC_X:
            shift = imm & (63 if is64 else 31)

            def rsh_k(regs, ctx, prog, pc):
                value = regs[dst]
                if not isinstance(value, int):
                    return _step(prog, regs, ctx, pc)
                regs[dst] = (value & mask) >> shift
                return pc + 1

            return rsh_k
        if op in _FAST_ALU and not (code & SRC_X and src == dst and op in (ALU_XOR, ALU_SUB)):
            if code & SRC_X:

                def alu_x(regs, ctx, prog, pc):
                    a, b = regs[dst], regs[src]
                    if not isinstance(a, int) or not isinstance(b, int):
                        return _step(prog, regs, ctx, pc)
                    regs[dst] = _alu(op, is64, a, b, 0, pc)
                    return pc + 1

                return alu_x
            operand = imm & mask

            def alu_k(regs, ctx, prog, pc):
                a = regs[dst]
                if not isinstance(a, int):
                    return _step(prog, regs, ctx, pc)
                regs[dst] = _alu(op, is64, a, operand, 0, pc)
                return pc + 1

            return alu_k
        return _slow
    if cls in (CLS_JMP, CLS_JMP32):
        op = code & 0xF0
        if op == JMP_EXIT and code == 0x95:

            def exit_(regs, ctx, prog, pc):
                if not isinstance(regs[0], int):
                    return _step(prog, regs, ctx, pc)
                return _EXIT

            return exit_
        delta = 1 + (imm if cls == CLS_JMP32 and op == JMP_JA else off)
        if delta <= 0:
            return _slow  # backward jumps: bounds checked there
        if op == JMP_JA and not code & SRC_X:

            def ja(regs, ctx, prog, pc):
                return pc + delta

            return ja
        mask = MASK32 if cls == CLS_JMP32 else MASK64
        if op in (JMP_JEQ, JMP_JNE):
            equal = op == JMP_JEQ
            if code & SRC_X:

                def jeq_x(regs, ctx, prog, pc):
                    a, b = regs[dst], regs[src]
                    if not isinstance(a, int) or not isinstance(b, int):
                        return _step(prog, regs, ctx, pc)
                    return pc + delta if ((a & mask) == (b & mask)) is equal else pc + 1

                return jeq_x
            operand = imm & mask

            def jeq_k(regs, ctx, prog, pc):
                a = regs[dst]
                if not isinstance(a, int):
                    return _step(prog, regs, ctx, pc)
                return pc + delta if ((a & mask) == operand) is equal else pc + 1

            return jeq_k
        compare = _UNSIGNED_CMP.get(op)
        if compare is None:
            return _slow
        if code & SRC_X:

            def jump_x(regs, ctx, prog, pc):
                a, b = regs[dst], regs[src]
                if not isinstance(a, int) or not isinstance(b, int):
                    return _step(prog, regs, ctx, pc)
                return pc + delta if compare(a & mask, b & mask) else pc + 1

            return jump_x
        operand = imm & mask

        def jump_k(regs, ctx, prog, pc):
            a = regs[dst]
            if not isinstance(a, int):
                return _step(prog, regs, ctx, pc)
            return pc + delta if compare(a & mask, operand) else pc + 1

        return jump_k
    return _slow


def _falls_off(regs, ctx, prog, pc):
    raise Unauditable("control falls off the end of the %d-insn program (no exit)" % len(prog))


def _compile(prog):
    """(prepared instructions, one op per instruction + the fall-off sentinel, whether it may loop)."""
    ops = []
    loops = False
    for insn in prog:
        code = insn[0]
        if code & 7 in (CLS_JMP, CLS_JMP32) and code & 0xF0 not in (JMP_CALL, JMP_EXIT):
            loops = loops or 1 + (insn[4] if code & 7 == CLS_JMP32 and code & 0xF0 == JMP_JA else insn[3]) <= 0
        op = _OP_CACHE.get(insn)
        if op is None:
            op = _fast(insn)
            if len(_OP_CACHE) < _OP_CACHE_LIMIT:
                _OP_CACHE[insn] = op
        ops.append(op)
    ops.append(_falls_off)
    return prog, ops, loops


class Program:
    """One device program, prepared once and run for many contexts (verdicts memoised)."""

    def __init__(self, insns, max_steps=MAX_STEPS):
        self.max_steps = max_steps
        self._cache = {}
        try:
            self._prog = _compile(_prepare(insns))
            self.error = None if self._prog[0] else "empty program"
        except Unauditable as stop:
            self._prog = None
            self.error = stop.args[0]

    def run(self, ctx):
        """The verdict for a 12-byte context."""
        verdict = self._cache.get(ctx)
        if verdict is None:
            verdict = self._run(ctx)
            self._cache[ctx] = verdict
        return verdict

    def _run(self, ctx):
        if self.error:
            return Verdict(UNAUDITABLE, self.error)
        if len(ctx) != CTX_SIZE:
            return Verdict(UNAUDITABLE, "context of %d bytes, not %d" % (len(ctx), CTX_SIZE))
        try:
            value, _steps = _execute(self._prog, bytes(ctx), self.max_steps)
        except Unauditable as stop:
            return Verdict(UNAUDITABLE, stop.args[0])
        # The hook allows when the (u32) return value is non-zero.
        return Verdict(ALLOW if value & MASK32 else DENY, "returned %s" % value)

    def decide(self, dev_type, major, minor, access):
        return self.run(make_ctx(dev_type, major, minor, access))


def execute(insns, ctx=bytes(CTX_SIZE), max_steps=MAX_STEPS):
    """r0 at EXIT (an int in [0, 2**64)) and the steps taken; raises ``Unauditable`` with the reason."""
    if len(ctx) != CTX_SIZE:
        raise Unauditable("context of %d bytes, not %d" % (len(ctx), CTX_SIZE))
    prog = _prepare(insns)
    if not prog:
        raise Unauditable("empty program")
    return _execute(_compile(prog), bytes(ctx), max_steps)


def run(insns, ctx, max_steps=MAX_STEPS):
    """The verdict of one program (list of ``(code, regs, off, imm)``) for a 12-byte context."""
    return Program(insns, max_steps).run(ctx)


def combine(verdicts):
    """The effective verdict of a cgroup's effective program list: the kernel runs every program and
    allows only when all return non-zero.  One DENY decides; otherwise any UNAUDITABLE makes the whole
    unauditable; an empty list allows."""
    unauditable = None
    for verdict in verdicts:
        if verdict.decision == DENY:
            return verdict
        if verdict.decision == UNAUDITABLE and unauditable is None:
            unauditable = verdict
    return unauditable or Verdict(ALLOW, "every program allows" if verdicts else "no device program")
