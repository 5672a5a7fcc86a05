"""Training-log files: every file the globs match, followed through rotation, truncation and restarts.

One thread reads; watchdog's inotify callbacks and a periodic rescan only tell it
which paths to look at, so two reads of one file never race. Each file is followed
through an open descriptor, identified by (device, inode), so a file renamed away
(logrotate's `create`) is finished from the descriptor while the new file at the
path is read from its start. Each file feeds one `ProgramLogScanner`; its
`safe_position()` is the position handed over with the failures, so a traceback
half-read when the daemon dies is read again whole after a restart and never
stored twice.

A position (key ``"file:" + path``) is ``{"path", "dev", "inode", "offset",
"line", "hash", "last_stamp"}``: ``hash`` is the SHA-256 of the up to 4096 bytes
before ``offset`` ("" at 0), which tells a file that was truncated or replaced by
one that reused the inode from the one the position belongs to. ``line`` is the
number of lines before ``offset``, or None while it has not been counted (a file
first read from its end is counted only when it grows).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import hashlib
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver, ObservedWatch
from watchdog.observers.inotify import InotifyObserver

from ..engine import Engine
from ..logscan import MAX_LINE, ProgramLogScanner, build_prefilter, build_stamp_finder
from ..model import ProgramFailure
from . import Batch, Sink, SourceHealth, StoppableThread

log = logging.getLogger(__name__)

#: Position keys of this source start with this.
KEY_PREFIX = "file:"
#: Bytes before an offset whose hash identifies the content a position belongs to.
HASH_BYTES = 4096
#: Read chunks per file per loop pass: a file growing fast cannot starve the others.
PASS_CHUNKS = 16
#: Detached (renamed or deleted) files are checked this often while they are followed.
DETACHED_POLL = 0.2
#: A file idle this long gives its scanner back (it is rebuilt when the file grows).
IDLE_RELEASE = 300.0
#: Passes start at least this far apart: a file written line by line costs a pass per burst.
COALESCE = 0.05
#: The inotify events that matter (no IN_OPEN / IN_CLOSE: our own reads would wake us).
WATCHED_EVENTS: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]
_MAGIC = re.compile(r"[*?[]")
_IGNORED_EVENTS = frozenset({"opened", "closed_no_write"})

Ident = tuple[int, int]


def key_for(path: str) -> str:
    """The position key of a file."""
    return KEY_PREFIX + path


# -- globs -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WatchRoot:
    """A directory to watch for a glob: its fixed prefix, recursive when a directory part varies."""

    path: str
    recursive: bool


class GlobSet:
    """The configured globs, absolute, with glob.glob's meaning (recursive `**`, no hidden names
    for wildcards) both for listing files and for testing one path an inotify event names."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = [os.path.abspath(os.path.expanduser(pattern)) for pattern in patterns]
        self._parts = [_split(pattern) for pattern in self.patterns]

    def matches(self, path: str) -> bool:
        parts = _split(os.path.abspath(path))
        return any(_match_parts(pattern, parts) for pattern in self._parts)

    def expand(self) -> set[str]:
        """Regular files (symlinks followed) the globs match now."""
        found: set[str] = set()
        for pattern in self.patterns:
            for path in glob.iglob(pattern, recursive=True):
                if os.path.isfile(path):
                    found.add(path)
        return found

    def roots(self) -> list[WatchRoot]:
        """One watch per fixed prefix; recursive when any directory part of a glob under it varies."""
        roots: dict[str, bool] = {}
        for parts in self._parts:
            fixed: list[str] = []
            for part in parts[:-1]:
                if _MAGIC.search(part):
                    break
                fixed.append(part)
            base = "/" + "/".join(fixed)
            recursive = len(fixed) < len(parts) - 1 or parts[-1] == "**"
            roots[base] = roots.get(base, False) or recursive
        return [WatchRoot(path, recursive) for path, recursive in roots.items()]


def _split(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def _match_parts(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """glob.glob's rules on path components: `**` spans zero or more visible directories."""
    if not pattern:
        return not parts
    head = pattern[0]
    if head == "**":
        for skip in range(len(parts) + 1):
            if _match_parts(pattern[1:], parts[skip:]):
                return True
            if skip < len(parts) and parts[skip].startswith("."):
                return False
        return False
    if not parts:
        return False
    name = parts[0]
    if _MAGIC.search(head):
        if name.startswith(".") and not head.startswith("."):
            return False
        if not fnmatch.fnmatchcase(name, head):
            return False
    elif name != head:
        return False
    return _match_parts(pattern[1:], parts[1:])


# -- small file helpers ------------------------------------------------------------


def _open_file(path: str) -> int:
    """Open for reading; O_NONBLOCK so a FIFO that appears under a matching name cannot hang the reader."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)


def _bytes_before(fd: int, offset: int, limit: int = HASH_BYTES) -> bytes:
    size = min(offset, limit)
    return os.pread(fd, size, offset - size) if size else b""


def _hash_before(fd: int, offset: int) -> str:
    """The content check of a position: SHA-256 of the bytes just before the offset."""
    return hashlib.sha256(_bytes_before(fd, offset)).hexdigest() if offset else ""


def _end_of_last_line(fd: int, size: int) -> int:
    """Where to start a file read from its end: after its last complete line, so a line being
    written is read whole."""
    tail = _bytes_before(fd, size, MAX_LINE)
    cut = max(tail.rfind(b"\n"), tail.rfind(b"\r"))
    if cut >= 0:
        return size - len(tail) + cut + 1
    return size if size > MAX_LINE else 0


def _count_lines(fd: int, end: int, chunk: int, progress: Callable[[], None]) -> int:
    """Newlines before `end`: the line number where a file first read from its end starts."""
    lines = 0
    offset = 0
    while offset < end:
        data = os.pread(fd, min(chunk, end - offset), offset)
        if not data:
            break
        lines += data.count(b"\n")
        offset += len(data)
        progress()
    return lines


def _fd_name(fd: int) -> str | None:
    """The path an open file has now (it follows renames), or None once it is deleted."""
    try:
        name = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if name.endswith(" (deleted)") or not name.startswith("/"):
        return None
    return name


def _find_inode(directory: str, ident: Ident) -> str | None:
    """A file of `directory` with this (dev, inode): where a file renamed while the daemon was
    down (logrotate's train.log -> train.log.1) now lies."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if (
                    entry.inode() == ident[1]
                    and entry.is_file(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_dev == ident[0]
                ):
                    return entry.path
    except OSError:
        return None
    return None


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


# -- saved positions ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Saved:
    """A position as stored, checked for shape (a damaged one is forgotten, not fatal)."""

    path: str
    ident: Ident
    offset: int
    line: int | None
    hash: str
    last_stamp: float | None

    @classmethod
    def parse(cls, key: str, raw: Any) -> _Saved | None:
        if not isinstance(raw, dict):
            return None
        try:
            saved = cls(
                path=str(raw.get("path") or key.removeprefix(KEY_PREFIX)),
                ident=(int(raw["dev"]), int(raw["inode"])),
                offset=int(raw["offset"]),
                line=None if raw.get("line") is None else int(raw["line"]),
                hash=str(raw.get("hash") or ""),
                last_stamp=None if raw.get("last_stamp") is None else float(raw["last_stamp"]),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return saved if saved.offset >= 0 else None

    def fits(self, fd: int, st: os.stat_result) -> bool:
        """Same file, same bytes before the offset: resume there (else: truncated or inode reused)."""
        return (
            (st.st_dev, st.st_ino) == self.ident
            and st.st_size >= self.offset
            and _hash_before(fd, self.offset) == self.hash
        )


# -- one scanner's stream ------------------------------------------------------------

ScannerFactory = Callable[[int, int], ProgramLogScanner]


class _Stream:
    """The bytes one scanner sees, which may run from one file into the next.

    A writer whose file was truncated under it (copytruncate), or who reopened its log
    after a rename, goes on writing the same text: its stream continues in the new file,
    so a traceback cut in two by the rotation is assembled whole. `base_offset` and
    `base_line` are where the current file starts in the stream; positions and line
    numbers are given in the current file.

    The scanner is built on the first bytes and given back after a long idle time (it
    holds a compiled prefilter): thousands of old, quiet logs cost no scanner each.
    """

    def __init__(self, make: ScannerFactory, offset: int, line: int | None, last_stamp: float | None) -> None:
        self._make = make
        self.scanner: ProgramLogScanner | None = None
        #: Where the scanner starts in the file when it is built.
        self.start_offset = offset
        self.start_line = line
        self.last_stamp = last_stamp
        self.fed = offset
        self.base_offset = 0
        self.base_line = 0
        self._seen_lines = 0
        self._seen_long = 0

    @property
    def needs_line_count(self) -> bool:
        return self.scanner is None and self.start_line is None

    def _open(self) -> ProgramLogScanner:
        if self.scanner is None:
            line = self.start_line or 0
            self.scanner = self._make(self.start_offset, line)
            self.scanner.last_stamp = self.last_stamp
            self.fed, self.base_offset, self.base_line = self.start_offset, 0, 0
            self._seen_lines, self._seen_long = line, 0
        return self.scanner

    def feed(self, data: bytes) -> list[ProgramFailure]:
        failures = self._open().feed(data)
        self.fed += len(data)
        return self._renumber(failures)

    def flush_open(self) -> list[ProgramFailure]:
        return self._renumber(self.scanner.flush_open()) if self.scanner else []

    def finish(self) -> list[ProgramFailure]:
        return self._renumber(self.scanner.finish()) if self.scanner else []

    def mid_record(self) -> bool:
        """A failure is open or a line is partial: bytes fed that are not behind the safe position."""
        return self.scanner is not None and self.scanner.safe_position()[0] < self.fed

    def position(self) -> tuple[int, int | None]:
        """(offset, line) in the current file where a restart resumes without loss or repeat.
        A failure that began in the previous file resumes at 0: its first part is gone with it."""
        if self.scanner is None:
            return self.start_offset, self.start_line
        offset, line = self.scanner.safe_position()
        return max(0, offset - self.base_offset), max(0, line - self.base_line)

    def stamp(self) -> float | None:
        return self.scanner.last_stamp if self.scanner else self.last_stamp

    def file_lines(self) -> int | None:
        return self.scanner.stats.lines - self.base_line if self.scanner else self.start_line

    def continue_in_new_file(self) -> None:
        """The writer's text goes on at offset 0 of another file (truncated, or the reopened path)."""
        if self.scanner is None:
            self.start_offset, self.start_line, self.fed = 0, 0, 0
            return
        self.base_offset, self.base_line = self.fed, self.scanner.stats.lines

    def release(self) -> None:
        """Give the scanner back while nothing is open; the next bytes build a new one."""
        if self.scanner is None or self.mid_record():
            return
        self.start_offset, self.start_line = self.position()
        self.last_stamp = self.scanner.last_stamp
        self.fed = self.start_offset
        self.scanner = None

    def take_counts(self) -> tuple[int, int]:
        """(lines, over-long lines) scanned since the last call, for the health counters."""
        if self.scanner is None:
            return 0, 0
        stats = self.scanner.stats
        lines, long_lines = stats.lines - self._seen_lines, stats.long_lines - self._seen_long
        self._seen_lines, self._seen_long = stats.lines, stats.long_lines
        return max(0, lines), long_lines

    def _renumber(self, failures: list[ProgramFailure]) -> list[ProgramFailure]:
        if self.base_line:
            for failure in failures:
                if failure.line_number > self.base_line:
                    failure.line_number -= self.base_line
        return failures


# -- one followed file -------------------------------------------------------------


@dataclass(eq=False)
class _Tail:
    """A file followed through its descriptor."""

    path: str
    fd: int
    ident: Ident
    offset: int
    stream: _Stream
    last_growth: float
    #: The up to HASH_BYTES bytes before `offset`: if they change, the file was truncated and rewritten.
    guard: bytes = b""
    size: int = 0
    #: Bytes were fed since the last flush_open.
    flush_pending: bool = False
    #: The path no longer names this file (renamed out of the globs, or deleted): it is read
    #: through the descriptor until quiet for `detached_quiet`, then finished.
    detached: bool = False
    #: Deleted: no path, so no position either.
    deleted: bool = False
    #: The path it had before its last rename, and whether it grew since: a new file at that
    #: path may continue its stream (a writer that reopened its log).
    former_path: str | None = None
    grew_since_move: bool = False
    #: The renamed file whose stream this one may continue, decided at its first bytes.
    heir_of: _Tail | None = None
    #: Its read budget ran out: read again without waiting.
    more: bool = False
    behind_since: float | None = None
    position_dirty: bool = True
    stored: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return key_for(self.path)


# -- inotify -----------------------------------------------------------------------


class _Signals(FileSystemEventHandler):
    """watchdog's callbacks: note the paths and wake the reader; nothing else happens here."""

    def __init__(self) -> None:
        super().__init__()
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._paths: set[str] = set()
        self._rescan = False

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _IGNORED_EVENTS:
            return
        if event.is_directory:
            if event.event_type not in ("created", "moved", "deleted"):
                return  # a file added to or removed from a directory is its own event
            with self._lock:
                self._rescan = True  # a new directory's files may predate its watch
        else:
            with self._lock:
                self._paths.add(os.fsdecode(event.src_path))
                if event.dest_path:
                    self._paths.add(os.fsdecode(event.dest_path))
        self.wake.set()

    def request_rescan(self) -> None:
        with self._lock:
            self._rescan = True
        self.wake.set()

    def take(self) -> tuple[list[str], bool]:
        """The paths signalled since the last call, and whether a rescan was asked for."""
        self.wake.clear()
        with self._lock:
            paths, self._paths = self._paths, set()
            rescan, self._rescan = self._rescan, False
        return sorted(paths), rescan


@dataclass(slots=True)
class _Watch:
    recursive: bool
    ident: Ident
    handle: ObservedWatch


class _Watches:
    """The inotify watches on the globs' fixed prefixes, kept in step with the directories that
    exist: a prefix missing now is covered by a watch on its nearest existing ancestor, whose
    directory events ask for a rescan."""

    def __init__(self, observer: BaseObserver, handler: FileSystemEventHandler) -> None:
        self.observer = observer
        self.handler = handler
        self.watches: dict[str, _Watch] = {}
        #: The watched directories, for health() in another thread (replaced, never changed).
        self.paths: tuple[str, ...] = ()

    def update(self, roots: Sequence[WatchRoot], on_error: Callable[[str, OSError], None]) -> None:
        wanted: dict[str, bool] = {}
        for root in roots:
            path, recursive = root.path, root.recursive
            while not os.path.isdir(path) and path != "/":
                path, recursive = os.path.dirname(path), False
            wanted[path] = wanted.get(path, False) or recursive
        for path, watch in list(self.watches.items()):
            st = _stat(path)
            if wanted.get(path) != watch.recursive or st is None or (st.st_dev, st.st_ino) != watch.ident:
                self._unschedule(path)
        for path, recursive in wanted.items():
            if path not in self.watches:
                try:
                    self._schedule(path, recursive)
                except OSError as exc:  # e.g. the inotify watch limit: the rescan still covers it
                    on_error(path, exc)
        self.paths = tuple(sorted(self.watches))

    def _schedule(self, path: str, recursive: bool) -> None:
        st = os.stat(path)
        handle = self.observer.schedule(self.handler, path, recursive=recursive, event_filter=WATCHED_EVENTS)
        self.watches[path] = _Watch(recursive, (st.st_dev, st.st_ino), handle)

    def _unschedule(self, path: str) -> None:
        watch = self.watches.pop(path)
        with contextlib.suppress(KeyError, OSError):
            self.observer.unschedule(watch.handle)


# -- the source --------------------------------------------------------------------


class FileSource:
    """Training logs matched by globs, read as they grow, as `Batch`es of ProgramFailures.

    `positions`: this source's saved positions (keys ``file:...``), None or {} when there are
    none. `first_start`: the daemon has never run on this node; then files that exist now
    are read from their end when `existing_from_end` (only what is appended later),
    while files that appear later, or that appeared while the daemon was down, are read
    from their start. `quiet_flush`: a file quiet this long completes its open failure
    (a traceback's last line is followed by nothing when the process died).
    `detached_quiet`: a renamed-away or deleted file is followed this long after its last
    growth (a writer that has not reopened its log yet). `checkpoint_interval`: positions
    that move without a failure are handed over at most this often (a failure always goes
    with its position at once).
    """

    def __init__(
        self,
        engine: Engine,
        globs: list[str],
        *,
        positions: dict[str, dict[str, Any]] | None = None,
        first_start: bool,
        existing_from_end: bool = True,
        rescan_interval: float = 5.0,
        quiet_flush: float = 1.0,
        read_size: int = 1 << 20,
        name: str = "files",
        detached_quiet: float = 30.0,
        checkpoint_interval: float = 1.0,
    ) -> None:
        self.name = name
        self.engine = engine
        self.globs = GlobSet(globs)
        self.existing_from_end = existing_from_end
        self.rescan_interval = rescan_interval
        self.quiet_flush = quiet_flush
        self.read_size = read_size
        self.detached_quiet = detached_quiet
        self.checkpoint_interval = checkpoint_interval
        saved = {key: value for key, value in (positions or {}).items() if key.startswith(KEY_PREFIX)}
        self._saved: dict[str, Any] = saved
        #: The newest position of each key: where a file reopened after an error resumes.
        self._known: dict[str, Any] = dict(saved)
        #: Files found at the very first start are read from their end.
        self._very_first = first_start and not saved
        # The hyperscan scratch of a prefilter serves one thread: this source's own.
        self._prefilter = build_prefilter(engine.program_rules)
        self._stamp_finder = build_stamp_finder()
        self._signals = _Signals()
        self._observer: BaseObserver | None = None
        self._watches: _Watches | None = None
        self._watching = "not started"
        self._thread: StoppableThread | None = None
        self._sink: Sink | None = None
        self._lock = threading.Lock()  # guards _tails' membership against health()
        self._tails: dict[Ident, _Tail] = {}
        self._by_path: dict[str, _Tail] = {}
        self._outbox = Batch(source=name)
        self._stuck_until = 0.0
        self._last_delivery = 0.0
        self._next_rescan = 0.0
        self._error_seen: set[tuple[str, int | None]] = set()
        # health
        self._bytes = 0
        self._lines = 0
        self._long_lines = 0
        self._failures = 0
        self._file_errors = 0
        self._last_file_error: str | None = None
        self._sink_errors = 0
        self._truncations = 0
        self._rotations = 0
        self._last_record: float | None = None
        self._last_progress: float | None = None
        self._error: str | None = None

    # -- Source protocol -----------------------------------------------------------

    def start(self, sink: Sink) -> None:
        """Watch, resume the saved files, list the present ones, then start the reading thread.

        The watches come first so that nothing created during the listing is missed."""
        self._sink = sink
        self._start_watching()
        for key, raw in self._saved.items():
            self._safely(key.removeprefix(KEY_PREFIX), partial(self._restore, key, raw))
        for path in sorted(self.globs.expand()):
            self._safely(path, partial(self._discover, path, initial=True))
        self._next_rescan = time.monotonic() + self.rescan_interval
        self._last_progress = time.time()
        self._thread = StoppableThread(f"triage-{self.name}", self._run)
        self._thread.start()

    def stop(self) -> None:
        """Stop reading, hand over the final positions (an open failure stays unreported: its
        position makes the next start read it again whole), close everything."""
        if self._observer is not None:  # first: closing our descriptors makes inotify events
            self._observer.stop()
            self._observer.join(5.0)
            self._observer = None
        if self._thread is not None:
            self._thread.stopping.set()
            self._signals.wake.set()
            self._thread.stop()

    def health(self) -> SourceHealth:
        with self._lock:
            tails = list(self._tails.values())
        now = time.monotonic()
        behind = [now - tail.behind_since for tail in tails if tail.behind_since is not None]
        files = {
            tail.path: {
                "offset": tail.offset,
                "size": tail.size,
                "line": tail.stream.file_lines(),
                "detached": tail.detached,
            }
            for tail in tails
        }
        return SourceHealth(
            name=self.name,
            alive=self._thread is not None and self._thread.is_alive(),
            last_record=self._last_record,
            last_progress=self._last_progress,
            lag=max(behind, default=0.0),
            records=self._bytes,
            skipped=self._long_lines,
            error=self._error,
            detail={
                "records_unit": "bytes",
                "lines": self._lines,
                "failures": self._failures,
                "long_lines": self._long_lines,
                "globs": list(self.globs.patterns),
                "watching": self._watching,
                "watches": list(self._watches.paths) if self._watches else [],
                "files": files,
                "behind_bytes": sum(max(0, tail.size - tail.offset) for tail in tails),
                "file_errors": self._file_errors,
                "last_file_error": self._last_file_error,
                "sink_errors": self._sink_errors,
                "truncations": self._truncations,
                "rotations": self._rotations,
            },
        )

    # -- the thread ----------------------------------------------------------------

    def _run(self, stopping: threading.Event) -> None:
        try:
            while not stopping.is_set():
                started = time.monotonic()
                self._pass()
                self._signals.wake.wait(self._timeout())
                # A burst of writes (an inotify event each) is read in one pass, not one per write.
                stopping.wait(COALESCE - (time.monotonic() - started))
            self._deliver(force=True)
        except Exception as exc:  # a bug: the source is dead, /healthz and the watchdog say so
            log.exception("%s: reader stopped", self.name)
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self._close_all()

    def _pass(self) -> None:
        """One round: signalled paths, a rescan when due, followed files, quiet files, delivery."""
        now = time.monotonic()
        if now < self._stuck_until:
            return  # no progress while the sink refuses: the daemon's watchdog should see it
        self._progress()
        if self._outbox.failures and not self._deliver(force=True):
            return  # the sink refused: read nothing more until it takes what we have
        paths, rescan = self._signals.take()
        if rescan or now >= self._next_rescan:
            self._rescan()
            self._next_rescan = time.monotonic() + self.rescan_interval
        for path in paths:
            self._safely(path, partial(self._check_path, path))
        for tail in list(self._tails.values()):
            if (tail.detached or tail.more) and self._tails.get(tail.ident) is tail:
                self._safely(tail.path, partial(self._read, tail), tail)
        self._settle(time.monotonic())
        self._deliver(force=False)

    def _timeout(self) -> float:
        """Sleep until the next thing due: a quiet flush, a rescan, a checkpoint, at most 1 s."""
        now = time.monotonic()
        if now < self._stuck_until:
            return self._stuck_until - now
        due = [1.0, self._next_rescan - now]
        for tail in self._tails.values():
            if tail.more:
                return 0.0
            if tail.flush_pending:
                due.append(tail.last_growth + self.quiet_flush - now)
            if tail.detached:
                due.append(min(DETACHED_POLL, tail.last_growth + self.detached_quiet - now))
            if tail.position_dirty:
                due.append(self._last_delivery + self.checkpoint_interval - now)
        return max(0.0, min(due))

    def _progress(self) -> None:
        self._last_progress = time.time()

    # -- finding files ---------------------------------------------------------------

    def _start_watching(self) -> None:
        try:
            self._observer = InotifyObserver()
            self._watches = _Watches(self._observer, self._signals)
            self._watches.update(self.globs.roots(), self._watch_error)
            self._observer.start()
            self._watching = "inotify"
        except OSError as exc:  # no inotify instance left: the rescan alone still finds everything
            self._watching = f"rescan only: {exc}"
            self._observer, self._watches = None, None
            log.warning("%s: no inotify (%s); rescanning every %.1f s", self.name, exc, self.rescan_interval)

    def _watch_error(self, path: str, exc: OSError) -> None:
        self._file_error(path, exc)

    def _rescan(self) -> None:
        """What inotify misses: new directories, network filesystems, overflowed queues; and
        every followed file is checked and read if it grew."""
        if self._watches is not None:
            self._watches.update(self.globs.roots(), self._watch_error)
        for tail in list(self._by_path.values()):
            if self._by_path.get(tail.path) is tail:
                self._safely(tail.path, partial(self._check_tail, tail), tail)
        for path in sorted(self.globs.expand()):
            if path not in self._by_path:
                self._safely(path, partial(self._discover, path, initial=False))

    def _check_path(self, path: str) -> None:
        tail = self._by_path.get(path)
        if tail is not None:
            self._check_tail(tail)
        elif self.globs.matches(path):
            self._discover(path, initial=False)

    def _check_tail(self, tail: _Tail) -> None:
        """Read a followed file; if its path now names another file, that one is new."""
        path = tail.path
        if self._verify(tail):
            self._read(tail)
        elif self.globs.matches(path):
            self._discover(path, initial=False)

    def _verify(self, tail: _Tail) -> bool:
        """Does the tail's path still name its file? If not, it was renamed or deleted: detach it."""
        st = _stat(tail.path)
        if st is not None and (st.st_dev, st.st_ino) == tail.ident:
            return True
        self._detach(tail)
        return False

    def _discover(self, path: str, *, initial: bool) -> None:
        st = _stat(path)
        if st is None or not stat.S_ISREG(st.st_mode):
            return
        tail = self._tails.get((st.st_dev, st.st_ino))
        if tail is None:
            self._open(path, initial=initial)
        elif tail.detached:
            self._attach(tail, path)  # renamed into a name the globs match
        # else: another name of a file already followed (a symlink, a hard link)

    def _open(self, path: str, *, initial: bool) -> None:
        """Follow a file: from its saved position when it is the same file with the same bytes
        before it, from its end at the very first start, else from its start."""
        fd = _open_file(path)
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            if not stat.S_ISREG(st.st_mode) or ident in self._tails:
                os.close(fd)
                return
            saved = _Saved.parse(key_for(path), self._known.get(key_for(path)))
            line: int | None = 0
            stamp = None
            if saved is not None and saved.fits(fd, st):
                offset, line, stamp = saved.offset, saved.line, saved.last_stamp
            elif initial and self._very_first and self.existing_from_end:
                offset, line = _end_of_last_line(fd, st.st_size), None
            else:
                offset = 0
            tail = self._new_tail(path, fd, ident, offset, line, stamp)
            tail.size = st.st_size
            tail.more = True  # read in this pass: its first bytes may have no event of their own
        except BaseException:
            os.close(fd)
            raise
        tail.heir_of = next(
            (
                old
                for old in self._tails.values()
                if old.former_path == path and not old.grew_since_move and old.stream.mid_record()
            ),
            None,
        )
        self._register(tail, attached=True)

    def _new_tail(self, path: str, fd: int, ident: Ident, offset: int, line: int | None, stamp: float | None) -> _Tail:
        return _Tail(
            path=path,
            fd=fd,
            ident=ident,
            offset=offset,
            stream=self._stream(path, offset, line, stamp),
            last_growth=time.monotonic(),
            guard=_bytes_before(fd, offset),
        )

    def _stream(self, path: str, offset: int, line: int | None, stamp: float | None) -> _Stream:
        def make(start_offset: int, start_line: int) -> ProgramLogScanner:
            return ProgramLogScanner(
                self.engine.program_rules,
                origin=path,
                prefilter=self._prefilter,
                stamp_finder=self._stamp_finder,
                read_time=time.time,
                start_offset=start_offset,
                start_line=start_line,
            )

        return _Stream(make, offset, line, stamp)

    def _restore(self, key: str, raw: Any) -> None:
        """A saved position: left to discovery when its path still holds the file and the globs
        match it; followed where it lies now when it was renamed (found by inode in its
        directory) or is a renamed file whose end was not read yet; forgotten otherwise."""
        saved = _Saved.parse(key, raw)
        if saved is None:
            self._forget(key)
            return
        st = _stat(saved.path)
        here = st is not None and (st.st_dev, st.st_ino) == saved.ident
        if here and self.globs.matches(saved.path):
            return
        located = saved.path if here else _find_inode(os.path.dirname(saved.path), saved.ident)
        if located is None:
            self._forget(key)
            return
        fd = _open_file(located)
        st = os.fstat(fd)
        if not saved.fits(fd, st) or saved.ident in self._tails:
            os.close(fd)
            self._forget(key)
            return
        tail = self._new_tail(located, fd, saved.ident, saved.offset, saved.line, saved.last_stamp)
        tail.size, tail.more = st.st_size, True
        if located != saved.path:
            self._forget(key)
        self._register(tail, attached=self.globs.matches(located) and located not in self._by_path)

    def _register(self, tail: _Tail, *, attached: bool) -> None:
        with self._lock:
            self._tails[tail.ident] = tail
        if attached:
            self._by_path[tail.path] = tail
        else:
            tail.detached = True

    # -- rotation --------------------------------------------------------------------

    def _detach(self, tail: _Tail) -> None:
        """Its path no longer names it. Read what is there now, then follow it by descriptor
        under the name it has now (or none: deleted) until quiet."""
        self._read(tail, budget=None)
        if self._by_path.get(tail.path) is tail:
            del self._by_path[tail.path]
        self._forget(tail.key)
        self._rotations += 1
        tail.former_path, tail.grew_since_move = tail.path, False
        tail.detached, tail.last_growth = True, time.monotonic()
        name = _fd_name(tail.fd)
        if name is None:
            tail.deleted = True
            return
        tail.path = name
        tail.position_dirty = True
        if self.globs.matches(name):
            self._attach(tail, name)

    def _attach(self, tail: _Tail, path: str) -> None:
        """Follow a renamed file at a new name the globs match, like any other file."""
        holder = self._by_path.get(path)
        if holder is not None and holder is not tail and self._verify(holder):
            return  # the name holds another file too (a hard link): keep following by descriptor
        if tail.detached and not tail.deleted:
            self._forget(tail.key)
        self._by_path[path] = tail
        tail.path, tail.detached, tail.deleted = path, False, False
        tail.position_dirty = True

    def _claim_heir(self, tail: _Tail) -> None:
        """A new file at a renamed file's path got its first bytes while the renamed one, quiet
        since the rename, has a failure open: the writer reopened its log, so its text goes on
        here. The new file takes over the stream and the renamed one starts a fresh one."""
        old, tail.heir_of = tail.heir_of, None
        if old is None or tail.offset != 0 or self._tails.get(old.ident) is not old:
            return
        try:
            self._read(old, budget=None)  # bytes the old descriptor got first say the writer kept it
        except OSError as exc:
            self._file_error(old.path, exc)
            return
        if old.grew_since_move or not old.stream.mid_record():
            return
        stream = old.stream
        old.stream = self._stream(old.path, old.offset, stream.file_lines(), stream.stamp())
        stream.continue_in_new_file()
        tail.stream = stream

    # -- reading ---------------------------------------------------------------------

    def _read(self, tail: _Tail, budget: int | None = PASS_CHUNKS) -> None:
        """Read what the file has beyond our offset (up to `budget` chunks) into its scanner."""
        size = os.fstat(tail.fd).st_size
        tail.size = size
        if self._truncated(tail, size):
            self._truncations += 1
            tail.stream.continue_in_new_file()
            tail.offset, tail.guard, tail.position_dirty = 0, b"", True
        if size <= tail.offset:
            tail.more, tail.behind_since = False, None
            return
        self._claim_heir(tail)
        self._ready(tail)
        chunks = 0
        # Only up to the size just checked: bytes past it are read after the next check, so a
        # file truncated and rewritten meanwhile is not read on from the old offset.
        while tail.offset < size and (budget is None or chunks < budget):
            data = os.pread(tail.fd, min(self.read_size, size - tail.offset), tail.offset)
            if not data:
                break
            chunks += 1
            tail.offset += len(data)
            tail.guard = (tail.guard + data)[-HASH_BYTES:] if len(data) < HASH_BYTES else data[-HASH_BYTES:]
            self._take(tail.stream.feed(data))
            self._account(tail.stream, len(data))
            self._progress()
        tail.size = max(tail.size, tail.offset)
        tail.last_growth, tail.flush_pending, tail.position_dirty = time.monotonic(), True, True
        if tail.detached or tail.former_path is not None:
            tail.grew_since_move = True
        tail.more = tail.offset < size
        tail.behind_since = (tail.behind_since or time.monotonic()) if tail.more else None

    def _truncated(self, tail: _Tail, size: int) -> bool:
        """Shorter than what was read, or rewritten past it (truncated, then written fast)."""
        if size < tail.offset:
            return True
        if size == tail.offset or not tail.guard:
            return False
        return _bytes_before(tail.fd, tail.offset, len(tail.guard)) != tail.guard

    def _ready(self, tail: _Tail) -> None:
        """A file first read from its end counts its lines when it first grows (and only then)."""
        stream = tail.stream
        if stream.needs_line_count:
            stream.start_line = _count_lines(tail.fd, stream.start_offset, self.read_size * PASS_CHUNKS, self._progress)

    def _take(self, failures: list[ProgramFailure]) -> None:
        if failures:
            self._outbox.failures.extend(failures)
            self._failures += len(failures)
            self._last_record = time.time()

    def _account(self, stream: _Stream, nbytes: int) -> None:
        lines, long_lines = stream.take_counts()
        self._bytes += nbytes
        self._lines += lines
        self._long_lines += long_lines
        if nbytes:
            self._last_record = time.time()

    def _settle(self, now: float) -> None:
        """Quiet files: complete open failures; finish detached files; give back idle scanners."""
        for tail in list(self._tails.values()):
            quiet = now - tail.last_growth
            if tail.flush_pending and quiet >= self.quiet_flush:
                tail.flush_pending = False
                self._take(tail.stream.flush_open())
                tail.position_dirty = True
            if tail.detached and quiet >= self.detached_quiet:
                self._safely(tail.path, partial(self._finish, tail), tail)
            elif quiet >= IDLE_RELEASE and not tail.flush_pending:
                tail.stream.release()

    def _finish(self, tail: _Tail) -> None:
        """A detached file went quiet: its last bytes, its last line even without a newline, done."""
        self._read(tail, budget=None)
        self._take(tail.stream.finish())
        self._account(tail.stream, 0)
        self._drop(tail)
        if not tail.deleted:
            self._forget(tail.key)

    # -- positions and delivery ------------------------------------------------------

    def _position(self, tail: _Tail) -> dict[str, Any]:
        offset, line = tail.stream.position()
        return {
            "path": tail.path,
            "dev": tail.ident[0],
            "inode": tail.ident[1],
            "offset": offset,
            "line": line,
            "hash": _hash_before(tail.fd, offset),
            "last_stamp": tail.stream.stamp(),
        }

    def _forget(self, key: str) -> None:
        self._outbox.positions[key] = None
        self._known.pop(key, None)

    def _collect_positions(self) -> None:
        for tail in list(self._tails.values()):
            if not tail.position_dirty:
                continue
            tail.position_dirty = False
            if tail.deleted:
                continue
            try:
                position = self._position(tail)
            except OSError as exc:
                self._file_error(tail.path, exc)
                continue
            if position != tail.stored:
                tail.stored = position
                self._outbox.positions[tail.key] = position
                self._known[tail.key] = position

    def _deliver(self, *, force: bool) -> bool:
        """Hand the outbox over: at once when it holds failures (with every moved position), else
        at most every checkpoint_interval. A sink that raises gets the same batch again later."""
        now = time.monotonic()
        if not force and not self._outbox.failures and now - self._last_delivery < self.checkpoint_interval:
            return True
        self._collect_positions()
        if not self._outbox.failures and not self._outbox.positions:
            return True
        assert self._sink is not None
        try:
            self._sink(self._outbox)
        except Exception as exc:
            self._sink_errors += 1
            self._stuck_until = now + 1.0
            log.warning("%s: sink refused a batch (%s); retrying", self.name, exc)
            return False
        self._outbox = Batch(source=self.name)
        self._last_delivery = now
        return True

    # -- errors and cleanup ----------------------------------------------------------

    def _safely(self, path: str, action: Callable[[], None], tail: _Tail | None = None) -> None:
        """Run one file's step; an OSError (permission, vanished, I/O) is counted and that file
        skipped (a followed one is closed and reopened from its position by a later rescan)."""
        try:
            action()
        except OSError as exc:
            self._file_error(path, exc)
            if tail is not None and self._tails.get(tail.ident) is tail:
                self._drop(tail)

    def _file_error(self, path: str, exc: OSError) -> None:
        self._last_file_error = f"{path}: {exc.strerror or exc}"
        if (path, exc.errno) not in self._error_seen:
            self._error_seen.add((path, exc.errno))
            self._file_errors += 1
            log.warning("%s: skipping %s: %s", self.name, path, exc.strerror or exc)

    def _drop(self, tail: _Tail) -> None:
        with self._lock:
            self._tails.pop(tail.ident, None)
        if self._by_path.get(tail.path) is tail:
            del self._by_path[tail.path]
        with contextlib.suppress(OSError):
            os.close(tail.fd)

    def _close_all(self) -> None:
        for tail in list(self._tails.values()):
            self._drop(tail)


__all__ = ["KEY_PREFIX", "FileSource", "GlobSet", "WatchRoot", "key_for"]
