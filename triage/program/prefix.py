"""The per-line prefixes launchers put on worker output, taken apart.

Where they come from (PyTorch 2.x):

- `[rank3]: ` - the excepthook `init_process_group` installs: every line of an
  uncaught exception's traceback (blank lines stay bare).
- `[rank3]:[E321 02:07:08.408 ProcessGroupNCCL.cpp:607] ...` - c10 logging of a
  process group; only the first line of a multi-line message carries it. The
  glog part is message, not prefix.
- `[default3]:` - torchrun `--tee`/`--redirects` copy each worker's output with
  its `log_line_prefix_template` (default `[${role_name}${local_rank}]:`); with the
  excepthook as well: `[default3]:[rank3]: Traceback ...`. A `[${rank}]:` template
  gives `[3]:`.
- `[1,3]<stderr>:` - Open MPI's `--tag-output`.
- `worker-1: [rank8]: ...` - pdsh (DeepSpeed's multi-node launcher) puts the
  host in front; taken only before a rank tag, as `Note: [x]` is text.
- Pastes and log collectors add a line counter `[80746] ` or a stamp
  `[2024-08-21 22:56:04][rank0]:` in front of those; they are stripped with them.
- `kubectl logs --timestamps` and `docker logs -t` put an RFC 3339 stamp
  (`2024-08-21T22:56:04.123456789Z `) before every line: stripped too, so that
  traceback frames are still frames. Read the line's time from the raw line
  (parse_stamp skips prefixes), not from the text this returns.

A line that starts with none of these comes back whole with an empty Prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Prefix:
    """What the prefix said: global rank, local rank, and how many characters it spans."""

    rank: int | None = None
    local_rank: int | None = None
    length: int = 0
    #: The host a multi-node launcher (pdsh) named, when it did.
    host: str | None = None


NO_PREFIX = Prefix()

# Things that may stand before a rank tag but never alone (a bare `[12] ` can be text).
_COUNTER = re.compile(r"\[\d{1,12}\] +(?=\[)")
_STAMPED = re.compile(r"\[\d{4}-\d\d-\d\d[^\[\]]{0,40}\] ?(?=\[)")
# `[name12]:`, `[12]:`; the name is lazy so that `default12` keeps all its digits.
_TAG = re.compile(r"\[(?P<name>[A-Za-z_][\w.\-]{0,31}?)?(?P<num>\d{1,7})\]:")
_MPI = re.compile(r"\[\d{1,9},(?P<num>\d{1,7})\]<std(?:out|err)>: ?")
_COLLECTOR = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d) ")
_HOST = re.compile(r"(?P<host>[A-Za-z0-9][\w.\-]{0,62}): (?=\[)")


def split_prefix(line: str) -> tuple[Prefix, str]:
    """The launcher prefix of `line` and the text after it."""
    start = _collected_end(line)
    found = _launcher(line, start)
    if found is None:
        return (NO_PREFIX, line) if start == 0 else (_prefix(None, None, start), line[start:])
    rank, local_rank, end, host = found
    return _prefix(rank, local_rank, end, host), line[end:]


def _collected_end(line: str) -> int:
    """Where a collector's RFC 3339 stamp at the start of `line` ends (0: none)."""
    if not line[:1].isdigit():
        return 0
    collected = _COLLECTOR.match(line)
    return collected.end() if collected is not None else 0


def _launcher(line: str, pos: int) -> tuple[int | None, int | None, int, str | None] | None:
    """Rank, local rank, end and host of the launcher tags at `pos`, or None."""
    host: str | None = None
    if not line.startswith("[", pos):
        if ": [" not in line[pos : pos + 72]:
            return None
        named = _HOST.match(line, pos)
        if named is None:
            return None
        host, pos = named["host"], named.end()
    if line[pos + 1 : pos + 2].isdigit():
        mpi = _MPI.match(line, pos)
        if mpi is not None:
            return int(mpi["num"]), None, mpi.end(), host
        counter = _COUNTER.match(line, pos)
        if counter is not None:
            pos = counter.end()
        stamped = _STAMPED.match(line, pos)
        if stamped is not None:
            pos = stamped.end()
    rank: int | None = None
    local_rank: int | None = None
    tags = 0
    while tags < 2:
        tag = _TAG.match(line, pos)
        if tag is None:
            break
        name, number = tag["name"], int(tag["num"])
        end = tag.end()
        if name == "rank" or name is None:
            if rank is not None and number != rank:
                break
            if name is None and end == len(line):
                # `[0]:` alone on a line is ChildFailedError's failure index, not a prefix.
                break
            rank = number
            if line.startswith(" ", end) and name == "rank":
                end += 1  # the excepthook writes "[rankN]: " + line
        else:
            if local_rank is not None or rank is not None:
                break
            local_rank = number
        pos = end
        tags += 1
    if tags == 0:
        return None
    return rank, local_rank, pos, host


_CACHE: dict[tuple[int | None, int | None, int, str | None], Prefix] = {}


def _prefix(rank: int | None, local_rank: int | None, length: int, host: str | None = None) -> Prefix:
    """Prefixes repeat on every line of a worker: build each once (a frozen dataclass is slow to make)."""
    key = (rank, local_rank, length, host)
    prefix = _CACHE.get(key)
    if prefix is None:
        if len(_CACHE) >= 4096:
            _CACHE.clear()
        prefix = _CACHE[key] = Prefix(rank=rank, local_rank=local_rank, length=length, host=host)
    return prefix
