"""The words a run ends with when the API refused its request (Claude Code 2.1.332's, compared with it on the
same scripted server: docs/conform.md), and the gateway they name.

A 4xx other than 429 is ``API Error: <status> <message>``, a 429 ``API Error: Request rejected (429) · <message>``;
a 5xx adds whose fault it is and where to look
if it persists: the gateway a base URL names, or the API's status page. The address shown never carries
the user and password a base URL may hold.
"""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from agentfsm.llm.transport import gateway
from agentfsm.runtime.result import SERVER_SIDE, STATUS_PAGE, api_error_kind, api_error_text, shows_api_error

messages = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@given(st.integers(400, 499).filter(lambda s: s != 429), messages)
def test_a_4xx_is_status_and_message(status: int, message: str) -> None:
    assert api_error_text(status, message, "gw:1") == f"API Error: {status} {message}".rstrip()


@given(messages.filter(bool), st.sampled_from(["", "gw:1"]))
def test_a_429_is_a_rejected_request_with_its_message(message: str, endpoint: str) -> None:
    assert api_error_text(429, message, endpoint) == f"API Error: Request rejected (429) \u00b7 {message}"
    assert api_error_kind(429) == "rate_limit"


def test_a_429_without_a_message_may_be_passing() -> None:
    assert api_error_text(429, "", "gw:1") == ("API Error: Request rejected (429) \u00b7 this may be a temporary "
                                               "capacity issue. If it persists, check your inference gateway (gw:1).")


@given(st.integers(500, 599), messages, st.sampled_from(["", "127.0.0.1:8080", "proxy.example"]))
def test_a_5xx_says_whose_fault_and_where_to_look(status: int, message: str, endpoint: str) -> None:
    text = api_error_text(status, message, endpoint)
    head = f"API Error: {status} {message}".rstrip().rstrip(".!?\u2026")
    where = f"your inference gateway ({endpoint})" if endpoint else STATUS_PAGE
    assert text == f"{head}. {SERVER_SIDE} If it persists, check {where}."
    assert api_error_kind(status) == "server_error"


@given(st.integers(100, 700))
def test_every_refusal_is_shown(status: int) -> None:
    assert shows_api_error(status) is (status >= 400)
    assert shows_api_error(None) is False


hosts = st.text(string.ascii_lowercase + string.digits + ".-", min_size=1, max_size=20)


@given(st.sampled_from(["http", "https"]), st.one_of(st.none(), hosts), hosts,
       st.one_of(st.none(), st.integers(1, 65535)), st.sampled_from(["", "/", "/v1/x"]))
def test_a_gateway_is_named_by_its_host_never_its_credentials(scheme: str, user: str | None, host: str,
                                                              port: int | None, path: str) -> None:
    netloc = host + (f":{port}" if port else "")
    url = f"{scheme}://{user + ':S3CRET@' if user else ''}{netloc}{path}"
    shown = gateway(url)
    assert "S3CRET" not in shown
    assert shown == ("" if netloc.lower() in ("api.anthropic.com", "api.anthropic.com:443") else netloc)


def test_the_api_itself_is_no_gateway() -> None:
    for url in (None, "", "https://api.anthropic.com", "https://api.anthropic.com/", "https://API.anthropic.com:443"):
        assert gateway(url) == ""
    assert gateway("http://127.0.0.1:4000") == "127.0.0.1:4000"
