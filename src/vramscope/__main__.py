"""``python -m vramscope``: the same as the ``vramscope`` command."""

from vramscope.cli.main import main

if __name__ == "__main__":
    main()
