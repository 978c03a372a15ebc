"""The command line (``agentfsm ...``), the SDK's control protocol and the demo."""
