"""What a Claude Code input says in the graph's terms: the records' texts and caps, and the items a
reading yields (events with the edges the client took, run boundaries, moves inside a phase)."""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from agentfsm.auditing.checks import Finding
from agentfsm.machine.events import Event
from agentfsm.machine.state import Limits, Message

TRANSCRIPT = "claude-code-transcript"
STREAM_JSON = "claude-code-stream-json"
CHECKED_VERSIONS = frozenset({"2.1.332"})

# Claude Code 2.1.332's caps in the graph's terms: it retries a malformed tool use twice, and stops
# after five invalid StructuredOutput calls (four retries). max_turns is read from the input.
CLAUDE_CODE_LIMITS = Limits(malformed_tool_use_retries=2, structured_output_retries=4)

STRUCTURED_OUTPUT_TOOL = "StructuredOutput"

# the loop's hidden user messages, by the start of their text
MAX_TOKENS, MID_STREAM_CUT, MALFORMED, THINKING_ONLY, ENFORCE, STOP_FEEDBACK, REFUSED = (
    "max_tokens", "mid_stream_cut", "malformed", "thinking_only", "structured_output", "stop_hook", "refused")
META_TEXTS: tuple[tuple[str, str], ...] = (
    ("Output token limit hit. Resume directly", MAX_TOKENS),
    ("Your response above was cut off mid-stream.", MID_STREAM_CUT),
    ("The previous response failed to produce a valid tool call.", MALFORMED),
    ("[Your previous response had no visible output.", THINKING_ONLY),
    ("[structured-output-enforce]", ENFORCE),
    ("Stop hook feedback:", STOP_FEEDBACK),
    ("Your response above was stopped by a safety classifier", REFUSED),
)
# the re-entry each hidden message stands for
REENTRY_OF: Mapping[str, str] = {
    MAX_TOKENS: "max_output_tokens_recovery", MID_STREAM_CUT: "max_output_tokens_recovery",
    MALFORMED: "malformed_tool_use_retry", THINKING_ONLY: "thinking_only_nudge", ENFORCE: "structured_output_retry",
    STOP_FEEDBACK: "stop_hook_blocking", REFUSED: "refusal_retry"}
# the result of a run whose response was refused again (Claude Code 2.1.332: ``API Error: <model> can't help...``)
REFUSED_AGAIN = "can't help with this. Start a new session to continue."
# the results Claude Code gives the calls of a refused response (stream-json shows no stop reason)
REFUSED_RESULTS = ("Interrupted: the response that made this tool call was stopped by a safety classifier",
                   "Not run: the response that made this tool call was stopped by a safety classifier")
# the user's interrupt (Esc / Ctrl-C), written as a user message ("… for tool use" while tools ran)
INTERRUPTED = "[Request interrupted by user"
# user records of local commands (slash commands, ! shell input): no request follows from them
LOCAL_COMMAND_STARTS = ("<command-name>", "<command-message>", "<local-command-", "<bash-input>", "<bash-stdout>",
                        "<bash-stderr>")
# context the client sends with the next request (a hidden user message): no event of its own
CONTEXT_START = "<system-reminder>"
# a background subagent's completion, delivered as the prompt of a new run
TASK_NOTIFICATION_START = "<task-notification>"
# the notice a UserPromptSubmit hook's block leaves (the prompt itself is not written)
PROMPT_BLOCKED = "UserPromptSubmit operation blocked by hook"
COMPACT_SUMMARY_START = "This session is being continued from a previous conversation"
STOP_CAP_NOTICE = "blocked the turn from ending"
MAX_TURNS_ERROR = re.compile(r"maximum number of turns \((\d+)\)")
BUDGET_ERROR = re.compile(r"Reached maximum budget \(\$([0-9.e+-]+)\)")


@attrs.frozen
class Observation:
    """An event the client's records show, and the edge it took for each move the event causes
    (``None``: the records do not say, the machine's choice is taken)."""

    line: int
    event: Event
    observed: tuple[str | None, ...]


@attrs.frozen
class RunStart:
    """A run of the loop starts here (a prompt; a stream-json output's first line). ``cause``: what
    started it — ``prompt``, ``resume`` (a prompt of a later client process on the same session),
    ``task-notification`` (a background subagent finished), ``subagent`` (a child run's own prompt)."""

    line: int
    prompt: Message | None = None
    cause: str = "prompt"


@attrs.frozen
class RunEnd:
    """stream-json's result line: how the client says the run ended."""

    line: int
    terminal_reason: str | None


@attrs.frozen
class Internal:
    """Something the client did inside a phase that is no move of the graph (a transport retry)."""

    line: int
    action: str
    detail: str = ""


@attrs.frozen
class Fact:
    """Something the records say about the run that is no move of the graph: a permission denial, the
    session's mode, a background task started, changed or announced."""

    line: int
    kind: str
    detail: str = ""


Item = Observation | RunStart | RunEnd | Internal | Fact


@attrs.frozen
class Reading:
    """What one Claude Code input says, in the graph's terms. ``children``: the subagent loops it
    started (their sidechain records, their own transcript files, stream-json lines with a
    ``parent_tool_use_id``), each read on its own; ``link``: the parent's tool call that started this
    one; ``agent``: the subagent's id, where the records give it."""

    source: str
    version: str | None
    limits: Limits
    items: tuple[Item, ...]
    findings: tuple[Finding, ...]
    children: tuple[Reading, ...] = ()
    link: str | None = None
    agent: str | None = None
    path: str = ""
