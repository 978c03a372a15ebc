"""Cost of a response from its usage and the per-model price table.

The table is a data file, ``fsm/data/prices.json`` (USD per million tokens for input, output, cache
writes and cache reads, keyed by model id prefix; the longest matching prefix wins, ``default`` prices
unknown models). Update the file when Anthropic's prices change; keys starting with ``_`` are notes.
``AGENTFSM_PRICES`` may name another file with the same shape, e.g. for a proxy with its own prices.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

PRICES_ENV = "AGENTFSM_PRICES"
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


@attrs.frozen
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float


def _load(text: str, where: str) -> dict[str, Price]:
    raw = json.loads(text)
    table = {k: Price(**v) for k, v in raw.items() if not k.startswith("_")}
    if "default" not in table:
        raise ValueError(f"{where}: the price table needs a 'default' entry")
    return table


@cache
def price_table() -> Mapping[str, Price]:
    override = os.environ.get(PRICES_ENV)
    if override:
        return _load(Path(override).read_text(encoding="utf-8"), override)
    return _load(resources.files("agentfsm").joinpath("data/prices.json").read_text(encoding="utf-8"),
                 "fsm/data/prices.json")


def price_for(model: str) -> Price:
    table = price_table()
    matches = [k for k in table if k != "default" and model.startswith(k)]
    return table[max(matches, key=len)] if matches else table["default"]


def _tokens(usage: Mapping[str, Any], key: str) -> int:
    v = usage.get(key) or 0
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def cost_usd(model: str, usage: Mapping[str, Any]) -> float:
    """What ``usage`` (a Messages ``usage`` object) costs on ``model``, in USD."""
    p = price_for(model)
    return (_tokens(usage, "input_tokens") * p.input + _tokens(usage, "output_tokens") * p.output
            + _tokens(usage, "cache_creation_input_tokens") * p.cache_write
            + _tokens(usage, "cache_read_input_tokens") * p.cache_read) / 1_000_000


def add_usage(total: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    """``total`` plus ``usage``, key by key (the result's ``usage``)."""
    out = dict(total)
    for key in USAGE_KEYS:
        v = _tokens(usage, key)
        if key in usage:
            out[key] = out.get(key, 0) + v
    return out
