"""The command group: registers each verb and turns every user error into one line, exit 2."""

from __future__ import annotations

import contextlib
import importlib
import sys

import click

from vramscope import __version__
from vramscope.errors import VramscopeError
from vramscope.stops import StopHandlers, Stopped, said, signal_of

# verb → module under vramscope.cli that defines ``command`` (a click.Command)
VERBS = {
    "run": "run",
    "measure": "measure",
    "estimate": "estimate",
    "fit": "fit",
    "compare": "compare",
    "info": "info",
    "watch": "watch",
    "report": "report",
    "demo": "demo",
}


class VerbGroup(click.Group):
    """Loads a verb's module only when it is used, so ``vramscope info`` never imports torch."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in VERBS if self._module(name) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = self._module(name)
        return None if module is None else module.command

    @staticmethod
    def _module(name: str):
        target = VERBS.get(name)
        if target is None:
            return None
        try:
            return importlib.import_module(f"vramscope.cli.{target}")
        except ModuleNotFoundError as exc:
            if exc.name == f"vramscope.cli.{target}":
                return None
            raise


@click.group(cls=VerbGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vramscope")
def cli() -> None:
    """How much GPU and host memory a PyTorch run takes, where it goes, and how to make it fit."""


# verbs that run the user's code and handle stop signals as that code expects (``run`` keeps
# the script's own exit code; ``watch`` quits on Ctrl-C): no handlers of vramscope's around them
OWN_SIGNALS = ("run", "watch")


def main(argv: list[str] | None = None) -> None:
    """Entry point: one line and exit code 2 for usage errors, never a traceback; Ctrl-C and
    stop signals end a verb in one line with 128 + the signal's number (see
    :mod:`vramscope.cli.exits` for every code)."""
    args = sys.argv[1:] if argv is None else list(argv)
    verb = next((a for a in args if not a.startswith("-")), None)
    handlers = StopHandlers() if verb not in OWN_SIGNALS else contextlib.nullcontext()
    with handlers:
        try:
            code = cli.main(args=args, prog_name="vramscope", standalone_mode=False)
        except click.exceptions.Abort:
            _stopped(KeyboardInterrupt())
        except click.UsageError as exc:
            hint = (
                f" (see 'vramscope {exc.ctx.info_name} --help')"
                if exc.ctx and exc.ctx.parent
                else ""
            )
            if exc.ctx and exc.ctx.parent is None:
                hint = " (see 'vramscope --help')"
            click.echo(f"vramscope: error: {exc.format_message()}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"vramscope: error: {exc.format_message()}", err=True)
            sys.exit(2)
        except VramscopeError as exc:
            click.echo(f"vramscope: error: {exc}", err=True)
            sys.exit(2)
        except (KeyboardInterrupt, Stopped) as exc:
            _stopped(exc)
        received = getattr(handlers, "received", None)
        if received is not None:  # swallowed on the way (an import's clean-up ignores it)
            _stopped(received)
    sys.exit(code if isinstance(code, int) else 0)


def _stopped(exc: BaseException) -> None:
    click.echo(f"vramscope: {said(exc)}", err=True)
    sys.exit(signal_of(exc)[1])


if __name__ == "__main__":  # python -m vramscope.cli.main, as python -m vramscope
    main()
