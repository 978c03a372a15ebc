"""Cost of a response from its usage and the per-model price table (``fsm/data/prices.json``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

import attrs


@attrs.frozen
class Price:
    input: float
    output: float
    cache_write: float
    cache_read: float


@cache
def price_table() -> Mapping[str, Price]:
    raw = json.loads(resources.files("fsm").joinpath("data/prices.json").read_text())
    return {k: Price(**v) for k, v in raw.items() if not k.startswith("_")}


def price_for(model: str) -> Price:
    table = price_table()
    matches = [k for k in table if k != "default" and model.startswith(k)]
    return table[max(matches, key=len)] if matches else table["default"]


def cost_usd(model: str, usage: Mapping[str, Any]) -> float:
    p = price_for(model)

    def n(key: str) -> int:
        v = usage.get(key) or 0
        return v if isinstance(v, int) else 0

    return (n("input_tokens") * p.input + n("output_tokens") * p.output
            + n("cache_creation_input_tokens") * p.cache_write
            + n("cache_read_input_tokens") * p.cache_read) / 1_000_000


def add_usage(total: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(total)
    for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
        v = usage.get(key)
        if isinstance(v, int):
            out[key] = out.get(key, 0) + v
    return out
