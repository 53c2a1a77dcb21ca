"""``python -m threadloom``: the ``threadloom`` command (see :mod:`threadloom.cli.main`)."""

from threadloom.cli.main import main

if __name__ == "__main__":
    main()
