"""``vramscope demo``: the built-in examples, end to end, on whatever device this machine has."""

from __future__ import annotations

import click
import torch

from vramscope.cli.common import emit, json_on_stdout, say, write_json
from vramscope.examples import DEMO_BATCH
from vramscope.tracking.runner import measure


@click.command(short_help="Run the built-in example workloads and report.")
@click.option(
    "--json",
    "json_path",
    default="vramscope-demo.json",
    show_default=True,
    help="Where to write the JSON reports ('-': stdout, and the reports to stderr).",
)
@click.option("--steps", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--example",
    "examples",
    multiple=True,
    type=click.Choice(["cnn", "gpt"]),
    help="Run only these examples.",
)
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors; the file is written.")
def command(json_path: str, steps: int, examples: tuple[str, ...], quiet: bool) -> None:
    """Measure example:cnn and example:gpt (pure torch, shipped in the package) on CUDA if
    present, else on the CPU, print each report and write them all to one JSON file."""
    if json_path == "-":
        with json_on_stdout():
            _demo(json_path, steps, examples, quiet)
    else:
        _demo(json_path, steps, examples, quiet)


def _demo(json_path: str, steps: int, examples: tuple[str, ...], quiet: bool) -> None:
    import json

    device = "cuda" if torch.cuda.is_available() else "cpu"
    names = examples or ("cnn", "gpt")
    reports = {}
    for name in names:
        batch = DEMO_BATCH[name][device]
        say(f"vramscope demo: example:{name}, batch size {batch}, {steps} steps on {device}", quiet)
        report = measure(f"example:{name}", batch_size=batch, steps=steps, device=device)
        emit(report, quiet=quiet)
        reports[f"example:{name}"] = report.to_dict()
    if len(reports) == 1:
        payload = next(iter(reports.values()))
    else:
        payload = {"schema": "vramscope.demo/1", "reports": reports}
    write_json(json.dumps(payload, indent=1), json_path)
    if json_path != "-":
        say(f"vramscope: wrote {json_path}", quiet)
