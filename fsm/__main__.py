"""``python -m agentfsm``: the command line (:mod:`agentfsm.commandline.cli`)."""

import sys

from agentfsm.commandline.cli import entry

sys.exit(entry())
