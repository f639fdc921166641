"""vramscope's command line run in the test's own process."""

from __future__ import annotations

import pytest

from vramscope.cli.main import main


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``vramscope ARGS``: (its exit code, what it printed, what it printed on stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err
