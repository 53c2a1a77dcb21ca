"""``python -m threadloom``: the ``threadloom`` command (see :mod:`threadloom.cli`)."""

from threadloom.cli import main

if __name__ == "__main__":
    main()
