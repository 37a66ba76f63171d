"""Cuts the CUDA kernels of a shared library down to the GPU architectures kept, for carrying fbgemm-gpu to
a GPU machine that takes 64 MiB a call (its 465 MB wheel holds sm_80, sm_90 and sm_100 kernels).

The kernels of other architectures are overwritten with zeros in place, headers left as they are: the file
keeps its size and layout, the CUDA runtime still picks its own architecture's entry, and the zeros compress
to nothing. `python -m benchmarks.fatbin DIR --keep 90` does every .so under DIR."""
from __future__ import annotations

import argparse
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50


@dataclass(frozen=True)
class Entry:
    kind: int    # 1: PTX, 2: a compiled kernel image (cubin)
    arch: int    # e.g. 90 for sm_90
    start: int   # of the payload, in the file
    size: int


def section(data: bytes, name: str) -> tuple[int, int]:
    """(offset, size) of an ELF64 section by name."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    entsize, count, names = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple:
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize)

    strings = header(names)[4]
    for i in range(count):
        h = header(i)
        start = strings + h[0]
        if data[start:data.index(b"\0", start)].decode() == name:
            return h[4], h[5]
    raise KeyError(f"no section {name}")


def entries(data: bytes) -> list[Entry]:
    """Every entry of every fat binary in the .nv_fatbin section (an empty list where there is none)."""
    try:
        offset, size = section(data, ".nv_fatbin")
    except KeyError:
        return []
    out, position, end = [], offset, offset + size
    while position + 16 <= end:
        magic, _, header_size, body_size = struct.unpack_from("<IHHQ", data, position)
        if magic != FATBIN_MAGIC:  # fat binaries are 8-byte aligned; padding lies between them
            position += 8
            continue
        entry, body_end = position + header_size, position + header_size + body_size
        while entry < body_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            out.append(Entry(kind, arch, entry + entry_header, payload))
            entry += entry_header + payload
        position = body_end
    return out


def keep_architectures(data: bytearray, keep: set[int]) -> int:
    """Zeroes, in place, the payloads of the entries for architectures outside `keep`; the bytes zeroed."""
    zeroed = 0
    for e in entries(data):
        if e.arch not in keep:
            data[e.start:e.start + e.size] = bytes(e.size)
            zeroed += e.size
    return zeroed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fatbin", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="an unpacked wheel (every .so under it is cut)")
    parser.add_argument("--keep", type=int, action="append", required=True, help="an architecture to keep (90)")
    args = parser.parse_args(argv)
    for path in sorted(args.folder.rglob("*.so")):
        data = bytearray(path.read_bytes())
        zeroed = keep_architectures(data, set(args.keep))
        if zeroed:
            path.write_bytes(data)
            print(f"{path}: {zeroed / 2**20:.0f} MiB of other architectures' kernels zeroed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
