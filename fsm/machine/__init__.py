"""The machine: the declared graph, its events, texts, options and state. Pure: no I/O."""
