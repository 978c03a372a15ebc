"""Pytest plugin: fixtures of the agentfsm testing kit."""
