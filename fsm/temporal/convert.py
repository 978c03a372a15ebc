"""The payload converter: agentfsm's attrs records (frozen, nested, tuples, enums) as Temporal payloads.

Temporal's default JSON converter knows dataclasses and pydantic models, not attrs. This keeps its
converter chain and the ``json/plain`` encoding and adds attrs through ``cattrs``: an attrs value is
unstructured to plain JSON on the way out, and any type hint that is (or contains) an attrs class is
structured back on the way in. Workers and clients must use :data:`DATA_CONVERTER`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import typing
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    AdvancedJSONEncoder,
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    JSONTypeConverter,
)

from agentfsm.machine.state import Limits
from agentfsm.temporal.records import Carried, SessionInput, SessionSpec, Timing

# Defaults are left out of a payload (decoding fills them back in; a payload with every field still
# decodes), except in the records whose values the workflow decides by — a session's Limits and its
# Timing: those travel whole, so that a default changed in a later release cannot change, on replay,
# what a session recorded before it decided
CONVERTER = cattrs.Converter(omit_if_default=True)
_WHOLE = cattrs.Converter()
for _cls in (Limits, Timing):
    CONVERTER.register_unstructure_hook(_cls, functools.partial(_WHOLE.unstructure, unstructure_as=_cls))
CONVERTER.register_unstructure_hook(SessionSpec, make_dict_unstructure_fn(
    SessionSpec, CONVERTER, _cattrs_omit_if_default=True, limits=override(omit_if_default=False)))
# the loop state a continued run starts from: whole, for the same reason
CONVERTER.register_unstructure_hook(Carried, functools.partial(_WHOLE.unstructure, unstructure_as=Carried))
CONVERTER.register_unstructure_hook(SessionInput, make_dict_unstructure_fn(
    SessionInput, CONVERTER, _cattrs_omit_if_default=True, timing=override(omit_if_default=False)))


def spec_digest(spec: SessionSpec) -> str:
    """A session spec's digest (a worker keeps what it built for a spec by it; a model call may name
    its spec by it instead of carrying it)."""
    text = json.dumps(CONVERTER.unstructure(spec), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _has_attrs(hint: Any) -> bool:
    if isinstance(hint, type) and attrs.has(hint):
        return True
    return any(_has_attrs(a) for a in typing.get_args(hint))


class _Encoder(AdvancedJSONEncoder):
    def default(self, o: Any) -> Any:
        if attrs.has(type(o)):
            return CONVERTER.unstructure(o)
        return super().default(o)


class _AttrsTypes(JSONTypeConverter):
    def to_typed_value(self, hint: type, value: Any) -> Any:
        if _has_attrs(hint):
            return CONVERTER.structure(value, hint)
        return JSONTypeConverter.Unhandled


class _OrderedJSON(JSONPlainPayloadConverter):
    """JSON that keeps mappings in their order (the stock converter sorts keys): a content block or a
    stream-json message reads the same after the trip as a local run writes it. Order is already
    deterministic — the workflow builds every mapping the same way on each replay."""

    def to_payload(self, value: Any) -> Payload | None:
        return Payload(metadata={"encoding": self.encoding.encode()},
                       data=json.dumps(value, cls=_Encoder, separators=(",", ":"), ensure_ascii=False).encode())


class AttrsPayloadConverter(CompositePayloadConverter):
    """The default converter chain with attrs support in its JSON converter."""

    def __init__(self) -> None:
        converters = [
            _OrderedJSON(encoder=_Encoder, custom_type_converters=[_AttrsTypes()])
            if isinstance(c, JSONPlainPayloadConverter) else c
            for c in DefaultPayloadConverter.default_encoding_payload_converters
        ]
        super().__init__(*converters)


DATA_CONVERTER = dataclasses.replace(DataConverter.default, payload_converter_class=AttrsPayloadConverter)
