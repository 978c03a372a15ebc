"""What every layer may use: logging, permission modes, text and JSON helpers, progress."""
