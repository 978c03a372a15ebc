"""Mutation operators for the core that cosmic-ray's own set lacks: the wrong rule, not the wrong token.

cosmic-ray mutates operators, numbers, booleans and decorators. The mistakes that matter in a routes
table and its effects are of another kind, so ``bench/mutation.py`` registers these next to them (in
the ``agentfsm`` provider; each is one meaningful change):

* ``ReplaceEnumMember`` — ``T.COMPLETED`` → the next member (a wrong terminal reason, a wrong phase);
* ``RemoveDictEntry`` — one ``key: value`` of a dict display dropped (a skipped counter reset, a
  missing row of a table);
* ``RemoveKeywordArgument`` — one ``name=value`` of a call dropped (a skipped field in
  ``attrs.evolve``, a validator gone);
* ``DropOperand`` — ``a & b`` → ``a`` / ``b`` (a guard removed from a conjunction);
* ``NegateBoolReturn`` — ``return x`` → ``return not (x)`` in a function declared ``-> bool``;
* ``ConditionFalse`` — ``if c:`` / ``elif c:`` → ``False`` (a check removed);
* ``RemoveCollectionElement`` — one element of a literal tuple/list/set of names, strings or
  attributes, or one variadic argument of a listed call (a reason dropped from an edge, a stop
  reason no longer recognised);
* ``SwapAdjacentRoutes`` — two neighbouring ``_route(...)`` rows of the same phase and event swapped
  (the first guard that holds fires, so order is behaviour);
* ``ReplaceComparedString`` — a string compared with ``==``/``!=``/``in`` or returned gets changed
  (a misspelt stop reason, edge or kind).

Operators work on parso trees, like cosmic-ray's: ``mutation_positions`` says where a node can be
mutated, ``mutate`` returns the replacement node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import parso
from cosmic_ray.operators.operator import Example, Operator
from parso.python import tree as pt

Pos = tuple[tuple[int, int], tuple[int, int]]


def _span(node: Any) -> Pos:
    return node.start_pos, node.end_pos


def _is_op(node: Any, value: str) -> bool:
    return node.type == "operator" and node.value == value


def _elements(children: Sequence[Any]) -> list[tuple[int, int]]:
    """(start, end) child index ranges of the comma-separated elements of a display or argument list."""
    out, start = [], 0
    for i, child in enumerate(children):
        if _is_op(child, ","):
            if i > start:
                out.append((start, i))
            start = i + 1
    if start < len(children):
        out.append((start, len(children)))
    return out


def _without(children: list[Any], start: int, end: int) -> list[Any]:
    """``children`` without the element ``[start, end)`` and one comma next to it; the first leaf of
    whatever moves to the front keeps the removed element's prefix (indentation, comments)."""
    prefix = children[start].get_first_leaf().prefix
    if end < len(children) and _is_op(children[end], ","):
        out = children[:start] + children[end + 1:]
    elif start > 0 and _is_op(children[start - 1], ","):
        out = children[:start - 1] + children[end:]
    else:
        out = children[:start] + children[end:]
    if start == 0 and out:
        out[0].get_first_leaf().prefix = prefix
    return out


def _callee(trailer: Any) -> str | None:
    """The dotted name called by the call whose argument trailer is ``trailer`` (``a.b(...)`` → ``a.b``)."""
    parent = trailer.parent
    if parent is None or parent.type not in ("atom_expr", "power"):
        return None
    idx = parent.children.index(trailer)
    parts = []
    for child in parent.children[:idx]:
        if child.type == "name":
            parts.append(child.value)
        elif child.type == "trailer" and _is_op(child.children[0], ".") and len(child.children) == 2:
            parts.append(child.children[1].value)
        else:
            return None
    return ".".join(parts)


def _kind(node: Any) -> str | None:
    """What sort of constant ``node`` is: ``str``, ``num``, ``const`` (an UPPER_CASE name or a keyword
    constant), ``attr:<base>`` (``T.X``); None for anything else (a variable, a call, an f-string)."""
    if node.type == "number":
        return "num"
    if node.type == "string":
        return "str"
    if node.type == "keyword" and node.value in ("None", "True", "False"):
        return "const"
    if node.type == "name":
        return "const" if node.value.isupper() else None
    if node.type in ("atom_expr", "power"):
        first, *rest = node.children
        if first.type == "name" and rest and all(
                t.type == "trailer" and _is_op(t.children[0], ".") and len(t.children) == 2 for t in rest):
            return f"attr:{first.value}"
    return None


class _Op(Operator):
    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return ()


# --- one enum member for another -------------------------------------------------------------------


def enum_member_replacer(enums: Mapping[str, Sequence[str]]) -> type[Operator]:
    """``enums``: alias → the members in declaration order (``{"T": [...], "Phase": [...]}``)."""

    class ReplaceEnumMember(_Op):
        """``T.COMPLETED`` → the member declared after it (cyclically): one wrong member per use."""

        def _target(self, node: Any) -> Any | None:
            if node.type not in ("atom_expr", "power") or len(node.children) < 2:
                return None
            head, trailer = node.children[0], node.children[1]
            if head.type != "name" or head.value not in enums:
                return None
            if trailer.type != "trailer" or not _is_op(trailer.children[0], ".") or len(trailer.children) != 2:
                return None
            return trailer.children[1] if trailer.children[1].value in enums[head.value] else None

        def mutation_positions(self, node: Any) -> list[Pos]:
            leaf = self._target(node)
            return [_span(leaf)] if leaf is not None else []

        def mutate(self, node: Any, index: int) -> Any:
            leaf = self._target(node)
            members = list(enums[node.children[0].value])
            leaf.value = members[(members.index(leaf.value) + 1) % len(members)]
            return node

        @classmethod
        def examples(cls) -> tuple[Example, ...]:
            alias, members = next(iter(enums.items()))
            return (Example(f"x = {alias}.{members[0]}", f"x = {alias}.{members[1 % len(members)]}"),)

    return ReplaceEnumMember


# --- drop one entry, argument, operand or element ------------------------------------------------------


class RemoveDictEntry(_Op):
    """One ``key: value`` of a dict display dropped."""

    @staticmethod
    def _entries(node: Any) -> list[tuple[int, int]]:
        if node.type != "atom" or not _is_op(node.children[0], "{") or len(node.children) != 3:
            return []
        body = node.children[1]
        if body.type != "dictorsetmaker" or not any(_is_op(c, ":") for c in body.children):
            return []
        if any(c.type in ("comp_for", "sync_comp_for") for c in body.children):
            return []
        return [(s, e) for s, e in _elements(body.children) if not _is_op(body.children[s], "**")]

    def mutation_positions(self, node: Any) -> list[Pos]:
        # a list, not a generator: cosmic-ray mutates the node while it iterates the positions
        body = node.children[1] if node.type == "atom" and len(node.children) == 3 else None
        return [(body.children[s].start_pos, body.children[e - 1].end_pos) for s, e in self._entries(node)]

    def mutate(self, node: Any, index: int) -> Any:
        s, e = self._entries(node)[index]
        body = node.children[1]
        rest = _without(list(body.children), s, e)
        if rest:
            body.children = rest
            for child in rest:
                child.parent = body
        else:
            node.children = [node.children[0], node.children[2]]
        return node

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example('d = {"a": 1, "b": 2}', 'd = {"b": 2}'),
                Example('d = {"a": 1, "b": 2}', 'd = {"a": 1}', occurrence=1),
                Example('d = {"a": 1}', "d = {}"))


class RemoveKeywordArgument(_Op):
    """One ``name=value`` argument of a call dropped."""

    @staticmethod
    def _keywords(node: Any) -> tuple[Any, list[tuple[int, int]]]:
        """(the node whose children hold the arguments, ranges of the keyword arguments in it)."""
        if node.type == "arglist":
            holder = node
        elif node.type == "trailer" and _is_op(node.children[0], "(") and len(node.children) == 3 \
                and node.children[1].type == "argument":
            holder = node
        else:
            return None, []
        out = []
        for s, e in _elements(holder.children) if holder is node and node.type == "arglist" else [(1, 2)]:
            arg = holder.children[s]
            if arg.type == "argument" and len(arg.children) == 3 and _is_op(arg.children[1], "="):
                out.append((s, e))
        return holder, out

    def mutation_positions(self, node: Any) -> list[Pos]:
        holder, ranges = self._keywords(node)
        return [_span(holder.children[s]) for s, _e in ranges]

    def mutate(self, node: Any, index: int) -> Any:
        _holder, ranges = self._keywords(node)
        s, e = ranges[index]
        if node.type == "trailer":
            node.children = [node.children[0], node.children[2]]
            return node
        rest = _without(list(node.children), s, e)
        node.children = rest
        return node

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example("f(a, k=1)", "f(a)"), Example("f(k=1)", "f()"),
                Example("f(j=0, k=1)", "f(k=1)"), Example("f(j=0, k=1)", "f(j=0)", occurrence=1))


class DropOperand(_Op):
    """``a & b & c`` → the same without one operand (a guard or a set filter removed)."""

    def mutation_positions(self, node: Any) -> list[Pos]:
        if node.type != "and_expr":
            return []
        return [_span(node.children[s]) for s, _e in _operands(node.children)]

    def mutate(self, node: Any, index: int) -> Any:
        s, e = _operands(node.children)[index]
        prefix = node.get_first_leaf().prefix
        children = list(node.children)
        if e < len(children):  # drop the operand and the `&` after it
            rest = children[:s] + children[e + 1:]
        else:
            rest = children[:s - 1]
        if len(rest) == 1:
            rest[0].get_first_leaf().prefix = prefix
            return rest[0]
        rest[0].get_first_leaf().prefix = prefix
        node.children = rest
        return node

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example("x = a & b", "x = b"), Example("x = a & b", "x = a", occurrence=1),
                Example("x = a & b & c", "x = a & c", occurrence=1))


def _operands(children: Sequence[Any]) -> list[tuple[int, int]]:
    return [(i, i + 1) for i in range(0, len(children), 2)]


def collection_element_remover(variadic: Mapping[str, int]) -> type[Operator]:
    """``variadic``: callee → the index of its first variadic positional argument."""

    class RemoveCollectionElement(_Op):
        """One element of a literal tuple, list or set of like constants (strings, numbers, UPPER_CASE
        names, ``T.X``) dropped; or one variadic argument of a listed call (``stop_reason_is("a", "b")``)."""

        @staticmethod
        def _holder(node: Any) -> tuple[Any, list[tuple[int, int]]]:
            if node.type == "atom" and len(node.children) == 3 and node.children[0].type == "operator" \
                    and node.children[0].value in "([{":
                body = node.children[1]
                if body.type not in ("testlist_comp", "dictorsetmaker"):
                    return None, []
                if any(_is_op(c, ":") or c.type in ("comp_for", "sync_comp_for") for c in body.children):
                    return None, []  # a dict or a comprehension
                ranges = _elements(body.children)
                # a collection of like constants (names of phases, reasons, tool names); a pair such as
                # (phase, event) is a record, and dropping half of it is no plausible slip
                kinds = {_kind(body.children[s]) if e - s == 1 else None for s, e in ranges}
                if len(ranges) < 2 or len(kinds) != 1 or None in kinds:
                    return None, []
                if _in_subscript(node):
                    return None, []  # Callable[[A, B], C] and friends: types, not values
                return body, ranges
            if node.type == "trailer" and _is_op(node.children[0], "("):
                first = variadic.get(_callee(node) or "")
                if first is None or len(node.children) != 3:
                    return None, []
                args = node.children[1]
                if args.type != "arglist":
                    return (node, [(1, 2)]) if first == 0 and args.type != "argument" else (None, [])
                ranges = [r for r in _elements(args.children) if args.children[r[0]].type != "argument"]
                return args, ranges[first:]
            return None, []

        def mutation_positions(self, node: Any) -> list[Pos]:
            holder, ranges = self._holder(node)
            return [_span(holder.children[s]) for s, _e in ranges]

        def mutate(self, node: Any, index: int) -> Any:
            holder, ranges = self._holder(node)
            s, e = ranges[index]
            if holder is node:  # a call's only argument
                node.children = [node.children[0], node.children[2]]
                return node
            rest = _without(list(holder.children), s, e)
            is_tuple = node.type == "atom" and node.children[0].value == "("
            if is_tuple and len(_elements(rest)) == 1 and not any(_is_op(c, ",") for c in rest):
                rest.append(pt.Operator(",", rest[-1].end_pos))  # ("a",) stays a tuple
            holder.children = rest
            for child in rest:
                child.parent = holder
            return node

        @classmethod
        def examples(cls) -> tuple[Example, ...]:
            return (Example('x in ("a", "b")', 'x in ("b",)'), Example("s = {A, B, C}", "s = {A, C}", occurrence=1))

    return RemoveCollectionElement


def _in_subscript(node: Any) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type == "trailer" and _is_op(parent.children[0], "["):
            return True
        if parent.type in ("funcdef", "classdef", "file_input", "simple_stmt"):
            return False
        parent = parent.parent
    return False


# --- negate, remove a check --------------------------------------------------------------------------


class NegateBoolReturn(_Op):
    """``return x`` → ``return not (x)`` in a function declared ``-> bool`` (a guard inverted)."""

    @staticmethod
    def _returns_bool(node: Any) -> bool:
        parent = node.parent
        while parent is not None and parent.type not in ("funcdef", "lambdef", "classdef"):
            parent = parent.parent
        if parent is None or parent.type != "funcdef":
            return False
        annotation = parent.annotation
        return annotation is not None and annotation.get_code().strip() == "bool"

    def mutation_positions(self, node: Any) -> list[Pos]:
        if node.type == "return_stmt" and len(node.children) == 2 and self._returns_bool(node):
            value = node.children[1]
            if not (value.type == "keyword" and value.value in ("True", "False")):
                return [_span(value)]
        return []

    def mutate(self, node: Any, index: int) -> Any:
        value = node.children[1]
        node.children[1] = parso.parse(f" not ({value.get_code(include_prefix=False)})")
        return node

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example("def f() -> bool:\n    return a and b\n", "def f() -> bool:\n    return not (a and b)\n"),)


class ConditionFalse(_Op):
    """The condition of an ``if`` or ``elif`` → ``False``: the check is gone."""

    @staticmethod
    def _conditions(node: Any) -> list[int]:
        if not isinstance(node, pt.IfStmt):
            return []
        return [i + 1 for i, c in enumerate(node.children) if c.type == "keyword" and c.value in ("if", "elif")]

    def mutation_positions(self, node: Any) -> list[Pos]:
        return [_span(node.children[i]) for i in self._conditions(node)]

    def mutate(self, node: Any, index: int) -> Any:
        i = self._conditions(node)[index]
        node.children[i] = parso.parse(" False")
        return node

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example("if a:\n    x()\nelif b:\n    y()\n", "if False:\n    x()\nelif b:\n    y()\n"),
                Example("if a:\n    x()\nelif b:\n    y()\n", "if a:\n    x()\nelif False:\n    y()\n", occurrence=1))


# --- reorder routes, misspell a compared string --------------------------------------------------------


def route_swapper(callees: Sequence[str]) -> type[Operator]:
    """``callees``: the row constructors of an ordered table (``_route``)."""

    class SwapAdjacentRoutes(_Op):
        """Two neighbouring rows of the same source and event swapped (their guards are then tried in
        the other order); rows of other keys are independent, so swapping those is no mutant."""

        @staticmethod
        def _pairs(node: Any) -> list[tuple[Any, Any]]:
            if node.type != "atom" or len(node.children) != 3 or node.children[1].type != "testlist_comp":
                return []
            body = node.children[1]
            rows = [body.children[s] for s, e in _elements(body.children) if e - s == 1]
            keys = [_row_key(r, callees) for r in rows]
            return [(rows[i], rows[i + 1]) for i in range(len(rows) - 1)
                    if keys[i] is not None and keys[i + 1] is not None and keys[i][1] == keys[i + 1][1]
                    and keys[i][0] & keys[i + 1][0]]

        def mutation_positions(self, node: Any) -> list[Pos]:
            return [(a.start_pos, b.end_pos) for a, b in self._pairs(node)]

        def mutate(self, node: Any, index: int) -> Any:
            a, b = self._pairs(node)[index]
            body = node.children[1]
            i, j = body.children.index(a), body.children.index(b)
            pa, pb = a.get_first_leaf().prefix, b.get_first_leaf().prefix
            body.children[i], body.children[j] = b, a
            b.get_first_leaf().prefix, a.get_first_leaf().prefix = pa, pb
            return node

        @classmethod
        def examples(cls) -> tuple[Example, ...]:
            name = callees[0]
            return (Example(f"R = ({name}(A, E, g, 1), {name}(A, E, h, 2))",
                            f"R = ({name}(A, E, h, 2), {name}(A, E, g, 1))"),)

    return SwapAdjacentRoutes


def _row_key(row: Any, callees: Sequence[str]) -> tuple[frozenset[str], str] | None:
    """(sources, event) of a ``_route(source, event, ...)`` row, as code; rows whose events are the same
    and whose sources overlap compete, in order."""
    if row.type not in ("atom_expr", "power") or len(row.children) != 2:
        return None
    name, trailer = row.children
    if name.type != "name" or name.value not in callees or trailer.type != "trailer":
        return None
    args = trailer.children[1] if len(trailer.children) == 3 else None
    if args is None or args.type != "arglist":
        return None
    positional = [args.children[s] for s, e in _elements(args.children)]
    if len(positional) < 2:
        return None
    sources = frozenset(p.strip() for p in positional[0].get_code().strip().strip("()").split(",") if p.strip())
    return sources, positional[1].get_code().strip()


def _plain_string(node: Any) -> bool:
    return node.type == "string" and node.value[:1] in "\"'" and len(node.value) >= 2


class ReplaceComparedString(_Op):
    """A string operand of a comparison, or a returned string, gets ``XX`` in front: the spelling
    the code tests for (a stop reason, an edge, a kind) no longer matches anything."""

    @staticmethod
    def _strings(node: Any) -> list[Any]:
        if node.type == "comparison":
            return [c for c in node.children[0::2] if _plain_string(c)]
        if node.type == "return_stmt" and len(node.children) == 2 and _plain_string(node.children[1]):
            return [node.children[1]]
        return []

    def mutation_positions(self, node: Any) -> list[Pos]:
        return [_span(leaf) for leaf in self._strings(node)]

    def mutate(self, node: Any, index: int) -> Any:
        leaf = self._strings(node)[index]
        quote = leaf.value[0]
        leaf.value = f"{quote}XX{leaf.value[1:]}"
        return node

    @classmethod
    def examples(cls) -> tuple[Example, ...]:
        return (Example('x == "a"', 'x == "XXa"'),
                Example("def f():\n    return 'a'\n", "def f():\n    return 'XXa'\n"))


def provider(*, enums: Mapping[str, Sequence[str]], variadic: Mapping[str, int],
             ordered_rows: Sequence[str]) -> dict[str, type[Operator]]:
    """The ``agentfsm`` operator provider: name → operator class (cosmic-ray's provider protocol is a
    mapping that iterates its names)."""
    ops: list[type[Operator]] = [
        enum_member_replacer(enums), RemoveDictEntry, RemoveKeywordArgument, DropOperand, NegateBoolReturn,
        ConditionFalse, collection_element_remover(variadic), route_swapper(ordered_rows), ReplaceComparedString,
    ]
    return {op.__name__: op for op in ops}
