import sys

from agentfsm.cli import main

sys.exit(main())
