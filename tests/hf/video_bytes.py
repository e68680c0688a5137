"""Video files changed by their bytes, as bit rot, a partial copy or a phone leaves them: where
each packet of a file's first track lies (MP4: its sample tables; Matroska: its blocks), a
packet overwritten, and an MP4 track's display matrix set to a rotation. No decoder is
involved: the tests judge the results with torchcodec and mmsp."""
import random
import struct


def mp4_packets(data):
    """(offset, size) of each sample of an MP4's first track, from its stsz, stco and stsc boxes."""
    def boxes(start, end):
        while start + 8 <= end:
            size, kind = struct.unpack(">I4s", data[start:start + 8])
            head = 8
            if size == 1:
                size, head = struct.unpack(">Q", data[start + 8:start + 16])[0], 16
            yield kind.decode("latin-1"), start + head, start + size
            start += size

    def find(path, start=0, end=len(data)):
        for kind, s, e in boxes(start, end):
            if kind == path[0]:
                return (s, e) if len(path) == 1 else find(path[1:], s, e)
        raise ValueError(f"no {path[0]} box")

    tables = {kind: s for kind, s, _ in boxes(*find(["moov", "trak", "mdia", "minf", "stbl"]))}
    fixed, count = struct.unpack(">II", data[tables["stsz"] + 4:tables["stsz"] + 12])
    sizes = [fixed] * count if fixed else struct.unpack(f">{count}I", data[tables["stsz"] + 12:][:4 * count])
    n = struct.unpack(">I", data[tables["stco"] + 4:tables["stco"] + 8])[0]
    chunks = struct.unpack(f">{n}I", data[tables["stco"] + 8:][:4 * n])
    n = struct.unpack(">I", data[tables["stsc"] + 4:tables["stsc"] + 8])[0]
    runs = [struct.unpack(">II", data[tables["stsc"] + 8 + 12 * i:][:8]) for i in range(n)]  # (first chunk, samples)
    out = []
    for chunk, offset in enumerate(chunks, 1):
        for _ in range([per for first, per in runs if first <= chunk][-1]):
            out.append((offset, sizes[len(out)]))
            offset += out[-1][1]
    return out


def mkv_packets(data):
    """(offset, size) of each frame in a Matroska file's SimpleBlocks and Blocks (no lacing)."""
    def vint(p, keep_marker):
        length = 9 - data[p].bit_length()
        value = data[p] if keep_marker else data[p] & (0xFF >> length)
        for b in data[p + 1:p + length]:
            value = value << 8 | b
        return value, p + length

    out = []

    def walk(p, end):
        while p < end:
            ident, q = vint(p, True)
            size, q = vint(q, False)
            stop = min(end, q + size)
            if ident in (0x18538067, 0x1F43B675, 0xA0):  # Segment, Cluster, BlockGroup: inside
                walk(q, stop)
            elif ident in (0xA3, 0xA1):  # SimpleBlock, Block: track, timecode (2), flags (1), frame
                _, r = vint(q, False)
                out.append((r + 3, stop - r - 3))
            p = stop

    walk(0, len(data))
    return out


def overwrite_packet(data, packets, k, fill):
    """`data` with packet k's bytes replaced: fill "zero" (a hole a copy left), "noise" (seeded), or
    "tail": noise over its second half only (its NAL headers whole: the decoder takes the packet
    and conceals what it cannot decode)."""
    offset, size = packets[k]
    if fill == "tail":
        offset, size = offset + size // 2, size - size // 2
    new = bytes(size) if fill == "zero" else random.Random(k).randbytes(size)
    return data[:offset] + new + data[offset + size:]


def rotated_mp4(data, degrees):
    """`data` with its first track's tkhd matrix a rotation by 90 or -90 degrees (FFmpeg's reading:
    counter-clockwise), as a phone writes a video held upright."""
    at = data.index(b"tkhd") + 4
    matrix = at + 4 + (32 if data[at] == 1 else 20) + 16  # version/flags, times and ids, reserved, layer...
    b, c = {90: (-0x10000, 0x10000), -90: (0x10000, -0x10000)}[degrees]
    return data[:matrix] + struct.pack(">9i", 0, b, 0, c, 0, 0, 0, 0, 0x40000000) + data[matrix + 36:]
