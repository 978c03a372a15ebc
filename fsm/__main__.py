"""``python -m agentfsm``: the command line (:mod:`agentfsm.cli`)."""

import sys

from agentfsm.cli import entry

sys.exit(entry())
