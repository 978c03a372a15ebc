"""``python -m agentfsm.diagram``: the same as ``agentfsm diagram``."""

import sys

from agentfsm.diagram import main

sys.exit(main())
