"""The label contract of ../shared/TAXONOMY.md: levels, categories and their order.

Every other module names categories through this one, so a slug typo is caught
when a pattern file is loaded rather than when an incident is labelled.
"""

from __future__ import annotations

from typing import Literal

Level = Literal["driver", "code"]

#: Driver-level categories, in priority order: the first present names an incident.
DRIVER_CATEGORIES: tuple[str, ...] = (
    "gpu_lost",
    "ras_error",
    "gpu_reset",
    "gpu_hang",
    "vm_page_fault",
    "link_error",
    "firmware_error",
)

#: Code-level categories, in the order TAXONOMY.md lists them.
CODE_CATEGORIES: tuple[str, ...] = (
    "oom",
    "missing_op",
    "missing_backward",
    "dtype_config",
    "wrong_arch",
    "nan_loss",
    "flash_attn",
    "quantization",
    "device_unavailable",
    "collective_failure",
    "illegal_memory_access",
    "device_assert",
    "import_error",
    "build_error",
    "unclassified",
)

CATEGORIES: tuple[str, ...] = DRIVER_CATEGORIES + CODE_CATEGORIES

#: Code-level categories that are symptoms: a driver-level kernel fault in their
#: window explains them (the fault is the cause, the symptom follows).
SYMPTOM_CATEGORIES: frozenset[str] = frozenset(
    {"illegal_memory_access", "collective_failure", "unclassified", "device_assert"}
)

_RANK = {category: index for index, category in enumerate(CATEGORIES)}


def level_of(category: str) -> Level:
    """The level a category implies."""
    if category in DRIVER_CATEGORIES:
        return "driver"
    if category in CODE_CATEGORIES:
        return "code"
    raise ValueError(f"unknown category {category!r}")


def is_category(name: str) -> bool:
    return name in _RANK


def category_rank(category: str) -> int:
    """Lower is more important: driver categories first, then code in table order."""
    return _RANK[category]


def leading_category(categories: list[str] | set[str] | tuple[str, ...]) -> str:
    """The category that names a set of evidence, by the priority order above."""
    if not categories:
        raise ValueError("no categories")
    return min(categories, key=category_rank)
