"""The permission modes: the one list the session options, the permission policy and the hooks share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

# The permission modes (docs/behaviour.md §5); `manual` is another name for `default`.
PermissionMode = Literal["default", "acceptEdits", "plan", "bypassPermissions", "dontAsk"]
PERMISSION_MODES: tuple[str, ...] = ("default", "acceptEdits", "plan", "bypassPermissions", "dontAsk")
MODE_ALIASES: Mapping[str, str] = {"manual": "default"}


def normalize_mode(mode: str | None) -> str:
    """``None`` → ``default``; ``manual`` is an alias of ``default``; anything unknown raises."""
    if mode is None:
        return "default"
    mode = MODE_ALIASES.get(mode, mode)
    if mode not in PERMISSION_MODES:
        raise ValueError(f"unknown permission mode {mode!r}; expected one of: "
                         f"{', '.join(PERMISSION_MODES)} (or 'manual', an alias of 'default')")
    return mode
