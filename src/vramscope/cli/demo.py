"""``vramscope demo``: the built-in examples, end to end, on whatever device this machine has."""

from __future__ import annotations

import click
import torch

from vramscope.cli.common import emit
from vramscope.examples import DEMO_BATCH
from vramscope.tracking.runner import measure


@click.command(short_help="Run the built-in example workloads and report.")
@click.option(
    "--json",
    "json_path",
    default="vramscope-demo.json",
    show_default=True,
    help="Where to write the JSON reports.",
)
@click.option("--steps", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--example",
    "examples",
    multiple=True,
    type=click.Choice(["cnn", "gpt"]),
    help="Run only these examples.",
)
@click.option("-q", "--quiet", is_flag=True)
def command(json_path: str, steps: int, examples: tuple[str, ...], quiet: bool) -> None:
    """Measure example:cnn and example:gpt (pure torch, shipped in the package) on CUDA if
    present, else on the CPU, print each report and write them all to one JSON file."""
    import json
    from pathlib import Path

    device = "cuda" if torch.cuda.is_available() else "cpu"
    names = examples or ("cnn", "gpt")
    reports = {}
    for name in names:
        batch = DEMO_BATCH[name][device]
        click.echo(
            f"vramscope demo: example:{name}, batch size {batch}, {steps} steps on {device}",
            err=True,
        )
        report = measure(f"example:{name}", batch_size=batch, steps=steps, device=device)
        emit(report, quiet=quiet)
        reports[f"example:{name}"] = report.to_dict()
    target = Path(json_path)
    if len(reports) == 1:
        payload = next(iter(reports.values()))
    else:
        payload = {"schema": "vramscope.demo/1", "reports": reports}
    target.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    click.echo(f"vramscope: wrote {target}", err=True)
