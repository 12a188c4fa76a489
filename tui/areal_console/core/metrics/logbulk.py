"""Reading many of AReaL's step records at once, when they repeat one record's shape.

From one step to the next, AReaL's log record (the progress line, the `Stats (1/1):` line,
the empty message line and the table, areal/utils/stats_logger.py:135-162) changes only in
its timestamps, the progress line's numbers and the table's value cells, as long as the
table keeps its column widths and the numbers their digit counts. Such records all have
the same length, so a run of them is a 2-D matrix over the log buffer (no copy): rows are
records, and a row is read as bytes or as the 8-byte words that start at each of its bytes.
A record is taken only if every byte it should repeat (keys, bars, ANSI codes, `[role]`
prefixes, the borders' ends, newlines) equals the template record's, compared a word at a
time, and every digit position holds a digit; the first record that differs ends the run,
and the searching parser goes on from there. Values in AReaL's `%.4e` shape are decoded two
words a cell with integer arithmetic, the timestamps and step numbers from their digit
columns; a value cell holding anything else (nan, inf, a three-digit exponent) goes through
`float`.
"""

from __future__ import annotations

import calendar
import math
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

BAR = "│".encode()
# A count or step has at most 18 digits (inside int64): a line with a longer number is
# not AReaL's progress line (int() of 5,000 digits raises, numpy's int64 overflows).
COUNT = rb"(\d{1,18})"
PROGRESS_LINE = (
    rb"Epoch " + COUNT + rb"/" + COUNT + rb" Step " + COUNT + rb"/" + COUNT
    + rb" Train step " + COUNT + rb"/" + COUNT + rb" done\."
)  # fmt: skip
PROGRESS = re.compile(PROGRESS_LINE)
STATS_1_OF_1 = b"Stats (1/1):"
TIMESTAMP = re.compile(rb"\d{8}-\d\d:\d\d:\d\d\.\d{3} ")
HEADS = re.compile(
    rb"Epoch \d+/\d+ Step \d+/\d+ Train step \d+/\d+ done\.|Stats \(|Training completes!"
)
# Of a border line only its ends are compared: its middle carries no data, and comparing
# it would double the bytes looked at.
BORDER_ENDS = 12

Index = npt.NDArray[np.intp]
Words = npt.NDArray[np.uint64]
Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
WORD = np.dtype("<u8")  # 8 bytes, the first in the lowest bits


@dataclass(frozen=True)
class RecordTemplate:
    """One step's record, from the end of the previous table to the end of its own."""

    size: int
    names: tuple[str, ...]  # the metrics, in the table's row-major order
    last: bytes  # the record's last bytes (the bottom border's end): a cheap first check
    full_at: Index  # words whose 8 bytes every record repeats ...
    full: Words  # ... and their values
    part_at: Index  # words only some of whose bytes every record repeats ...
    part_mask: Words  # ... those bytes (0xff each) ...
    part: Words  # ... and their values
    digits_at: Index  # offsets that hold a digit in every record; first those of ...
    fields: npt.NDArray[np.int64]  # ... (digits, 7): the progress line's timestamp
    # (YYYYmmdd, HH, MM, SS, mmm) and `Train step N/T`'s N and T, each digit's weight
    cells: Index  # (values, 2): each value cell's span (padding included), row-major
    wide: Index  # the value cells wide enough to hold a `%.4e` number ...
    number_at: Index  # ... and where its last NUMBER bytes start
    narrow: tuple[int, ...]  # the others (a column of nan only), read with `float`

    @property
    def values(self) -> int:
        return len(self.cells)


@dataclass
class RecordRun:
    """Records read in bulk: AReaL's 1-based train step numbers, times, values row-major."""

    train_steps: npt.NDArray[np.int64]
    total: int  # the last record's T
    seconds: npt.NDArray[np.float64]  # UTC-naive seconds since the epoch, before the zone
    values: memoryview  # doubles, row after row


# A value as AReaL prints it (`.4e`, areal/utils/printing.py:6) fills the last 12 bytes of its
# cell: sign or space, d.dddde±dd, the cell's padding space.
NUMBER = 12
MINUS, PLUS, SPACE, DOT, E = b"-+ .e"
POW10 = np.array([float(10**i) for i in range(23)])  # exact doubles


def record_template(record: bytes) -> RecordTemplate | None:
    """The template of `record` (one progress line, one `Stats (1/1):`, one table), or None
    if it is not shaped like that."""
    heads = list(HEADS.finditer(record))
    if len(heads) != 2 or not record.startswith(b"Epoch", heads[0].start()):
        return None
    if not record.startswith(STATS_1_OF_1, heads[1].start()):
        return None
    progress = PROGRESS.match(record, heads[0].start())
    line = record.rfind(b"\n", 0, heads[0].start()) + 1
    stamp = TIMESTAMP.search(record, line, heads[0].start())
    table = record.find("╒".encode(), heads[1].end())
    if progress is None or stamp is None or table < 0 or not record.endswith(b"\n"):
        return None
    variable = np.zeros(len(record), dtype=bool)
    digits: list[int] = []
    for m in TIMESTAMP.finditer(record, 0, record.rfind(b"\n", 0, table)):
        at = [i for i in range(m.start(), m.end() - 1) if record[i] in b"0123456789"]
        digits += at
    for group in range(1, 7):
        digits += range(progress.start(group), progress.end(group))
    stamp_digits = [i for i in range(stamp.start(), stamp.end() - 1) if record[i] in b"0123456789"]
    step_digits = list(range(progress.start(5), progress.end(5)))
    total_digits = list(range(progress.start(6), progress.end(6)))
    field_digits = stamp_digits + step_digits + total_digits
    variable[digits] = True
    found = value_cells(record, record.rfind(b"\n", 0, table) + 1)
    if found is None:
        return None
    cells, names = found
    wide = np.flatnonzero(cells[:, 1] - cells[:, 0] >= NUMBER)
    number_at = cells[wide, 1] - NUMBER
    for a, b in cells[cells[:, 1] - cells[:, 0] < NUMBER].tolist():
        variable[a:b] = True
    variable[(number_at[:, None] + np.arange(NUMBER)).ravel()] = True
    same = ~variable
    skip_border_middles(record, record.rfind(b"\n", 0, table) + 1, same)
    full_at, part_at, part_mask = word_cover(same)
    words = word_matrix(record, 0, 1, len(record))[0]
    return RecordTemplate(
        size=len(record),
        names=names,
        last=record[-BORDER_ENDS:],
        full_at=full_at,
        full=words[full_at],
        part_at=part_at,
        part_mask=part_mask,
        part=words[part_at] & part_mask,
        digits_at=np.array(field_digits + sorted(set(digits) - set(field_digits)), dtype=np.intp),
        fields=field_weights([8, 2, 2, 2, 3, len(step_digits), len(total_digits)]),
        cells=cells,
        wide=wide,
        number_at=number_at,
        narrow=tuple(np.setdiff1d(np.arange(len(cells)), wide).tolist()),
    )


def word_cover(same: npt.NDArray[np.bool_]) -> tuple[Index, Index, Words]:
    """Words (by their first byte) that cover the True bytes of `same`: each stretch of 8
    or more by whole words (the last one overlapping), shorter ones by a word and a mask of
    its bytes to compare. Returns the whole words, the partial ones and their masks."""
    size = len(same)
    edges = np.flatnonzero(np.diff(np.concatenate([[False], same, [False]]).astype(np.int8)))
    full: list[int] = []
    part: list[int] = []
    covered = 0
    for a, b in edges.reshape(-1, 2).tolist():
        a = max(a, covered)
        if b - a >= 8:
            full += [*range(a, b - 8, 8), b - 8]
        elif a < b:
            part.append(min(a, size - 8))
            b = part[-1] + 8
        covered = b
    bytes_at = np.array(part, dtype=np.intp)[:, None] + np.arange(8)
    masks = (same[bytes_at].astype(np.uint64) * 0xFF) << (8 * np.arange(8, dtype=np.uint64))
    return np.array(full, dtype=np.intp), bytes_at[:, 0], np.bitwise_or.reduce(masks, axis=1)


def word_matrix(data: bytes, start: int, count: int, size: int) -> Words:
    """(count, size - 7): the 8-byte word at each byte of `count` records of `size` bytes
    from `start`, little-endian, over `data` itself (no copy)."""
    shape = (count, size - 7)
    return np.ndarray(shape, dtype=WORD, buffer=data, offset=start, strides=(size, 1))


def value_cells(record: bytes, start: int) -> tuple[Index, tuple[str, ...]] | None:
    """The table from `start`: its value cells' spans (start, end; padding included) and
    its keys, row-major, blank pairs left out. None unless every row is `│ key │ value │ ...`
    with as many bars as the others, and the keys are distinct."""
    spans: list[tuple[int, int]] = []
    names: list[str] = []
    lines = record[start:].split(b"\n")[:-1]
    widths = set()
    at = start
    for i, line in enumerate(lines):
        if i % 2 == 1:
            bars = bar_offsets(line)
            widths.add(len(bars))
            for left, middle, right in zip(bars[0:-1:2], bars[1::2], bars[2::2], strict=False):
                key = line[left + 3 : middle].strip()
                if key:
                    spans.append((at + middle + 3, at + right))
                    names.append(key.decode(errors="replace"))
        at += len(line) + 1
    if len(widths) != 1 or min(widths) < 3 or min(widths) % 2 == 0 or not names:
        return None
    if len(set(names)) != len(names):
        return None
    return np.array(spans, dtype=np.intp), tuple(names)


def bar_offsets(line: bytes) -> list[int]:
    found = []
    at = line.find(BAR)
    while at >= 0:
        found.append(at)
        at = line.find(BAR, at + 3)
    return found


def skip_border_middles(record: bytes, start: int, same: npt.NDArray[np.bool_]) -> None:
    """Compare only the ends of the table's border and separator lines."""
    at = start
    for i, line in enumerate(record[start:].split(b"\n")[:-1]):
        if i % 2 == 0 and len(line) > 2 * BORDER_ENDS:
            same[at + BORDER_ENDS : at + len(line) - BORDER_ENDS] = False
        at += len(line) + 1


def fits(t: RecordTemplate, record: bytes) -> bool:
    """Whether `record` repeats the template's record (same length, same fixed bytes)."""
    if len(record) != t.size:
        return False
    return bool(repeats(word_matrix(record, 0, 1, t.size), t)[0])


def repeats(words: Words, t: RecordTemplate) -> npt.NDArray[np.bool_]:
    """Which records (rows of their word matrix) hold the template's fixed bytes."""
    ok = (words[:, t.full_at] == t.full).all(axis=1)
    ok &= ((words[:, t.part_at] & t.part_mask) == t.part).all(axis=1)
    return ok


def log_steps(train_steps: npt.NDArray[np.int64], last_step: int) -> list[int]:
    """The steps AReaL logs these commits at, one stats dict each: the progress line's
    `Train step N` is global_step + 1, and log_step = max(global_step, last + 1)
    (areal/utils/stats_logger.py:150)."""
    n = len(train_steps)
    offset = np.arange(n, dtype=np.int64)
    floor = train_steps - 1 - offset
    floor[0] = max(floor[0], last_step + 1)
    return (np.maximum.accumulate(floor) + offset).tolist()


def read_run(data: bytes, start: int, count: int, t: RecordTemplate) -> RecordRun | None:
    """Up to `count` records of template `t` from `start`, up to the first that differs;
    None if the first already does."""
    records = np.frombuffer(data, dtype=np.uint8, count=count * t.size, offset=start)
    records = records.reshape(count, t.size)
    words = word_matrix(data, start, count, t.size)
    ok = repeats(words, t)
    digits = records[:, t.digits_at] - 48
    ok &= (digits <= 9).all(axis=1)
    n = count if ok.all() else int(np.argmin(ok))
    if n == 0:
        return None
    records = records[:n]
    day, hour, minute, second, milli, steps, totals = (
        digits[:n, : len(t.fields)].astype(np.int64) @ t.fields
    ).T
    return RecordRun(
        train_steps=steps,
        total=int(totals[-1]),
        seconds=utc_seconds(day, hour * 3600 + minute * 60 + second, milli),
        values=cell_values(records, words[:n], t).data.cast("B"),
    )


def cell_values(records: npt.NDArray[np.uint8], words: Words, t: RecordTemplate) -> Floats:
    """The records' values, (records, values), C order; a cell not in `%.4e` shape through
    `float`. Decoded a value column at a time (cells x records: the faster order)."""
    n = len(records)
    by_cell = words.T
    numbers, ok = scientific(by_cell[t.number_at], by_cell[t.number_at + 4])
    if not t.narrow:
        out = np.ascontiguousarray(numbers.T)
    else:
        out = np.empty((n, t.values))
        out[:, t.wide] = numbers.T
    odd = [] if ok.all() else [(r, int(t.wide[j])) for j, r in np.argwhere(~ok).tolist()]
    odd += [(r, c) for c in t.narrow for r in range(n)]
    for r, c in odd:
        a, b = t.cells[c]
        out[r, c] = float_or_nan(records[r, a:b].tobytes())
    return out


def byte_word(*pairs: tuple[int, int]) -> np.uint64:
    """A word holding each (position, byte) pair's byte at that position."""
    return np.uint64(sum(value << (8 * at) for at, value in pairs))


# A number `[-| ]d.dddde±dd ` is read as two words: its bytes 0-7 (the sign, the mantissa's
# digits at 1 and 3-6, `.` and `e`) and its bytes 4-11 (the exponent's sign at 4, its
# digits at 5-6, the space at 7). One masked comparison checks the bytes that are fixed,
# the digits' high halves (3) and the bits that `-` shares with ` ` (the sign) and with `+`
# (the exponent's sign). A mantissa digit's low half is at most 9 if adding 6 leaves the
# high half alone. The remaining bits (the two signs' other bits and the exponent's digits)
# form a 15-bit key into tables that say whether they are valid and give the value's scale.
MANTISSA_AT = (1, 3, 4, 5, 6)
HEAD_MASK = byte_word((0, 0xF2), (2, 0xFF), (7, 0xFF), *((i, 0xF0) for i in MANTISSA_AT))
HEAD = byte_word((0, SPACE & 0xF2), (2, DOT), (7, E), *((i, 0x30) for i in MANTISSA_AT))
HEAD_LOW = byte_word(*((i, 0x0F) for i in MANTISSA_AT))
HEAD_SIX = byte_word(*((i, 6) for i in MANTISSA_AT))
HEAD_HIGH = byte_word(*((i, 0xF0) for i in MANTISSA_AT))
TAIL_MASK = byte_word((4, 0xF9), (5, 0xF0), (6, 0xF0), (7, 0xFF))
TAIL = byte_word((4, PLUS & 0xF9), (5, 0x30), (6, 0x30), (7, SPACE))
BYTE = np.uint64(0xFF)
SIGN_BITS = 0x0D  # the sign's bits not in HEAD_MASK: 0 for ` `, all for `-`
KEY_TAIL = np.uint64(0b11 | 0xF << 7 | 0xF << 15)  # in the tail >> 33: the exponent's
KEY_FOLD = np.uint64(0b11 | 0xFF << 7)  # sign's bits 1-2 at 0-1, its digits at 7, 15 (-> 11)


def scale_tables() -> tuple[Flags, Floats, Floats]:
    """By key (see `scale_key`): whether it is valid with an exact power of ten, the signed
    factor and the divisor: value = mantissa * factor / divisor, rounded once."""
    key = np.arange(1 << 15)
    exp_sign, sign, tens, ones = key & 3, key >> 2 & SIGN_BITS, key >> 7 & 15, key >> 11 & 15
    negative = exp_sign == (MINUS >> 1 & 3)
    shift = np.where(negative, 4 + 10 * tens + ones, 4 - 10 * tens - ones)  # m * 10**-shift
    valid = np.isin(exp_sign, [PLUS >> 1 & 3, MINUS >> 1 & 3]) & np.isin(sign, [0, SIGN_BITS])
    valid &= (tens <= 9) & (ones <= 9) & (np.abs(shift) < len(POW10))
    power = POW10[np.where(valid, np.abs(shift), 0)]
    factor = np.where(shift < 0, power, 1.0) * np.where(sign == SIGN_BITS, -1.0, 1.0)
    return valid, factor, np.where(shift > 0, power, 1.0)


EXACT, FACTOR, DIVISOR = scale_tables()


def scale_key(head: Words, tail: Words) -> Index:
    """The 15-bit table key: the exponent's sign bits 1-2, the sign's SIGN_BITS (<< 2) and
    the exponent's digits' low halves (<< 7, << 11)."""
    key = tail >> np.uint64(33)
    key &= KEY_TAIL
    key |= key >> np.uint64(4)
    key &= KEY_FOLD
    sign = head & np.uint64(SIGN_BITS)
    sign <<= np.uint64(2)
    key |= sign
    return key.view(np.int64)


def scientific(head: Words, tail: Words) -> tuple[Floats, Flags]:
    """Decode `[-| ]d.dddde±dd ` numbers from their two words (see above) the way `float`
    would, and which were in that shape. m * f / d with exact doubles m, f, d, one of f and
    |d| 1, rounds once, as `float` does."""
    low = head & HEAD_LOW
    wrong = head & HEAD_MASK
    wrong ^= HEAD
    digit = low + HEAD_SIX
    digit &= HEAD_HIGH
    wrong |= digit
    digit = tail & TAIL_MASK
    digit ^= TAIL
    wrong |= digit
    key = scale_key(head, tail)
    ok = (wrong == 0) & EXACT.take(key)
    value = mantissa_of(low).astype(np.float64)
    value *= FACTOR.take(key)
    value /= DIVISOR.take(key)
    return value, ok


def mantissa_of(low: Words) -> Words:
    """d1 * 10000 + d3d4d5d6 from the head word's digit values (bytes 1, 3-6). A digit pair
    (a, b) in bytes (i, i + 1) times 1 + 10 << 8 holds 10a + b in byte i + 1; two pairs in
    16-bit halves times 1 + 100 << 16 hold 100p + q in the upper half."""
    four = low >> np.uint64(24)  # d3 d4 d5 d6 in bytes 0-3
    four *= np.uint64(1 + (10 << 8))
    four >>= np.uint64(8)
    four &= np.uint64(0x00FF00FF)  # d3d4, d5d6
    four *= np.uint64(1 + (100 << 16))
    four >>= np.uint64(16)
    four &= np.uint64(0xFFFF)
    first = low >> np.uint64(8)
    first &= BYTE
    first *= np.uint64(10000)
    first += four
    return first


def field_weights(widths: list[int]) -> npt.NDArray[np.int64]:
    """(sum(widths), len(widths)): each digit's weight in its field, fields side by side."""
    weights = np.zeros((sum(widths), len(widths)), dtype=np.int64)
    at = 0
    for i, width in enumerate(widths):
        weights[at : at + width, i] = 10 ** np.arange(width - 1, -1, -1)
        at += width
    return weights


def utc_seconds(day: Ints, seconds: Ints, milli: Ints) -> npt.NDArray[np.float64]:
    """YYYYmmdd, seconds into the day and milliseconds to seconds since the epoch, reading
    them as UTC.

    Computed as the searching parser does (whole seconds, then + ms / 1000), so both
    give the same floats."""
    if (day == day[0]).all():
        midnight: npt.NDArray[np.int64] | int = midnight_utc(int(day[0]))
    else:
        days, where = np.unique(day, return_inverse=True)
        midnight = np.array([midnight_utc(int(d)) for d in days], dtype=np.int64)[where]
    whole = midnight + seconds
    return whole + milli / 1000


def midnight_utc(day: int) -> int:
    """YYYYmmdd to seconds since the epoch at its midnight, UTC."""
    return calendar.timegm((day // 10000, day // 100 % 100, day % 100, 0, 0, 0))


def float_or_nan(cell: bytes) -> float:
    try:
        return float(cell)
    except ValueError:
        return math.nan
