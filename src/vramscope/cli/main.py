"""The command group: registers each verb and turns every user error into one line, exit 2."""

from __future__ import annotations

import importlib
import sys

import click

from vramscope import __version__
from vramscope.errors import VramscopeError

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


def main(argv: list[str] | None = None) -> None:
    """Entry point: one line and exit code 2 for usage errors, never a traceback."""
    try:
        code = cli.main(args=argv, prog_name="vramscope", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("vramscope: interrupted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        hint = (
            f" (see 'vramscope {exc.ctx.info_name} --help')" if exc.ctx and exc.ctx.parent else ""
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
    except KeyboardInterrupt:
        click.echo("vramscope: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
