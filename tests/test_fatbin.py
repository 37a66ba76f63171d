"""Cutting a library's CUDA kernels to the architectures kept (benchmarks/fatbin.py), on a synthetic ELF64
with one fat binary of three architectures, laid out as fbgemm-gpu's libraries are."""
import struct

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.fatbin import FATBIN_MAGIC, entries, keep_architectures, main

ENTRY_HEADER = 64


def _fatbin(payloads: dict[int, bytes]) -> bytes:
    body = b""
    for arch, payload in payloads.items():
        header = bytearray(ENTRY_HEADER)
        struct.pack_into("<HHIQ", header, 0, 2, 0x0101, ENTRY_HEADER, len(payload))
        struct.pack_into("<I", header, 28, arch)
        body += bytes(header) + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def _elf(fatbin: bytes, padding: int = 8) -> bytes:
    """An ELF64 header, then the fat binary after `padding` zero bytes, then the section names and the three
    section headers (null, .nv_fatbin, .shstrtab)."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    fat_at = 64
    names_at = fat_at + padding + len(fatbin)
    table_at = names_at + len(names)
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    struct.pack_into("<Q", header, 0x28, table_at)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 2)
    sections = bytes(64)
    sections += struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, fat_at, padding + len(fatbin), 0, 0, 8, 0)
    sections += struct.pack("<IIQQQQIIQQ", 12, 3, 0, 0, names_at, len(names), 0, 0, 1, 0)
    return bytes(header) + bytes(padding) + fatbin + names + sections


@given(st.dictionaries(st.sampled_from([75, 80, 90, 100, 120]), st.binary(min_size=1, max_size=64), min_size=1),
       st.sampled_from([0, 8, 16]))
def test_every_entry_is_found_and_only_other_architectures_are_zeroed(payloads, padding):
    data = bytearray(_elf(_fatbin(payloads), padding))
    before = bytes(data)
    found = entries(data)
    assert [e.arch for e in found] == list(payloads)
    assert all(bytes(data[e.start:e.start + e.size]) == payloads[e.arch] for e in found)
    zeroed = keep_architectures(data, {90})
    assert zeroed == sum(len(p) for arch, p in payloads.items() if arch != 90)
    assert len(data) == len(before)
    for e in found:
        assert bytes(data[e.start:e.start + e.size]) == (payloads[e.arch] if e.arch == 90 else bytes(e.size))
    changed = [i for i in range(len(data)) if data[i] != before[i]]
    assert all(any(e.start <= i < e.start + e.size for e in found if e.arch != 90) for i in changed)


def test_a_library_without_kernels_is_left_alone(tmp_path):
    plain = tmp_path / "plain.so"
    names = b"\0.shstrtab\0"
    header = bytearray(64)
    struct.pack_into("<Q", header, 0x28, 64 + len(names))
    struct.pack_into("<HHH", header, 0x3A, 64, 2, 1)
    plain.write_bytes(bytes(header) + names + bytes(64) + struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names),
                                                                        0, 0, 1, 0))
    before = plain.read_bytes()
    assert entries(before) == []
    kernels = tmp_path / "kernels.so"
    kernels.write_bytes(_elf(_fatbin({80: b"\x01" * 32, 90: b"\x02" * 32})))
    assert main([str(tmp_path), "--keep", "90"]) == 0
    assert plain.read_bytes() == before
    assert b"\x01" * 32 not in kernels.read_bytes() and b"\x02" * 32 in kernels.read_bytes()
