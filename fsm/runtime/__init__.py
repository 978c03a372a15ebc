"""The runtime: the loop runner, the in-process driver and the I/O of each phase."""
