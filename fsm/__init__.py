"""agentfsm: Claude Code's agent loop as an explicit, auditable finite-state machine."""

__version__ = "0.1.0"
