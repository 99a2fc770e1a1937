"""Loading a kernel's object code without LLVM: a warm process runs kernels from the disk cache
without importing llvmlite.binding (about 50 ms of imports and a 170 MB library mapped).

The objects are what `jit.compile_object` emits on x86-64 Linux: ELF relocatable files built
with LLVM's JIT code model, whose relocations are absolute (R_X86_64_64) or PC-relative 64-bit
(R_X86_64_PC64), calls through registers, and an external `memset`. Their allocated sections
are copied into fresh pages, relocated, and the read-only part made executable (never writable
and executable at once). Anything else (another machine, a relocation kind not listed, a symbol
the process does not define) raises `Unsupported`, and the caller loads the object with MCJIT.

    >>> address = load(obj, "dq_k0_add_3f2a")        # the function's entry point

Loaded code stays mapped for the life of the process, as MCJIT's does. Callers check an
entry read from disk with `object_check.unpack_entry` first (the ELF structure, the host).
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import struct
import sys
import threading

SHT_PROGBITS, SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 1, 2, 4, 8, 9
SHT_X86_64_UNWIND = 0x70000001  # .eh_frame: loaded as data, never registered
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHN_UNDEF, SHN_LORESERVE, SHN_ABS = 0, 0xFF00, 0xFFF1
R_X86_64_64, R_X86_64_PC32, R_X86_64_PLT32, R_X86_64_PC64 = 1, 2, 4, 24
PAGE = mmap.PAGESIZE

_lock = threading.Lock()
_MAPPED: list[mmap.mmap] = []  # every loaded region, kept for the life of the process
_libc: ctypes.CDLL | None = None


class Unsupported(Exception):
    """This object cannot be loaded here without LLVM (the caller falls back to MCJIT)."""


def supported() -> bool:
    return sys.platform.startswith("linux") and platform.machine() == "x86_64"


def _process_symbols() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols (libc's memset)
    return _libc


def _external(name: str) -> int:
    try:
        fn = _process_symbols()[name]  # dlsym; item access also finds names with underscores
    except AttributeError:
        raise Unsupported(f"external symbol {name} not in the process") from None
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def _sections(obj: bytes) -> list[tuple]:
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        raise Unsupported("not a 64-bit little-endian ELF file")
    e_type, e_machine = struct.unpack_from("<HH", obj, 16)
    if e_type != 1 or e_machine != 62:
        raise Unsupported("not an x86-64 relocatable object")
    (e_shoff,) = struct.unpack_from("<Q", obj, 40)
    _, e_shnum, _ = struct.unpack_from("<HHH", obj, 58)
    return [struct.unpack_from("<IIQQQQIIQQ", obj, e_shoff + 64 * i) for i in range(e_shnum)]


def _layout(sections: list[tuple]) -> tuple[dict[int, int], int, int]:
    """({section index: offset in the region}, size of the read-only part, total size): the
    read-only and executable sections first, then from a page boundary the writable ones."""
    where: dict[int, int] = {}
    end = readonly = 0
    for writable in (False, True):
        if writable:
            end = -(-end // PAGE) * PAGE
            readonly = end
        for i, (_, kind, flags, _, _, size, _, _, align, _) in enumerate(sections):
            if not flags & SHF_ALLOC or bool(flags & SHF_WRITE) != writable:
                continue
            if kind not in (SHT_PROGBITS, SHT_NOBITS, SHT_X86_64_UNWIND):
                raise Unsupported(f"allocated section of type {kind}")
            align = max(int(align), 1)
            end = -(-end // align) * align
            where[i] = end
            end += size
    return where, readonly, max(-(-end // PAGE) * PAGE, PAGE)


def load(obj: bytes, symbol: str) -> int:
    """Copy `obj`'s allocated sections into fresh pages, relocate them, make the code
    executable, and return the address of `symbol` (a function it defines)."""
    if not supported():
        raise Unsupported("only x86-64 Linux objects are loaded without LLVM")
    try:
        return _load(obj, symbol)
    except (struct.error, IndexError, ValueError) as e:  # truncated or inconsistent tables
        raise Unsupported(f"malformed object: {e}") from None


def _load(obj: bytes, symbol: str) -> int:
    sections = _sections(obj)
    where, readonly, size = _layout(sections)
    # private: a forked child gets its own copy of writable state (the pool's), as with MCJIT
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    region = mmap.mmap(-1, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    for i, at in where.items():
        _, kind, _, _, off, sec_size, *_ = sections[i]
        if kind != SHT_NOBITS:
            region[at : at + sec_size] = obj[off : off + sec_size]
    symtab = [s for s in sections if s[1] == SHT_SYMTAB]
    if len(symtab) != 1:
        raise Unsupported("no symbol table")
    _, _, _, _, sym_off, sym_size, str_link, *_ = symtab[0]
    str_off = sections[str_link][4]
    addresses, entry = [], None
    for k in range(sym_size // 24):
        st_name, _, _, st_shndx, st_value, _ = struct.unpack_from("<IBBHQQ", obj, sym_off + 24 * k)
        end = obj.index(b"\0", str_off + st_name)
        name = obj[str_off + st_name : end].decode("ascii", "replace")
        if st_shndx == SHN_UNDEF:
            addresses.append(_external(name) if name else 0)
        elif st_shndx == SHN_ABS:
            addresses.append(st_value)
        elif st_shndx < SHN_LORESERVE and st_shndx in where:
            addresses.append(base + where[st_shndx] + st_value)
            if name == symbol and sections[st_shndx][2] & SHF_EXECINSTR:
                entry = addresses[-1]
        elif st_shndx < SHN_LORESERVE:
            addresses.append(None)  # a symbol of a section not loaded (debug information)
        else:
            raise Unsupported(f"symbol {name} in special section {st_shndx:#x}")
    if entry is None:
        raise Unsupported(f"{symbol} is not defined in executable code")
    for _, kind, _, _, off, rel_size, _, target, _, _ in sections:
        if kind == SHT_REL:
            raise Unsupported("REL relocations")
        if kind != SHT_RELA or target not in where:
            continue
        _relocate(region, obj, off, rel_size, where[target], sections[target][5], addresses, base)
    _protect(base, readonly)
    with _lock:
        _MAPPED.append(region)
    return entry


def _relocate(region, obj, off, rel_size, at, target_size, addresses, base) -> None:
    for j in range(rel_size // 24):
        r_offset, r_info, r_addend = struct.unpack_from("<QQq", obj, off + 24 * j)
        kind, sym = r_info & 0xFFFFFFFF, r_info >> 32
        s = addresses[sym] if sym < len(addresses) else None
        if s is None:
            raise Unsupported("a relocation against a section not loaded")
        place = base + at + r_offset
        if kind == R_X86_64_64:
            value, fmt = (s + r_addend) & (2**64 - 1), "<Q"
        elif kind == R_X86_64_PC64:
            value, fmt = (s + r_addend - place) & (2**64 - 1), "<Q"
        elif kind in (R_X86_64_PC32, R_X86_64_PLT32):
            value, fmt = s + r_addend - place, "<i"
            if not -(2**31) <= value < 2**31:
                raise Unsupported("a 32-bit PC-relative relocation out of reach")
        else:
            raise Unsupported(f"relocation type {kind}")
        if r_offset + struct.calcsize(fmt) > target_size:
            raise Unsupported("a relocation outside its section")
        struct.pack_into(fmt, region, at + r_offset, value)


def _protect(base: int, readonly: int) -> None:
    """The code and constants: read and execute, no longer writable (W^X)."""
    if not readonly:
        return
    libc = _process_symbols()
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if libc.mprotect(base, readonly, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        raise Unsupported(f"mprotect: errno {ctypes.get_errno()}")
