"""Fingerprints: the same failure seen again gets the same one.

Built from what stays the same between two occurrences of a failure (exception
type, the message with numbers, addresses and sizes taken out, the frames of the
application's own code without line numbers) and nothing that changes (pids,
ranks, times, addresses, line numbers, library paths).
"""

from __future__ import annotations

import hashlib

import regex

from .model import Frame, KernelEvent, ProgramFailure

_HEX = regex.compile(r"0x[0-9a-fA-F]+")
_PCI = regex.compile(r"\b[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]\b")
_UUID = regex.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_PATH = regex.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.+@~-]+)+[\\/]([\w.+@-]+)")
_NUMBER = regex.compile(r"\d+(?:\.\d+)?")
_TMPNAME = regex.compile(r"\b(nccl|pip-req-build|tmp)[-_][A-Za-z0-9]+")
_SPACE = regex.compile(r"\s+")
_LIBRARY_DIRS = ("site-packages", "dist-packages", "/lib/python", "\\lib\\", "<frozen")


def normalise_message(message: str) -> str:
    """The message with what varies between occurrences replaced by placeholders."""
    text = _UUID.sub("<uuid>", message)
    text = _PCI.sub("<pci>", text)
    text = _HEX.sub("<hex>", text)
    text = _PATH.sub(r"\1", text)
    text = _TMPNAME.sub(r"\1-<tmp>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()[:300]


def is_app_frame(frame: Frame) -> bool:
    """A frame of the application's own code, not of an installed library."""
    return not any(marker in frame.file for marker in _LIBRARY_DIRS)


def _frame_key(frame: Frame) -> str:
    name = frame.file.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{name}:{frame.function}"


def digest(*parts: object, length: int = 16) -> str:
    """A short stable hash of the parts (fingerprints, incident ids, evidence keys)."""
    return hashlib.sha256("\x1f".join(str(part) for part in parts).encode("utf-8")).hexdigest()[:length]


def failure_signature(failure: ProgramFailure) -> list[str]:
    frames = [_frame_key(frame) for frame in failure.frames if is_app_frame(frame)]
    message = failure.message or (failure.text.splitlines()[-1] if failure.text else "")
    return [
        failure.category,
        failure.exception_type or failure.kind,
        normalise_message(message),
        *frames[-8:],
    ]


def failure_fingerprint(failure: ProgramFailure) -> str:
    return digest(*failure_signature(failure))


def event_signature(event: KernelEvent) -> list[str]:
    return [event.category, event.rule_id, *sorted(set(event.detail_rules)), event.process or ""]


def event_fingerprint(event: KernelEvent) -> str:
    return digest(*event_signature(event))


def incident_fingerprint(category: str, naming_failure: ProgramFailure | None, naming_event: KernelEvent | None) -> str:
    """One per failure: the category and what named it."""
    parts = [category]
    if naming_failure is not None:
        parts += failure_signature(naming_failure)
    if naming_event is not None:
        parts += event_signature(naming_event)
    return digest(*parts)
