"""Training-log lines in, program failures out: a small state machine per stream.

A *stream* is one worker's output, told apart by its launcher prefix
(`(rank, local_rank)`); lines of interleaved ranks assemble separately. Each
stream keeps a ring of its recent lines (the context a failure is read in) and at
most one open *block*:

- a Python traceback (`Traceback (most recent call last):`, or frames of an
  excerpt that starts mid-way), its exception line and message, chained
  exceptions included; `ChildFailedError` makes it torchrun's summary;
- a C++ `terminate called after throwing an instance of '...'` report;
- a fatal line that a rule recognises (or a bare `SomeError: message`), with the
  continuation lines that belong to it and identical repeats folded into a count.

A block ends when its stream prints something that cannot belong to it, when
the stream has been silent for a while (stale: the process died mid-report), or
at flush. Then it is classified with the rule catalog and handed back.

Launchers prefix only some lines: the `[rankN]: ` excepthook leaves blank lines
bare, c10 logging prefixes only the first line of `Exception raised from ...`
stacks, and a terminal folds long lines. A bare line right after a prefixed
line with an open block therefore joins that block when it is one of those.
"""

from __future__ import annotations

import functools
import re
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from ..classify import Classification, best_rule
from ..model import Frame, ProgramFailure, ProgramLine, TimeSource
from ..patterns import Rule
from ..prefilter import Prefilter
from .prefix import split_prefix
from .timestamps import parse_stamp

StreamKey = tuple[int | None, int | None]
_BARE: StreamKey = (None, None)

HEADER = "Traceback (most recent call last):"
#: Message lines kept after an exception line before the message is cut.
MESSAGE_LINES = 20
#: Continuation lines a fatal line may take.
FATAL_LINES = 24
#: Lines one block may hold; a longer report is closed there.
BLOCK_LINES = 2000
#: A terminal folded a line when it is at least this long and the next is its rest.
FOLD_WIDTH = 80
#: Lines (of any stream) after which a silent stream's open block is closed.
STALE_MESSAGE = 64
STALE_FRAMES = 1024
#: Streams remembered at most; beyond, the quiet ones are forgotten (a log whose
#: `[stepN]:`-like tags look like ranks must not grow memory without bound).
MAX_STREAMS = 4096

_CHAIN = re.compile(
    r"\s*(?:During handling of the above exception, another exception occurred:"
    r"|The above exception was the direct cause of the following exception:)\s*"
)
_FRAME = re.compile(r'\s*(?:File ")?(?P<file>[^"]*)", line (?P<line>\d+|None)(?:,?\s*in (?P<func>.*))?')
_EXCEPTION = re.compile(r"(?P<type>[A-Za-z_][\w.]*)(?::[ \t]?(?P<msg>.*))?")
_STANDALONE_TYPE = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*")
_STANDALONE_SUFFIXES = ("Error", "Exception", "Interrupt", "Exit")
_CARET = re.compile(r"[\s^~]*[\^~][\s^~]*")
_GUTTER = re.compile(r"\s*(?P<mark>[|+])(?P<rest>.*)")
_ELIDED = re.compile(r"\s*\.\.\.<\d+ lines?>\.\.\.\s*")
_CPP_THROW = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']*)'")
_CPP_TERMINATE = re.compile(r"terminate called (?:without an active exception|recursively)")
_WHAT = re.compile(r"\s*what\(\):\s*(?P<msg>.*)")
_TORCHRUN_FAILED = re.compile(
    r"failed \(exitcode: (?P<exitcode>-?\d+)\) local_rank: (?P<local_rank>\d+) \(pid: (?P<pid>\d+)\)"
    r" of binary: (?P<binary>.*)"
)
_PROGRESS = re.compile(r"\d%\||\|\s*\d+/\d+ \[\d")
#: Crash reports that end any message in front of them.
_FATAL_START = re.compile(
    r"terminate called |Memory access fault by GPU|HW Exception by GPU|:0:rocdevice\.cpp|Fatal Python error: "
    r"|Segmentation fault|\(core dumped\)|^Aborted\b|Illegal instruction"
)
#: Lines known to continue a fatal line or a bare exception line.
_CONTINUATION = re.compile(
    r"(?:HIP|CUDA) kernel errors might be asynchronously reported|For debugging consider passing"
    r"|Compile with `TORCH_USE_|nccl[A-Za-z]*Error: |Last error:|current device: |Kernel Name: "
    r"|Search for `|Exception raised from |frame #\d+: |VGPU="
)
_FAULTHANDLER_LINE = re.compile(
    r"\s|Current thread 0x|Thread 0x|Extension modules: |Stack \(most recent call first\):|<no Python frame>"
)
_CHILD_FIELD = re.compile(r"\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)")
_CHILD_RANK = re.compile(r"(?P<rank>-?\d+) \(local_rank: (?P<local_rank>-?\d+)\)")
_CHILD_EXIT = re.compile(r"(?P<exitcode>-?\d+) \(pid: (?P<pid>\d+)\)(?:\s+\((?P<signal>SIG\w+)\))?")
_CHILD_INDEX = re.compile(r"\[\d+\]:")
_BORDER = re.compile(r"=+")
_NOISE = re.compile(r"(?:handle|tid)[:=]\s*0x[0-9a-fA-F]+")

GENERIC_HINTS = {
    "traceback": "Read the traceback's last frames in your code and its exception message; "
    "no rule in the catalog names this failure yet.",
    "cpp_exception": "A C++ exception ended the process: read what() and the first frames of its stack.",
    "fatal_line": "The program printed a fatal error no rule names yet: read the lines around it.",
    "child_failed": "torchrun's summary of a worker that failed: the worker's own failure names the cause.",
}


class _Verdict(Enum):
    TAKE = 1  # the line belongs to the block, which stays open
    TAKE_END = 2  # the line belongs to the block, which is complete
    END = 3  # the block is complete; the line is not part of it


def _standalone(text: str) -> tuple[str, str] | None:
    """`SomeError: message` (a dotted class name that ends like an exception's) as (type, message)."""
    colon = text.find(":", 0, 160)
    if colon < 0:
        return None
    name = text[:colon]
    if not name.endswith(_STANDALONE_SUFFIXES) or _STANDALONE_TYPE.fullmatch(name) is None:
        return None
    return name, text[colon + 1 :].strip()


def _is_frame(text: str) -> re.Match[str] | None:
    if '", line ' not in text:
        return None
    return _FRAME.match(text)


def _is_stamped(line: ProgramLine) -> bool:
    """A log record of its own (its text starts with a stamp): no message goes on into it.

    The text, not time_source: a collector's stamp on every line is prefix, not a record start."""
    return parse_stamp(line.text) is not None


def _has_header(text: str) -> bool:
    return HEADER in text


def _is_fold(previous_raw: str | None, line: ProgramLine) -> bool:
    """Is `line` the rest of `previous_raw` that a terminal folded?"""
    if previous_raw is None or len(previous_raw) < FOLD_WIDTH or previous_raw[-1:].isspace():
        return False
    text = line.text
    if not text.strip() or _standalone(text) is not None or _CONTINUATION.match(text.lstrip()):
        return False
    return not _ends_message(line)


def _ends_message(line: ProgramLine) -> bool:
    """Structural reasons a message cannot go on: something else starts here."""
    text = line.text
    if _has_header(text) or _is_frame(text) or _CHAIN.fullmatch(text):
        return True
    if text.startswith(">>>") or _PROGRESS.search(text) or _FATAL_START.search(text):
        return True
    return _is_stamped(line)


def _cpp_frame(text: str) -> Frame:
    """`frame #3: fn + 0x98 (0x7f... in /usr/lib/libc10.so)` as a Frame (the library as its file)."""
    body = text.split(": ", 1)[1] if ": " in text else text
    file = ""
    cut = body.rfind(" (")
    if cut > 0 and body.endswith(")"):
        inner = body[cut + 2 : -1]
        file = inner.split(" in ", 1)[1] if " in " in inner else inner
        body = body[:cut]
    return Frame(file=file, line=None, function=body)


def _py_frame(match: re.Match[str]) -> Frame:
    number = match["line"]
    return Frame(
        file=match["file"], line=int(number) if number.isdigit() else None, function=(match["func"] or "").strip()
    )


class _Block:
    """What every open block has: its lines, where it started, and when it last grew."""

    kind = "fatal_line"

    def __init__(self, line: ProgramLine, text: str, context: list[str], tick: int) -> None:
        self.first = line
        # A line rejoined from a terminal's fold holds its physical lines joined by "\n".
        self.raws: list[str] = line.raw.split("\n")
        self.texts: list[str] = [text]
        self.context = context
        self.last_tick = tick
        self.rank = line.rank
        self.local_rank = line.local_rank

    def add(self, line: ProgramLine, *, fold: bool = False) -> None:
        self.raws.extend(line.raw.split("\n"))
        if fold and self.texts:
            self.texts[-1] += line.text
        else:
            self.texts.append(line.text)
        if self.rank is None:
            self.rank = line.rank
        if self.local_rank is None:
            self.local_rank = line.local_rank

    def stale_after(self) -> int:
        """Lines of other streams after which this block counts as abandoned."""
        return STALE_MESSAGE

    def offer(self, line: ProgramLine, fold: bool) -> _Verdict:
        raise NotImplementedError

    def build(self, final: bool) -> ProgramFailure | None:
        raise NotImplementedError

    def _failure(self, kind: str) -> ProgramFailure:
        raws, texts = list(self.raws), [text.rstrip() for text in self.texts]
        while len(raws) > 1 and not texts[-1].strip() and not raws[-1].strip(" \t"):
            raws.pop()
            texts.pop()
        while len(texts) > 1 and not texts[-1].strip():
            texts.pop()
        first = self.first
        return ProgramFailure(
            kind=kind,
            lines=raws,
            text="\n".join(texts),
            origin=first.origin,
            line_number=first.number,
            context=self.context,
            time=first.time,
            time_source=first.time_source,
            rank=self.rank,
            local_rank=self.local_rank,
            host=first.host,
        )


class _Traceback(_Block):
    """A Python traceback: frames, exception line, message, and chained sections."""

    kind = "traceback"

    def __init__(
        self,
        line: ProgramLine,
        text: str,
        context: list[str],
        tick: int,
        *,
        headless: bool,
        names: Callable[[str], bool] = lambda _text: False,
    ) -> None:
        super().__init__(line, text, context, tick)
        self.headless = headless
        #: Does a rule name a line on its own? Such a line ends the message.
        self.names = names
        self.state = "frames"
        self.frames: list[Frame] = []
        self.chain: list[str] = []
        self.exception_type: str | None = None
        self.message: list[str] = []
        self.message_lines = 0
        self.after_frame = False
        self.after_last_error = False
        self.blanks = 0
        self.child = False
        self.root_seen = False
        if headless:
            frame = _is_frame(text)
            if frame is not None:
                self.frames.append(_py_frame(frame))
                self.after_frame = True
            else:
                self._exception(text)

    def stale_after(self) -> int:
        return STALE_FRAMES if self.state == "frames" else STALE_MESSAGE

    def _exception(self, text: str) -> bool:
        match = _EXCEPTION.fullmatch(text)
        if match is None:
            return False
        self.exception_type = match["type"]
        self.message = [match["msg"] or ""]
        self.message_lines = 0
        self.state = "message"
        self.child = self.exception_type.endswith("ChildFailedError")
        return True

    def offer(self, line: ProgramLine, fold: bool) -> _Verdict:
        if len(self.raws) >= BLOCK_LINES:
            return _Verdict.END
        handler = getattr(self, "_offer_" + self.state)
        verdict: _Verdict = handler(line, fold)
        if verdict is not _Verdict.END:
            self.add(line, fold=fold and self.state == "message")
        return verdict

    def _offer_frames(self, line: ProgramLine, fold: bool) -> _Verdict:
        text = line.text
        if _has_header(text):
            return _Verdict.END
        frame = _is_frame(text)
        if frame is not None:
            self.frames.append(_py_frame(frame))
            self.after_frame = True
            return _Verdict.TAKE
        if not text.strip():
            return _Verdict.TAKE
        if text[0].isspace() or _CARET.fullmatch(text) or _ELIDED.fullmatch(text):
            self.after_frame = False
            return _Verdict.TAKE
        if not self.frames and not self.headless and self.exception_type is None and _standalone(text):
            # `Traceback (most recent call last):` followed straight by the exception.
            self._exception(text)
            return _Verdict.TAKE
        if self.frames and self._exception(text):
            return _Verdict.TAKE
        if self.after_frame:
            # The source line of a frame that lost its indentation (a paste).
            self.after_frame = False
            return _Verdict.TAKE
        return _Verdict.END

    def _offer_message(self, line: ProgramLine, fold: bool) -> _Verdict:
        text = line.text
        if self.child:
            return self._offer_child(line)
        if not text.strip():
            self.state = "after_blank"
            self.blanks = 1
            return _Verdict.TAKE
        if _CHAIN.fullmatch(text):
            self.state = "chain"
            return _Verdict.TAKE
        stripped = text.lstrip()
        if stripped.startswith(("Exception raised from ", "frame #")):
            return _Verdict.TAKE  # a C++ stack in the message: kept, not counted
        if fold:
            if self.message:
                self.message[-1] += text
            return _Verdict.TAKE
        if _ends_message(line) or stripped.startswith(("{'", '{"')):
            return _Verdict.END  # something else starts, or a metrics dict (a trainer's log record)
        known = self.after_last_error or bool(_CONTINUATION.match(stripped))
        if not known and self.names(text):
            return _Verdict.END  # a fatal line of its own (a ROCr abort after the exception, say)
        self.after_last_error = stripped.startswith("Last error:")
        self.message_lines += 1
        if self.message_lines > MESSAGE_LINES:
            return _Verdict.END
        self.message.append(text)
        return _Verdict.TAKE

    def _offer_child(self, line: ProgramLine) -> _Verdict:
        """torchrun's summary runs from its exception line to the border after `Root Cause`."""
        text = line.text
        if text.startswith(HEADER) or self.message_lines > BLOCK_LINES // 4:
            return _Verdict.END
        self.message_lines += 1
        self.message.append(text)
        if text.startswith("Root Cause"):
            self.root_seen = True
        elif self.root_seen and _BORDER.fullmatch(text.strip()):
            return _Verdict.TAKE_END
        return _Verdict.TAKE

    def _offer_after_blank(self, line: ProgramLine, fold: bool) -> _Verdict:
        text = line.text
        if not text.strip():
            self.blanks += 1
            return _Verdict.TAKE if self.blanks <= 2 else _Verdict.END
        if _CHAIN.fullmatch(text):
            self.state = "chain"
            return _Verdict.TAKE
        if text.lstrip().startswith("Exception raised from "):
            self.state = "message"
            return _Verdict.TAKE
        return _Verdict.END

    def _offer_chain(self, line: ProgramLine, fold: bool) -> _Verdict:
        text = line.text
        if not text.strip():
            return _Verdict.TAKE
        if text.startswith(HEADER):
            if self.exception_type is not None:
                self.chain.append(f"{self.exception_type}: {self.message[0]}".rstrip(": "))
            self.exception_type = None
            self.message = []
            self.state = "frames"
            self.after_frame = False
            return _Verdict.TAKE
        return _Verdict.END

    def build(self, final: bool) -> ProgramFailure | None:
        if self.exception_type is None and not self.frames:
            return None  # a bare header: nothing to tell
        if self.exception_type is None and self.headless and not final:
            # Frames without a header that a normal line ended: a warning's stack
            # (anomaly mode prints one), not a failure. An excerpt ends at flush.
            return None
        failure = self._failure("child_failed" if self.child else "traceback")
        failure.exception_type = self.exception_type
        message = [
            text.rstrip() for text in self.message if not text.lstrip().startswith(("frame #", "Exception raised"))
        ]
        while message and not message[-1].strip():
            message.pop()
        while len(message) > 1 and not message[0].strip():
            message.pop(0)  # ChildFailedError's message starts on the next line
        failure.message = "\n".join(message)
        failure.frames = self.frames
        failure.chain = self.chain
        if self.child:
            _child_summary(failure, self.message)
        return failure


class _Group(_Block):
    """Python 3.11's exception group: every line in the `|`/`+` gutter belongs to it.

    The first exception line is the group's own; the later ones, its sub-exceptions.
    """

    kind = "traceback"

    def __init__(self, line: ProgramLine, text: str, context: list[str], tick: int) -> None:
        super().__init__(line, text, context, tick)
        self.exception_type: str | None = None
        self.message = ""
        self.frames: list[Frame] = []
        self.subs: list[str] = []

    def stale_after(self) -> int:
        return STALE_FRAMES

    def offer(self, line: ProgramLine, fold: bool) -> _Verdict:
        gutter = _GUTTER.match(line.text)
        if gutter is None or len(self.raws) >= BLOCK_LINES:
            return _Verdict.END
        if gutter["mark"] == "|":
            inner = gutter["rest"][1:] if gutter["rest"].startswith(" ") else gutter["rest"]
            frame = _is_frame(inner)
            if frame is not None:
                self.frames.append(_py_frame(frame))
            elif inner[:1].strip() and not inner.startswith(HEADER):
                exception = _EXCEPTION.fullmatch(inner)
                if exception is not None and self.exception_type is None:
                    self.exception_type, self.message = exception["type"], exception["msg"] or ""
                elif exception is not None:
                    self.subs.append(inner.strip())
        self.add(line)
        return _Verdict.TAKE

    def build(self, final: bool) -> ProgramFailure | None:
        if self.exception_type is None and not self.frames:
            return None
        failure = self._failure(self.kind)
        failure.exception_type = self.exception_type
        failure.message = self.message
        failure.frames = self.frames
        if self.subs:
            failure.fields["sub_exceptions"] = "; ".join(self.subs)
        return failure


class _Cpp(_Block):
    """`terminate called after throwing an instance of 'c10::Error'` and what follows it."""

    kind = "cpp_exception"

    def __init__(self, line: ProgramLine, text: str, context: list[str], tick: int) -> None:
        super().__init__(line, text, context, tick)
        throw = _CPP_THROW.search(text)
        self.exception_type = throw["type"] if throw else None
        self.message: list[str] = []
        self.frames: list[Frame] = []
        self.state = "head"
        self.blanks = 0

    def offer(self, line: ProgramLine, fold: bool) -> _Verdict:
        if len(self.raws) >= BLOCK_LINES:
            return _Verdict.END
        verdict = self._offer(line, fold)
        if verdict is not _Verdict.END:
            self.add(line, fold=fold)
        return verdict

    def _offer(self, line: ProgramLine, fold: bool) -> _Verdict:
        text = line.text
        stripped = text.strip()
        if stripped.startswith("frame #"):
            self.frames.append(_cpp_frame(stripped))
            self.state = "stack"
            return _Verdict.TAKE
        if stripped.startswith("Exception raised from "):
            self.state = "stack"
            return _Verdict.TAKE
        if not stripped:
            self.blanks += 1
            if self.state == "stack" or self.blanks > 2:
                return _Verdict.END
            return _Verdict.TAKE
        if self.blanks:
            return _Verdict.END  # after a blank line only the stack may follow
        what = _WHAT.match(text)
        if what is not None and self.state == "head":
            self.message.append(what["msg"])
            self.state = "what"
            return _Verdict.TAKE
        if self.state == "what" and (fold or not _ends_message(line)) and len(self.message) <= MESSAGE_LINES:
            if fold and self.message:
                self.message[-1] += text
            else:
                self.message.append(text)
            return _Verdict.TAKE
        return _Verdict.END

    def build(self, final: bool) -> ProgramFailure:
        failure = self._failure(self.kind)
        failure.exception_type = self.exception_type
        failure.message = "\n".join(text.rstrip() for text in self.message)
        failure.frames = self.frames
        return failure


class _Fatal(_Block):
    """One fatal line, its continuation lines, and identical repeats of it."""

    def __init__(
        self,
        line: ProgramLine,
        text: str,
        context: list[str],
        tick: int,
        *,
        exception_type: str | None = None,
        message: str | None = None,
        faulthandler: bool = False,
    ) -> None:
        super().__init__(line, text, context, tick)
        self.exception_type = exception_type
        self.message = [message if message is not None else text.strip()]
        self.faulthandler = faulthandler
        self.frames: list[Frame] = []
        self.count = 1
        self.continued = 0
        self.after_last_error = text.rstrip().endswith("Last error:")
        self.key = _NOISE.sub("", text)

    def offer(self, line: ProgramLine, fold: bool) -> _Verdict:
        text = line.text
        if text == self.texts[0] or (self.key != self.texts[0] and _NOISE.sub("", text) == self.key):
            self.count += 1  # the same fatal line again: counted, not kept
            return _Verdict.TAKE
        if self.continued >= (BLOCK_LINES if self.faulthandler else FATAL_LINES):
            return _Verdict.END
        if not self._continues(line, fold):
            return _Verdict.END
        self.continued += 1
        self.add(line, fold=fold)
        if fold and len(self.texts) == 1:
            self.message[0] += text
        return _Verdict.TAKE

    def _continues(self, line: ProgramLine, fold: bool) -> bool:
        text = line.text
        if fold:
            return True
        if self.faulthandler:
            frame = _is_frame(text)
            if frame is not None:
                self.frames.append(_py_frame(frame))
                return True
            return not text.strip() or bool(_FAULTHANDLER_LINE.match(text))
        if not text.strip():
            return False
        if self.after_last_error:
            self.after_last_error = False
            return True
        stripped = text.lstrip()
        if _CONTINUATION.match(stripped):
            self.after_last_error = stripped.startswith("Last error:")
            if stripped.startswith("frame #"):
                self.frames.append(_cpp_frame(stripped))
            return True
        if text[0].isspace():
            return not _ends_message(line)
        return False

    def build(self, final: bool) -> ProgramFailure:
        failure = self._failure("fatal_line")
        failure.exception_type = self.exception_type
        failure.message = "\n".join(text.rstrip() for text in self.message)
        failure.frames = self.frames
        failure.count = self.count
        return failure


def _child_summary(failure: ProgramFailure, message: list[str]) -> None:
    """Rank, host, pid, exit code and time of the root cause of a ChildFailedError."""
    fields = failure.fields
    failures = 0
    in_root = False
    root: dict[str, str] = {}
    root_lines: list[str] = []
    for text in message:
        stripped = text.strip()
        if _CHILD_INDEX.fullmatch(stripped):
            failures += 1
            continue
        if stripped.startswith("Root Cause"):
            in_root = True
            continue
        if stripped.endswith(" FAILED") and "script" not in fields:
            fields["script"] = stripped[: -len(" FAILED")]
        if not in_root:
            continue
        if _BORDER.fullmatch(stripped):
            break
        root_lines.append(text)
        field = _CHILD_FIELD.match(text)
        if field is not None and field["key"] not in root:
            root[field["key"]] = field["value"].strip()
    fields["failures"] = str(failures)
    if "host" in root:
        failure.host = root["host"]
        fields["host"] = root["host"]
    rank = _CHILD_RANK.match(root.get("rank", ""))
    if rank is not None:
        failure.rank, failure.local_rank = int(rank["rank"]), int(rank["local_rank"])
        fields["rank"], fields["local_rank"] = rank["rank"], rank["local_rank"]
    exit_ = _CHILD_EXIT.match(root.get("exitcode", ""))
    if exit_ is not None:
        failure.pid = int(exit_["pid"])
        fields["exitcode"], fields["pid"] = exit_["exitcode"], exit_["pid"]
        if exit_["signal"]:
            fields["signal"] = exit_["signal"]
    if root.get("error_file") and root["error_file"] != "<N/A>":
        fields["error_file"] = root["error_file"]
    stamp = parse_stamp(root.get("time", ""))
    if stamp is not None:
        failure.time, failure.time_source = stamp, "stamp"
    cause = root.get("traceback", "")
    for text in reversed(root_lines):
        candidate = text.strip()
        if _standalone(candidate) is not None:
            cause = candidate
            break
    if cause and not cause.startswith("To enable traceback"):
        fields["root_cause"] = cause
    failure.ranks = [failure.rank] if failure.rank is not None else []


def shorten(text: str, width: int = 100) -> str:
    """One line of at most `width` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def _title(failure: ProgramFailure) -> str:
    first = failure.message.strip().split("\n", 1)[0] if failure.message.strip() else ""
    if failure.kind == "child_failed":
        script = failure.fields.get("script", "worker")
        who = f"rank {failure.rank}" if failure.rank is not None else f"local_rank {failure.local_rank}"
        exitcode = failure.fields.get("exitcode", "?")
        signal = failure.fields.get("signal")
        return shorten(f"torchrun: {script} failed, {who} exited with {exitcode}" + (f" ({signal})" if signal else ""))
    if failure.kind == "cpp_exception":
        return shorten(f"{failure.exception_type}: {first}" if first and failure.exception_type else failure.text)
    if failure.exception_type:
        return shorten(f"{failure.exception_type}: {first}" if first else failure.exception_type)
    if failure.kind == "traceback" and failure.frames:
        frame = failure.frames[-1]
        return shorten(f"Traceback cut short in {frame.function} ({frame.file}:{frame.line})")
    return shorten(first or failure.text)


def _apply(failure: ProgramFailure, found: Classification | None) -> None:
    """The classification fields, and the typed attributes its named groups give."""
    if found is None:
        failure.rule_id = None
        failure.category = "unclassified"
        failure.title = _title(failure)
        failure.hint = GENERIC_HINTS.get(failure.kind, GENERIC_HINTS["fatal_line"])
        failure.follow_on = failure.kind == "child_failed"
    else:
        rule = found.rule
        failure.rule_id = rule.id
        failure.category = rule.category
        failure.title = rule.title
        failure.hint = rule.hint
        failure.follow_on = rule.follow_on or failure.kind == "child_failed"
        for key, value in found.fields.items():
            failure.fields.setdefault(key, value)
    fields = failure.fields
    failure.gpu_node = failure.gpu_node if failure.gpu_node is not None else _int(fields.get("node"))
    failure.pid = failure.pid if failure.pid is not None else _int(fields.get("pid"))
    failure.rank = failure.rank if failure.rank is not None else _int(fields.get("rank"))
    failure.local_rank = failure.local_rank if failure.local_rank is not None else _int(fields.get("local_rank"))
    failure.address = failure.address or fields.get("address")
    failure.host = failure.host or fields.get("host")
    failure.device = failure.device or fields.get("device")
    if failure.rank is not None and not failure.ranks:
        failure.ranks = [failure.rank]


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value, 0) if value.lower().startswith("0x") else int(value)
    except ValueError:
        return None


@dataclass(slots=True)
class _Stream:
    ring: deque[str]
    block: _Block | None = None
    #: The last line of this stream was indented (a traceback's source line?).
    last_indented: bool = False
    #: The last line itself, to rejoin with the rest a terminal folded off it.
    last: ProgramLine | None = None


def _rejoined(head: ProgramLine, rest: ProgramLine) -> ProgramLine:
    """One logical line from a folded one: texts joined, physical lines kept apart by "\n"."""
    return ProgramLine(
        text=head.text + rest.text,
        raw=head.raw + "\n" + rest.raw,
        number=head.number,
        origin=head.origin,
        rank=head.rank,
        local_rank=head.local_rank,
        time=head.time,
        time_source=head.time_source,
    )


@functools.lru_cache(maxsize=64)
def _gate_for(rules: tuple[Rule, ...], thread: int) -> Prefilter:
    """One compiled gate per rule set and thread (a hyperscan scratch serves one thread at
    a time): a daemon following hundreds of logs builds it once, not per file."""
    del thread  # part of the cache key only
    return Prefilter(literal for rule in rules for literal in rule.literals or ())


class FailureAssembler:
    """Feeds lines, returns the failures they complete (see the module docstring)."""

    def __init__(self, rules: Sequence[Rule], *, origin: str = "", context_lines: int = 30) -> None:
        self.rules = [rule for rule in rules if rule.source == "program"]
        self.origin = origin
        self.context_lines = context_lines
        self._context_rules = any(rule.context is not None for rule in self.rules)
        # Most lines contain none of the rules' literals: one multi-literal search
        # (hyperscan where installed) spares the rule-by-rule test on them.
        self._gate: Prefilter | None = None
        if self.rules and all(rule.literals is not None for rule in self.rules):
            self._gate = _gate_for(tuple(self.rules), threading.get_ident())
        self._streams: dict[StreamKey, _Stream] = {}
        self._open: dict[StreamKey, _Stream] = {}
        self._by_local: dict[int, StreamKey] = {}
        self._tick = 0
        self._last_key: StreamKey | None = None
        self._last_raw: str | None = None

    # -- the interface -------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No block is open: the caller may skip lines with its prefilter again."""
        return not self._open

    def feed(self, line: ProgramLine) -> list[ProgramFailure]:
        """One line, read in detail; the failures it completes (usually none)."""
        self._tick += 1
        failures = self._expire()
        key, fold = self._route(line)
        stream = self._stream(key)
        physical = line.raw
        if fold and stream.block is None and stream.last is not None:
            # The folded rest of a line that started nothing: rejoin them and look again.
            line = _rejoined(stream.last, line)
            if stream.ring:
                stream.ring.pop()
            fold = False
        failures.extend(self._feed_stream(key, stream, line, fold))
        self._last_key, self._last_raw = key, physical
        return failures

    def feed_context(self, line: ProgramLine) -> None:
        """A line the caller skipped: only remembered as context of its stream."""
        self._tick += 1
        key, _ = self._route(line)
        self._remember(self._stream(key), line)
        self._last_key, self._last_raw = key, line.raw

    def flush(self) -> list[ProgramFailure]:
        """End of input: every open block is complete."""
        failures: list[ProgramFailure] = []
        for key in list(self._open):
            failures.extend(self._close(key, final=True))
        failures.sort(key=lambda failure: failure.line_number)
        return failures

    # -- streams -------------------------------------------------------------

    def _stream(self, key: StreamKey) -> _Stream:
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= MAX_STREAMS:
                self._forget()
            stream = _Stream(ring=deque(maxlen=self.context_lines))
            self._streams[key] = stream
        return stream

    def _forget(self) -> None:
        """Drop the older half of the streams with nothing open (their context goes with them)."""
        quiet = [key for key in self._streams if key not in self._open and key != self._last_key]
        for key in quiet[: len(quiet) // 2 + 1]:
            del self._streams[key]
        if len(self._by_local) >= MAX_STREAMS:
            self._by_local.clear()

    def _route(self, line: ProgramLine) -> tuple[StreamKey, bool]:
        """The stream a line belongs to, and whether it is the folded rest of the last line."""
        rank, local_rank = line.rank, line.local_rank
        if rank is None and local_rank is None:
            last = self._last_key
            if last is not None and last != _BARE:
                text = line.text.lstrip()
                if last in self._open and (not text or text.startswith(("Exception raised from ", "frame #"))):
                    return last, False
                if _is_fold(self._last_raw, line):
                    # The rest of a prefixed line that a terminal folded (a paste) has no prefix.
                    return last, True
            return _BARE, False
        if rank is None:
            assert local_rank is not None
            key = self._by_local.get(local_rank, (None, local_rank))
        else:
            key = (rank, local_rank)
            if local_rank is not None and self._by_local.get(local_rank) != key:
                self._by_local[local_rank] = key
                self._adopt((None, local_rank), key)
        return key, False

    def _adopt(self, old: StreamKey, new: StreamKey) -> None:
        """`[default0]:` lines seen before the first `[default0]:[rank0]:` one are the same worker's."""
        if new in self._streams or old not in self._streams:
            return
        self._streams[new] = self._streams.pop(old)
        if old in self._open:
            self._open[new] = self._open.pop(old)
        if self._last_key == old:
            self._last_key = new

    def _feed_stream(self, key: StreamKey, stream: _Stream, line: ProgramLine, fold: bool) -> list[ProgramFailure]:
        failures: list[ProgramFailure] = []
        block = stream.block
        if block is not None:
            verdict = block.offer(line, fold)
            if verdict is not _Verdict.END:
                block.last_tick = self._tick
                self._remember(stream, line)
                if verdict is _Verdict.TAKE_END:
                    failures.extend(self._close(key, final=False))
                return failures
            failures.extend(self._close(key, final=False))
        failures.extend(self._start(key, stream, line))
        self._remember(stream, line)
        return failures

    @staticmethod
    def _remember(stream: _Stream, line: ProgramLine) -> None:
        stream.ring.append(line.text)
        stream.last_indented = line.text[:1].isspace() and bool(line.text.strip())
        stream.last = line

    def _open_block(self, key: StreamKey, stream: _Stream, block: _Block) -> None:
        stream.block = block
        self._open[key] = stream

    def _close(self, key: StreamKey, *, final: bool) -> list[ProgramFailure]:
        stream = self._open.pop(key, None)
        if stream is None or stream.block is None:
            return []
        block, stream.block = stream.block, None
        failure = block.build(final)
        if failure is None:
            return []
        return [self._classify(failure)]

    def _expire(self) -> list[ProgramFailure]:
        if not self._open:
            return []
        failures: list[ProgramFailure] = []
        for key, stream in list(self._open.items()):
            block = stream.block
            if block is not None and self._tick - block.last_tick > block.stale_after():
                failures.extend(self._close(key, final=True))
        failures.sort(key=lambda failure: failure.line_number)
        return failures

    # -- what starts a failure -----------------------------------------------

    def _start(self, key: StreamKey, stream: _Stream, line: ProgramLine) -> list[ProgramFailure]:
        """Open a block for `line`, or return the one-line failure it is, or nothing."""
        text = line.text
        tick = self._tick
        at = text.find(HEADER)
        if at >= 0:
            block: _Block
            if text[:at].rstrip().endswith("+ Exception Group"):
                block = _Group(line, text.strip(), list(stream.ring), tick)
            else:
                block = _Traceback(line, text[at:], list(stream.ring), tick, headless=False, names=self._names)
            self._open_block(key, stream, block)
            return []
        if _is_frame(text) is not None:
            block = _Traceback(line, text, list(stream.ring), tick, headless=True, names=self._names)
            self._open_block(key, stream, block)
            return []
        stripped = text.strip()
        if not stripped:
            return []
        if stripped.startswith("terminate called") and (_CPP_THROW.search(text) or _CPP_TERMINATE.search(text)):
            self._open_block(key, stream, _Cpp(line, text, list(stream.ring), tick))
            return []
        failed = _TORCHRUN_FAILED.search(text) if "failed (exitcode" in text else None
        if failed is not None:
            return [self._torchrun_failed(line, failed, list(stream.ring))]
        if stripped.startswith("Fatal Python error: "):
            self._open_block(key, stream, _Fatal(line, text, list(stream.ring), tick, faulthandler=True))
            return []
        standalone = _standalone(text)
        if standalone is not None:
            if stream.last_indented or standalone[0].endswith("ChildFailedError"):
                # The source line above it: the end of a traceback whose head is not here.
                block = _Traceback(line, text, list(stream.ring), tick, headless=True, names=self._names)
            else:
                block = _Fatal(line, text, list(stream.ring), tick, exception_type=standalone[0], message=standalone[1])
            self._open_block(key, stream, block)
            return []
        if self._names_in(text, stream):
            self._open_block(key, stream, _Fatal(line, text, list(stream.ring), tick))
        return []

    def _names(self, text: str) -> bool:
        """Does a rule name this line on its own?"""
        if not self.rules:
            return False
        if self._gate is not None and self._gate.search(text.encode("utf-8", "replace")) is None:
            return False
        return best_rule(self.rules, text) is not None

    def _names_in(self, text: str, stream: _Stream) -> bool:
        """Does a rule name this line, read after the lines before it in its stream?"""
        if not self.rules:
            return False
        if self._gate is not None and self._gate.search(text.encode("utf-8", "replace")) is None:
            return False
        return best_rule(self.rules, text, self._context(stream)) is not None

    def _context(self, stream: _Stream) -> str:
        return "\n".join(stream.ring) if self._context_rules else ""

    def _torchrun_failed(self, line: ProgramLine, match: re.Match[str], context: list[str]) -> ProgramFailure:
        failure = ProgramFailure(
            kind="child_failed",
            lines=[line.raw],
            text=line.text,
            origin=line.origin,
            line_number=line.number,
            message=line.text[match.start() :],
            context=context,
            time=line.time,
            time_source=line.time_source,
            rank=line.rank,
            local_rank=int(match["local_rank"]),
            pid=int(match["pid"]),
        )
        failure.fields.update(
            exitcode=match["exitcode"], local_rank=match["local_rank"], pid=match["pid"], binary=match["binary"]
        )
        exitcode = int(match["exitcode"])
        if exitcode < 0:
            failure.fields["signal"] = _signal_name(-exitcode)
        return self._classify(failure)

    def _classify(self, failure: ProgramFailure) -> ProgramFailure:
        if not failure.origin:
            failure.origin = self.origin
        found = best_rule(self.rules, failure.text, "\n".join(failure.context)) if self.rules else None
        _apply(failure, found)
        return failure


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# -- helpers the readers share -----------------------------------------------


def make_line(
    raw: str,
    number: int,
    *,
    origin: str = "",
    reference_year: int | None = None,
    last_time: float | None = None,
) -> ProgramLine:
    """A ProgramLine from a raw line: prefix split, own stamp or the last one seen."""
    prefix, text = split_prefix(raw)
    stamp = parse_stamp(raw, reference_year=reference_year)
    time: float | None
    source: TimeSource
    if stamp is not None:
        time, source = stamp, "stamp"
    elif last_time is not None:
        time, source = last_time, "last_stamp"
    else:
        time, source = None, "none"
    return ProgramLine(
        text=text,
        raw=raw,
        number=number,
        origin=origin,
        rank=prefix.rank,
        local_rank=prefix.local_rank,
        time=time,
        time_source=source,
    )


def assemble_text(
    rules: Sequence[Rule], text: str, *, origin: str = "", context_lines: int = 30, reference_year: int | None = None
) -> list[ProgramFailure]:
    """Every failure of a whole log held in memory (tests, small inputs)."""
    assembler = FailureAssembler(rules, origin=origin, context_lines=context_lines)
    failures: list[ProgramFailure] = []
    last: float | None = None
    for number, raw in enumerate(split_lines(text), start=1):
        line = make_line(raw, number, origin=origin, reference_year=reference_year, last_time=last)
        if line.time_source == "stamp":
            last = line.time
        failures.extend(assembler.feed(line))
    failures.extend(assembler.flush())
    return failures


_EOL_TEXT = re.compile(r"\r\n|[\r\n]")
_EOL = re.compile(rb"\r\n|[\r\n]")


def split_lines(text: str) -> list[str]:
    """Lines of `text` split on \\n, \\r\\n and a lone \\r (progress bars), no trailing empty line."""
    lines = _EOL_TEXT.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


class LineSplitter:
    """Bytes in any chunks, lines out: \\n, \\r\\n and a lone \\r end a line.

    The partial last line waits for the next chunk (a `\\r` at a chunk's end waits
    to see whether `\\n` follows). A line longer than `max_line` bytes keeps its
    first `max_line` bytes; the rest is dropped and counted in `truncated`, so
    memory stays bounded whatever the input. Bytes are decoded per line, with
    errors replaced, so a multi-byte character split across chunks survives.
    """

    def __init__(self, max_line: int = 64 * 1024) -> None:
        self.max_line = max_line
        self.truncated = 0
        self._part = bytearray()
        self._over = False
        self._cr = False

    def feed(self, data: bytes) -> list[str]:
        if not data:
            return []
        lines: list[str] = []
        start = 0
        if self._cr:
            self._cr = False
            if data[:1] == b"\n":
                start = 1
        end = len(data)
        for match in _EOL.finditer(data, start):
            self._append(data, start, match.start())
            lines.append(self._take())
            start = match.end()
            if start == end and data[end - 1 : end] == b"\r":
                self._cr = True  # a \n may open the next chunk
        self._append(data, start, end)
        return lines

    def flush(self) -> list[str]:
        """The last line when the input did not end with a newline."""
        if not self._part and not self._over:
            return []
        return [self._take()]

    def _append(self, data: bytes, start: int, stop: int) -> None:
        if stop <= start or self._over:
            return
        room = self.max_line - len(self._part)
        if stop - start > room:
            self._part += data[start : start + room]
            self._over = True
        else:
            self._part += data[start:stop]

    def _take(self) -> str:
        line = self._part.decode("utf-8", "replace")
        if self._over:
            self.truncated += 1
        self._part = bytearray()
        self._over = False
        return line
