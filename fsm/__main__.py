"""``python -m agentfsm``: the command line (:mod:`agentfsm.cli`)."""

import sys

from agentfsm.cli import main

sys.exit(main())
