"""The auditor: agentfsm traces and Claude Code's own files, replayed against the declared graph."""
