"""The set of tools a session offers: lookup by name or alias, suggestions, subsets, API schemas."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from typing import Any

from agentfsm.tools.base import Tool


class ToolRegistry:
    """Tools in a fixed order (the order the model sees them in). Names and aliases are unique."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: list[Tool] = []
        self._by_name: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    def register(self, tool: Tool) -> None:
        """Add ``tool``; a name or alias already taken is a ValueError (two tools answering to one
        name would make the model's calls ambiguous)."""
        if not tool.name:
            raise ValueError(f"tool {tool!r} has no name")
        for key in (tool.name, *tool.aliases):
            if key in self._by_name:
                raise ValueError(f"tool name {key!r} is already taken by {self._by_name[key].name}")
        self._tools.append(tool)
        for key in (tool.name, *tool.aliases):
            self._by_name[key] = tool

    def get(self, name: str) -> Tool | None:
        """The tool called ``name`` or aliased so; None when there is none."""
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> Tool:
        tool = self.get(name)
        if tool is None:
            raise KeyError(name)
        return tool

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._by_name

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def tools(self) -> list[Tool]:
        return list(self._tools)

    def names(self) -> list[str]:
        return [t.name for t in self._tools]

    def closest(self, name: str) -> str | None:
        """The canonical name nearest to ``name`` (aliases count), for "Did you mean X?"."""
        canonical: dict[str, str] = {}
        for key, tool in self._by_name.items():
            canonical.setdefault(key, tool.name)
            canonical.setdefault(key.lower(), tool.name)
        if name.lower() in canonical:
            return canonical[name.lower()]
        hit = difflib.get_close_matches(name, list(canonical), n=1, cutoff=0.6)
        if not hit:
            hit = difflib.get_close_matches(name.lower(), list(canonical), n=1, cutoff=0.6)
        return canonical[hit[0]] if hit else None

    def _resolve_all(self, names: Iterable[str]) -> list[Tool]:
        wanted: list[Tool] = []
        unknown: list[str] = []
        for n in names:
            n = n.strip()
            if not n:
                continue
            tool = self.get(n)
            if tool is None:
                unknown.append(n)
            elif tool not in wanted:
                wanted.append(tool)
        if unknown:
            hints = []
            for n in unknown:
                guess = self.closest(n)
                hints.append(f"{n} (did you mean {guess}?)" if guess else n)
            raise ValueError(f"Unknown tool{'s' if len(unknown) > 1 else ''}: {', '.join(hints)}. "
                             f"Available tools: {', '.join(self.names())}")
        return wanted

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """Only the named tools (names or aliases; blanks ignored), in this registry's order.
        An unknown name is a ValueError that lists the available tools."""
        keep = self._resolve_all(names)
        return ToolRegistry(t for t in self._tools if t in keep)

    def without(self, names: Iterable[str]) -> ToolRegistry:
        """All tools but the named ones; names not present are ignored (a deny rule may name a tool
        this session does not have)."""
        drop = {self._by_name[n].name for n in names if n in self._by_name}
        return ToolRegistry(t for t in self._tools if t.name not in drop)

    def api_schemas(self) -> list[dict[str, Any]]:
        """The request's ``tools`` list."""
        return [t.api_schema() for t in self._tools]

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"
