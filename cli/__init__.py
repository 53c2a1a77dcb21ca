"""The ``threadloom`` command: command groups, output helpers and the demo."""
