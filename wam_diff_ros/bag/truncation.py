"""Where a truncated MCAP file ends: the messages still complete in it, per topic, and the topic of the message the
end cuts through. rosbags refuses such a file as a whole (its footer is gone); this walks its records from the
start (MCAP format: https://mcap.dev/spec; records are opcode u8, length u64, body) so the error can name the
topic and how much of it is left."""
from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path
from typing import Optional

MAGIC = b"\x89MCAP0\r\n"
OP_CHANNEL, OP_MESSAGE, OP_CHUNK = 0x04, 0x05, 0x06


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<I", buf, pos)
    return buf[pos + 4:pos + 4 + n].decode("utf-8", "replace"), pos + 4 + n


def _partial_chunk_records(body: bytes) -> bytes:
    """The (possibly cut) records of a chunk body: uncompressed as they stand, zstd or lz4 decompressed as far as
    the bytes go."""
    pos = 8 + 8 + 8 + 4  # start time, end time, uncompressed size, crc
    compression, pos = _string(body, pos)
    records = body[pos + 8:]  # after the records' length
    try:
        if compression == "zstd":
            try:
                from compression import zstd  # Python >= 3.14
            except ImportError:
                from backports import zstd
            return zstd.ZstdDecompressor().decompress(records)
        if compression == "lz4":
            from lz4.frame import LZ4FrameDecompressor

            return LZ4FrameDecompressor().decompress(records)
    except Exception:  # noqa: BLE001 - a cut compressed block: nothing more can be read from it
        return b""
    return records


class _Walk:
    def __init__(self):
        self.topics: dict[int, str] = {}
        self.complete: Counter = Counter()
        self.cut_topic: Optional[str] = None

    def records(self, buf: bytes, pos: int = 0) -> None:
        """Walk `buf`'s records from `pos`; a record that runs past the end is the cut one."""
        while pos + 9 <= len(buf):
            op, size = buf[pos], struct.unpack_from("<Q", buf, pos + 1)[0]
            body = buf[pos + 9:pos + 9 + size]
            complete = len(body) == size
            if op == OP_CHANNEL and complete:
                (cid,) = struct.unpack_from("<H", body, 0)
                self.topics[cid] = _string(body, 4)[0]
            elif op == OP_MESSAGE and len(body) >= 2:
                topic = self.topics.get(struct.unpack_from("<H", body, 0)[0], "?")
                if complete:
                    self.complete[topic] += 1
                else:
                    self.cut_topic = topic
            elif op == OP_CHUNK:
                if len(body) >= 32:
                    self.records(_partial_chunk_records(body))
            if not complete:
                return
            pos += 9 + size


def mcap_prefix(path) -> tuple[dict[str, int], Optional[str]]:
    """(complete messages per topic, topic of the message the file's end cuts, or None) of an MCAP file."""
    data = Path(path).read_bytes()
    walk = _Walk()
    if data.startswith(MAGIC):
        walk.records(data, len(MAGIC))
    return dict(walk.complete), walk.cut_topic
