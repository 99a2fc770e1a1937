"""Checks on cached object code before MCJIT loads it: a damaged or foreign file is a miss,
never a crash. LLVM's loader trusts its input (garbage with a valid checksum segfaulted every
later run), so the ELF structure is checked here first, in Python:

- the header: ELF magic, 64-bit, little-endian, a relocatable object for this machine;
- every section header and section lies inside the file; links and string offsets in range;
- the symbol table defines `symbol` in an executable section;
- every relocation names a symbol of the table and a place inside its target section.

The entry also records what produced it (`host_key()`: triple, CPU, features, llvmlite) and
the object's sha256; an entry from another host or for another symbol is not loaded. These
checks stop damage and mix-ups; what stops an attacker is the private cache directory
(dlvm_eq/cache.py), since well-formed object code can do anything it likes.

    problem = elf_problem(obj, "dq_k0_add_3f2a")     # None: fit to load
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys

ET_REL, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_REL, SHT_NOBITS = 1, 2, 3, 4, 9, 8
SHF_EXECINSTR = 0x4
SHN_LORESERVE = 0xFF00
# e_machine for the triples LLVM gives us; other architectures skip the machine check
_MACHINES = {
    "x86_64": 62,
    "aarch64": 183,
    "arm64": 183,
    "powerpc64le": 21,
    "riscv64": 243,
    "s390x": 22,
}


def pack_entry(symbol: str, host: str, obj: bytes) -> bytes:
    """A cache entry: a JSON header line (symbol, host, sha256 of the object), then the object."""
    head = json.dumps({"symbol": symbol, "host": host, "sha256": hashlib.sha256(obj).hexdigest()})
    return head.encode() + b"\n" + obj


def unpack_entry(data: bytes, host: str, symbol: str | None = None) -> tuple[str, bytes] | None:
    """(symbol, object) of an entry made by `pack_entry` on this host, fit to load; else None."""
    head, sep, obj = data.partition(b"\n")
    if not sep:
        return None
    try:
        meta = json.loads(head)
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("host") != host:
        return None
    sym = meta.get("symbol")
    if not isinstance(sym, str) or (symbol is not None and sym != symbol):
        return None
    if meta.get("sha256") != hashlib.sha256(obj).hexdigest():
        return None
    triple = host.split("|", 1)[0]
    if "linux" not in triple and not obj.startswith(b"\x7fELF"):
        return sym, obj  # Mach-O and COFF hosts: only the header line is checked
    return (sym, obj) if elf_problem(obj, sym, triple.split("-", 1)[0]) is None else None


def elf_problem(obj: bytes, symbol: str, arch: str | None = None) -> str | None:
    """Why `obj` is not a 64-bit little-endian ELF relocatable object defining `symbol` in
    executable code (for `arch`, e.g. 'x86_64'), or None."""
    try:
        return _check(obj, symbol, arch)
    except struct.error:
        return "truncated"


def _check(obj: bytes, symbol: str, arch: str | None) -> str | None:
    if len(obj) < 64 or obj[:4] != b"\x7fELF":
        return "not an ELF file"
    if obj[4] != 2 or obj[5] != 1 or sys.byteorder != "little":
        return "not a 64-bit little-endian ELF file"
    e_type, e_machine = struct.unpack_from("<HH", obj, 16)
    if e_type != ET_REL:
        return "not a relocatable object"
    want = _MACHINES.get(arch or "")
    if want is not None and e_machine != want:
        return f"built for machine {e_machine}, not {arch}"
    (e_shoff,) = struct.unpack_from("<Q", obj, 40)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", obj, 58)
    if (
        e_shentsize != 64
        or e_shnum == 0
        or e_shstrndx >= e_shnum
        or e_shoff + 64 * e_shnum > len(obj)
    ):
        return "section headers out of range"
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, e_shoff + 64 * i) for i in range(e_shnum)]
    for name, kind, flags, addr, off, size, link, info, align, entsize in sections:
        if kind != SHT_NOBITS and off + size > len(obj):
            return "a section lies outside the file"
        if link >= e_shnum:
            return "a section links to no section"
    symtabs = [s for s in sections if s[1] == SHT_SYMTAB]
    if len(symtabs) != 1:
        return "no symbol table"
    _, _, _, _, off, size, link, _, _, entsize = symtabs[0]
    if entsize != 24 or size % 24 or sections[link][1] != SHT_STRTAB:
        return "malformed symbol table"
    strtab = obj[sections[link][4] : sections[link][4] + sections[link][5]]
    n_symbols = size // 24
    defined = False
    for i in range(n_symbols):
        st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from(
            "<IBBHQQ", obj, off + 24 * i
        )
        if st_name >= max(len(strtab), 1) and st_name:
            return "a symbol name lies outside the string table"
        if st_shndx and st_shndx < SHN_LORESERVE and st_shndx >= e_shnum:
            return "a symbol in no section"
        end = strtab.find(b"\0", st_name)
        if strtab[st_name : end if end >= 0 else None] == symbol.encode():
            defined = (
                0 < st_shndx < e_shnum
                and sections[st_shndx][2] & SHF_EXECINSTR
                and st_value + st_size <= sections[st_shndx][5]
            )
    if not defined:
        return f"{symbol} is not defined in executable code"
    for _, kind, _, _, off, size, link, info, _, entsize in sections:
        if kind not in (SHT_RELA, SHT_REL):
            continue
        step = 24 if kind == SHT_RELA else 16
        if entsize != step or size % step or info >= e_shnum or sections[link][1] != SHT_SYMTAB:
            return "malformed relocation section"
        target_size = sections[info][5]
        for j in range(size // step):
            r_offset, r_info = struct.unpack_from("<QQ", obj, off + step * j)
            if r_info >> 32 >= n_symbols or r_offset >= target_size:
                return "a relocation out of range"
    return None
