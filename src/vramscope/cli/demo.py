"""``vramscope demo``: the built-in examples measured here and estimated for named GPUs."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click

from vramscope.cli.common import check_paths, human_console, json_on_stdout, write_json
from vramscope.demo import BATCH, DEFAULT_GPUS

EXAMPLES = tuple(BATCH)


@click.command(short_help="Measure the built-in examples here and estimate them for GPUs.")
@click.option(
    "--json",
    "json_path",
    default="vramscope-demo.json",
    show_default=True,
    help="Where to write the JSON reports ('-': stdout, and the rest to stderr).",
)
@click.option(
    "--html",
    "html_path",
    help="The HTML report; one per example beside it: NAME-cnn.html, NAME-gpt.html "
    "(default: vramscope-demo.html, none with --json -).",
)
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    help="GPU to estimate for (repeatable; see `vramscope estimate --list-gpus`). "
    "Default: h100-80gb and rtx4090.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Steps to measure each example, the first included.",
)
@click.option(
    "--example",
    "examples",
    multiple=True,
    type=click.Choice(EXAMPLES),
    help="Run only these examples.",
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors; files are written.")
def command(
    json_path: str,
    html_path: str | None,
    gpus: tuple[str, ...],
    steps: int,
    examples: tuple[str, ...],
    quiet: bool,
) -> None:
    """Measure example:cnn and example:gpt (pure torch, shipped in the package) on this
    machine, and estimate them for named GPUs with the largest batch that fits on each.
    Without a GPU the examples run on the CPU (host memory, the exact bytes of parameters,
    gradients and optimizer state, steps and phases); with one, each runs there in a fresh
    process and the estimate for that GPU stands beside it with its error. Prints one
    screen, writes the reports as JSON and HTML."""
    from vramscope.demo import run_demo
    from vramscope.report import exports
    from vramscope.report.demo import render

    if html_path is None and json_path != "-":
        html_path = "vramscope-demo.html"
    check_paths(json_path, html_path)
    gpus, examples = gpus or DEFAULT_GPUS, examples or EXAMPLES
    # --json -: the JSON alone on stdout, the screen and progress on stderr
    with json_on_stdout() if json_path == "-" else contextlib.nullcontext():
        console = human_console()
        spinner = console.status("vramscope demo") if not quiet else contextlib.nullcontext()
        with spinner as status:

            def progress(message: str) -> None:
                if status is not None:
                    status.update(f"vramscope demo: {message} …")

            result = run_demo(examples, gpus, steps, None, progress)
        written = []
        if json_path:
            write_json(json.dumps(result.to_dict(), indent=1), json_path)
            if json_path != "-":
                written.append(json_path)
        if html_path:
            pages = _html_paths(html_path, [ex.spec for ex in result.examples])
            for ex, page in zip(result.examples, pages, strict=True):
                exports.write("html", result.html_report(ex), Path(page))
                written.append(page)
        if quiet:
            return
        console.print(render(result))
        example = result.examples[-1]
        console.print(
            f"\nWrote {' · '.join(written)}\n"
            f"Next: vramscope estimate {example.spec} --gpu {result.gpus[0]} -b 64\n"
            f"      vramscope fit {example.spec} --gpu {result.gpus[-1]} --effective-batch 512\n"
            "      vramscope run your_training_script.py",
            highlight=False,
        )


def _html_paths(path: str, specs: list[str]) -> list[str]:
    """``path`` for one example; ``stem-cnn.html``, ``stem-gpt.html`` beside it for more."""
    if len(specs) == 1:
        return [path]
    target = Path(path)
    return [
        str(target.with_name(f"{target.stem}-{spec.split(':')[-1]}{target.suffix or '.html'}"))
        for spec in specs
    ]
