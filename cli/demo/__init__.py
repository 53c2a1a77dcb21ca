"""``threadloom demo``: the crash-and-takeover demonstration and its sample agent graph."""
