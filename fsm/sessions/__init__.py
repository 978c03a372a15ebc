"""Sessions: one conversation's runs, resuming them, subagents, the wiring of a session, memory files."""
