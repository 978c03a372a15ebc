"""The environment of the processes started for the model and the user (Bash commands, command
hooks): agentfsm's own, minus the credentials agentfsm holds to talk to the model.

A Bash command or a hook runs code the model wrote or a settings file named; neither needs the key
that pays for the conversation, and a command such as ``env`` would put it into the model's context.
Set ``AGENTFSM_SHARE_CREDENTIALS=1`` to pass them on anyway (for a nested agent that needs them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Variables holding a credential for the model API; never inherited unless shared on purpose.
CREDENTIALS: tuple[str, ...] = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
SHARE_SWITCH = "AGENTFSM_SHARE_CREDENTIALS"


def shares_credentials(env: Mapping[str, str] | None = None) -> bool:
    value = (env if env is not None else os.environ).get(SHARE_SWITCH, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` plus ``extra``, without :data:`CREDENTIALS` (unless shared on purpose)."""
    env = {**os.environ, **(extra or {})}
    if not shares_credentials(env):
        for name in CREDENTIALS:
            env.pop(name, None)
    return env
