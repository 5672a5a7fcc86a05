"""The program-log side: launcher prefixes, line stamps, and failure assembly.

Pure pieces with no I/O; the log scanner reads bytes and calls them.
"""

from __future__ import annotations

from .assembler import FailureAssembler, LineSplitter, assemble_text, make_line, split_lines
from .prefix import Prefix, split_prefix
from .timestamps import parse_stamp

__all__ = [
    "FailureAssembler",
    "LineSplitter",
    "Prefix",
    "assemble_text",
    "make_line",
    "parse_stamp",
    "split_lines",
    "split_prefix",
]
