"""Wall-clock stamps at the start of training-log lines, in the formats that occur.

One compiled search per line finds the first date+time shape near the start;
the text before it must look like a line prefix (brackets, level words, pids,
separators), so a date quoted inside a message does not become the line's time.
Naive stamps are local time, as the programs that print them mean them.

Formats (all need HH:MM:SS, which is what the quick rejection looks for):

- ISO 8601 `2024-08-21T22:56:04.123+02:00`, `...Z`, naive; `2024/08/21 22:56:04`
- Python logging `2024-08-21 22:56:04,123` (LLaMA-Factory `[INFO|...]`, DeepSpeed
  `[2024-...] [INFO]`, loguru `ERROR    | 2024-... |`)
- torchrun ChildFailedError `2024-08-21_22:56:04`
- transformers / accelerate `11/30/2026 10:56:45` (month first)
- glog and c10 logging `W1130 10:56:45.034000 819010 file.py:900]`,
  `[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607]` (no year: reference_year,
  else this year, or last year when this year would put it in the future)
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta, timezone

#: How far into a line the stamp may start (after prefixes and level words).
MAX_LEAD = 64
#: Characters looked at: the lead plus the longest stamp.
_WINDOW = MAX_LEAD + 40

_STAMP = re.compile(
    r"(?:"
    r"(?<!\d)(?P<Y>\d{4})(?P<sep>[-/])(?P<m>\d\d)(?P=sep)(?P<d>\d\d)[T _]"
    r"|(?<!\d)(?P<m2>\d\d)/(?P<d2>\d\d)/(?P<Y2>\d{4}),? "
    r"|(?<![\w])(?P<lvl>[IWEF])(?P<gY>\d{4})?(?P<md>\d{3,4}) +"
    r")"
    r"(?P<H>\d\d):(?P<M>\d\d):(?P<S>\d\d)"
    r"(?:[.,](?P<f>\d{1,9}))?"
    r"(?P<tz>Z|[+-]\d\d:?\d\d)?"
    r"(?!\d)",
    re.ASCII,
)

#: What may come before a stamp: whitespace, `[...]` groups (a rank, a pid, a
#: `[INFO|file.py:12]`), upper-case level words, numbers, separators, and at the
#: very end an opening `[` or `[LEVEL|`. Possessive, so it never backtracks.
_LEAD = re.compile(r"(?:\s+|\[[^\[\]]{0,64}\]:?|[A-Z]{1,10}\b:?|\d{1,12}\b|[|:\-=>#*])*+(?:\[(?:[A-Z]{1,10}\|)?)?")

_YEAR_MIN = 1970
_YEAR_MAX = 2200


def parse_stamp(text: str, *, reference_year: int | None = None) -> float | None:
    """Epoch seconds of the stamp at or near the start of `text`, or None.

    Never raises: a shape that is not a real date (month 13, Feb 30) is None.
    """
    head = text[:_WINDOW]
    clock = _clock_at(head)
    if clock < 0:
        return None
    # The date part is at most 16 characters before the clock (`I20240821 `, `11/30/2026, `).
    match = _STAMP.search(head, max(0, clock - 16))
    if match is None or match.start() > MAX_LEAD:
        return None
    if match.start() and _LEAD.fullmatch(head, 0, match.start()) is None:
        return None
    try:
        return _epoch(match, reference_year)
    except (ValueError, OverflowError, OSError):
        return None


def _clock_at(head: str) -> int:
    """Where the first `HH:MM:SS` starts, or -1: string scans, far cheaper than a regex."""
    colon = head.find(":", 2)
    while colon >= 0:
        if (
            head[colon + 3 : colon + 4] == ":"
            and head[colon - 2 : colon].isdigit()
            and head[colon + 1 : colon + 3].isdigit()
            and head[colon + 4 : colon + 6].isdigit()
        ):
            return colon - 2
        colon = head.find(":", colon + 1)
    return -1


def _epoch(match: re.Match[str], reference_year: int | None) -> float | None:
    groups = match.groupdict()
    hour, minute, second = int(groups["H"]), int(groups["M"]), int(groups["S"])
    fraction = float("0." + groups["f"]) if groups["f"] else 0.0
    if groups["Y"] is not None:
        year, month, day = int(groups["Y"]), int(groups["m"]), int(groups["d"])
    elif groups["Y2"] is not None:
        year, month, day = int(groups["Y2"]), int(groups["m2"]), int(groups["d2"])
    else:
        md = groups["md"]
        month, day = int(md[:-2]), int(md[-2:])
        if groups["gY"] is not None:
            year = int(groups["gY"])
        else:
            return _yearless(month, day, hour, minute, second, fraction, reference_year)
    if not _YEAR_MIN <= year <= _YEAR_MAX:
        return None
    tz = groups["tz"]
    if tz:
        aware = datetime(year, month, day, hour, minute, second, tzinfo=_zone(tz))
        return aware.timestamp() + fraction
    return _local(year, month, day, hour, minute, second) + fraction


def _yearless(
    month: int, day: int, hour: int, minute: int, second: int, fraction: float, reference_year: int | None
) -> float:
    """A glog stamp has no year: the reference year, else the latest year that is not in the future."""
    if reference_year is not None:
        return _local(reference_year, month, day, hour, minute, second) + fraction
    now = time.time()
    year = time.localtime(now).tm_year
    try:
        epoch: float | None = _local(year, month, day, hour, minute, second) + fraction
    except ValueError:  # Feb 29 of a year that has none: try last year
        epoch = None
    # A day of slack: clocks of the log's host and this one differ.
    if epoch is None or epoch > now + 86400:
        epoch = _local(year - 1, month, day, hour, minute, second) + fraction
    return epoch


_HOURS: dict[tuple[int, int, int, int], float] = {}


def _local(year: int, month: int, day: int, hour: int, minute: int, second: int) -> float:
    """Epoch of a naive local time. mktime is the slow part of a stamp, and a log's
    stamps share their hour: the hour's epoch is cached (offsets change on the hour)."""
    if not (0 <= minute <= 59 and 0 <= second <= 59):
        raise ValueError("minute or second out of range")
    key = (year, month, day, hour)
    base = _HOURS.get(key)
    if base is None:
        base = datetime(year, month, day, hour).timestamp()
        if len(_HOURS) >= 4096:
            _HOURS.clear()
        _HOURS[key] = base
    return base + minute * 60 + second


def _zone(text: str) -> timezone:
    if text == "Z":
        return UTC
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours > 23 or minutes > 59:
        raise ValueError(f"bad offset {text}")
    return timezone(sign * timedelta(hours=hours, minutes=minutes))
