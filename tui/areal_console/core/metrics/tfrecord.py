"""Records of a tensorboard event file (TFRecord framing), read with bounds.

Each record is `uint64 length, uint32 masked CRC-32C of the length, data, uint32 masked
CRC-32C of the data`. The file is the job's (another user's, possibly) and is read as
hostile: a length past `MAX_RECORD` is an error for this file (tensorboard's own loader
allocates whatever the header says: 2^40 bytes is a MemoryError), one call reads a
bounded number of bytes, a header that fails its
CRC is an error (nothing after it can be framed), a record whose data fails its CRC is
skipped and said (tensorboard's loader stops there without a word, truncating the run).
A record not yet complete at the end of the file is read again at the next poll.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

from areal_console.core.common.guarded_read import open_guarded

# AReaL writes scalars only (`add_scalar`): a record is ~100 bytes. Past this it is not
# AReaL's event; and the CRC (pure Python, as in tensorboard's loader) costs 0.3 s a MB,
# so one call reads at most POLL_BYTES and the next goes on.
MAX_RECORD = 1 << 20
POLL_BYTES = 16 << 20
HEADER = struct.Struct("<QI")
FOOTER = struct.Struct("<I")


class RecordFileError(ValueError):
    """The file cannot be read on from here (an impossible length, a corrupt header)."""


class RecordFile:
    """One event file, followed: each `records()` call yields what was appended."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0
        self.unread = 0  # bytes left when the last call stopped at its budget
        self.skipped: list[str] = []  # records that failed their CRC, one line each

    def records(self, max_bytes: int = POLL_BYTES) -> Iterator[bytes]:
        """The complete records from where the last call stopped (about `max_bytes`)."""
        # tensorboard's CRC-32C (its loader's own): imported here, as it costs 0.5 s.
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

        # A job's event file: no link followed, a FIFO in its place never blocks.
        with os.fdopen(open_guarded(self.path), "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < self.offset:  # truncated or replaced: from the start again
                self.offset = 0
            fh.seek(self.offset)
            stop = self.offset + max_bytes
            self.unread = 0
            while True:
                if self.offset >= stop:
                    self.unread = size - self.offset
                    return
                head = fh.read(HEADER.size)
                if len(head) < HEADER.size:
                    return
                length, crc = HEADER.unpack(head)
                if masked_crc32c(head[:8]) != crc:
                    raise RecordFileError(
                        f"{self.path}: corrupt record header at byte {self.offset} "
                        "(its CRC does not match): not read past it"
                    )
                if length > MAX_RECORD:
                    raise RecordFileError(
                        f"{self.path}: a record of {length} bytes at byte {self.offset} "
                        f"(more than {MAX_RECORD >> 20} MB): not an event file of scalars"
                    )
                if self.offset + HEADER.size + length + FOOTER.size > size:
                    return  # still being written
                data = fh.read(length)
                (data_crc,) = FOOTER.unpack(fh.read(FOOTER.size))
                at = self.offset
                self.offset += HEADER.size + length + FOOTER.size
                if masked_crc32c(data) != data_crc:
                    self.skipped.append(
                        f"{self.path}: the record at byte {at} fails its CRC check "
                        "(corrupt data): skipped"
                    )
                    continue
                yield data
