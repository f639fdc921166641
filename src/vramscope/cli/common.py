"""Options and output handling shared by the verbs."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from vramscope.errors import VramscopeError
from vramscope.report.model import Report


def output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--json/--html/--trace/--csv/--quiet, accepted by every verb that makes a report."""
    options = [
        click.option(
            "--json", "json_path", type=click.Path(dir_okay=False), help="Write the report as JSON."
        ),
        click.option(
            "--html",
            "html_path",
            type=click.Path(dir_okay=False),
            help="Write a self-contained HTML report.",
        ),
        click.option(
            "--trace",
            "trace_path",
            type=click.Path(dir_okay=False),
            help="Write a Chrome/Perfetto trace.",
        ),
        click.option(
            "--csv", "csv_path", type=click.Path(dir_okay=False), help="Write the steps as CSV."
        ),
        click.option(
            "-q",
            "--quiet",
            is_flag=True,
            help="Print nothing but errors; files are still written.",
        ),
    ]

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("json_path") != "-":
            return func(*args, **kwargs)
        with json_on_stdout():
            return func(*args, **kwargs)

    for option in reversed(options):
        command = option(command)
    return command


class _JsonStdout:
    """Where ``--json -`` writes while everything else that would go to stdout goes to stderr."""

    fd: int | None = None  # a duplicate of the real stdout's file descriptor
    stream: Any = None  # the real sys.stdout, when it has no file descriptor


@contextlib.contextmanager
def json_on_stdout() -> Iterator[None]:
    """``--json -``: stdout carries the JSON alone. Meanwhile text for people (the report,
    a script's own prints, its subprocesses' output) goes to stderr, at the Python level and
    at the file-descriptor level; ``write_json`` writes to the real stdout."""
    real = sys.stdout
    real.flush()
    fd: int | None
    try:
        fd, err_fd = real.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        fd = err_fd = None
    saved = None
    if fd is not None and err_fd is not None:
        saved = os.dup(fd)
        os.dup2(err_fd, fd)
    _JsonStdout.fd, _JsonStdout.stream = saved, real
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        sys.stdout = real
        if saved is not None and fd is not None:
            os.dup2(saved, fd)
            os.close(saved)
        _JsonStdout.fd = _JsonStdout.stream = None


def real_stdout() -> int | None:
    """Under ``--json -``: a descriptor of the real stdout, for a child process that writes
    the JSON (None otherwise: the child inherits stdout)."""
    return _JsonStdout.fd


def write_json(text: str, path: str) -> None:
    """Write JSON ``text`` to ``path``; ``-`` is stdout (the real one under ``--json -``)."""
    if not text.endswith("\n"):
        text += "\n"
    if path != "-":
        try:
            _writable(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise VramscopeError(f"cannot write {path}: {exc.strerror or exc}") from None
        return
    if _JsonStdout.fd is not None:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(_JsonStdout.fd, data) :]
    else:
        stream = _JsonStdout.stream or sys.stdout
        stream.write(text)
        stream.flush()


def human_console() -> Any:
    """A rich Console for text meant for people: stdout, which ``--json -`` points at stderr."""
    from rich.console import Console

    return Console()


def say(message: str, quiet: bool = False) -> None:
    """One line of progress or a note on stderr, unless ``--quiet``."""
    if not quiet:
        click.echo(message, err=True)


def _trust_remote_code(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        from vramscope.hf_models import trust_remote_code_for_process

        trust_remote_code_for_process()


def tuning_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--precision/--accumulate/--allocator-config: override what the workload says;
    --trust-remote-code: ``hf:`` models may run code from their repositories."""
    from vramscope.workload import PRECISIONS  # imports torch: only verbs that build workloads

    options = [
        click.option(
            "--precision",
            type=click.Choice(PRECISIONS),
            help="Override the workload's precision.",
        ),
        click.option(
            "--accumulate",
            type=click.IntRange(min=1),
            help="Micro-batches per optimizer step (overrides the workload).",
        ),
        click.option(
            "--allocator-config",
            help="PYTORCH_CUDA_ALLOC_CONF options, e.g. expandable_segments:True.",
        ),
        click.option(
            "--trust-remote-code",
            is_flag=True,
            expose_value=False,
            callback=_trust_remote_code,
            help="Let an hf: model run the code its repository ships (its config's auto_map).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def workload_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--batch-size and the tuning options, for verbs that run one batch size."""
    func = tuning_options(func)
    return click.option(
        "-b",
        "--batch-size",
        type=click.IntRange(min=1),
        default=8,
        show_default=True,
        help="Micro-batch size passed to the build function.",
    )(func)


def _writable(path: str) -> Path:
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise VramscopeError(f"cannot write {target}: folder {target.parent} does not exist")
    return target


def emit(
    report: Report,
    json_path: str | None = None,
    html_path: str | None = None,
    trace_path: str | None = None,
    csv_path: str | None = None,
    quiet: bool = False,
    render: Callable[[Report], Any] | None = None,
) -> None:
    """Print the report (``render``'s view of it, else the standard one) unless ``quiet``,
    and write every file asked for; ``json_path`` ``-`` is stdout."""
    if not quiet:
        if render is not None:
            human_console().print(render(report))
        else:
            from vramscope.report.terminal import print_report

            print_report(report, human_console())
    written = []
    if json_path:
        write_json(report.to_json(), json_path)
        if json_path != "-":
            written.append(json_path)
    exporters = {"html": html_path, "trace": trace_path, "csv": csv_path}
    for kind, path in exporters.items():
        if not path:
            continue
        target = _writable(path)
        try:
            from vramscope.report import exports
        except ImportError:
            raise VramscopeError(f"--{kind} is not available in this version") from None
        exports.write(kind, report, target)
        written.append(path)
    for path in written:
        say(f"vramscope: wrote {path}", quiet)


def check_paths(*paths: str | None) -> None:
    """Fail early, before a long run, when an output folder does not exist."""
    for path in paths:
        if path:
            _writable(path)


def parallel_options(func: Callable[..., Any] | None = None, *, each_strategy: bool = False) -> Any:
    """--world-size/--strategy and their settings: estimate one rank of a data-parallel job.
    The command receives them as one ``parallel`` argument (a ParallelPlan, or None). With
    ``each_strategy`` (compare), --world-size alone is allowed: ``parallel`` then carries
    the settings and ``parallel_each`` is True (every strategy side by side)."""
    if func is None:
        return functools.partial(parallel_options, each_strategy=each_strategy)
    from vramscope.distributed.sharding import BACKENDS, DTYPES, STRATEGY_NAMES

    options = [
        click.option(
            "--world-size",
            type=int,
            help="Estimate per rank (per GPU) of a data-parallel job of this many GPUs "
            "(with --strategy).",
        ),
        click.option(
            "--strategy",
            type=click.Choice(STRATEGY_NAMES),
            help="How the job is parallel: ddp, fsdp (FSDP2 fully_shard), hsdp, zero1 (DDP "
            "with ZeroRedundancyOptimizer), zero2 (fully_shard, parameters kept through "
            "backward).",
        ),
        click.option(
            "--shard-size",
            type=int,
            help="hsdp: ranks that shard the model (default 8, a node); the groups replicate.",
        ),
        click.option(
            "--shard-module",
            metavar="CLASS",
            help="fsdp/hsdp/zero2: apply fully_shard to each module of this class (default: "
            "the model's repeated blocks), then to the root.",
        ),
        click.option(
            "--reshard-after-forward/--no-reshard-after-forward",
            default=None,
            help="fsdp/hsdp: free each block's gathered parameters after its forward "
            "(fully_shard's default: every block but the root).",
        ),
        click.option(
            "--param-dtype",
            type=click.Choice(tuple(DTYPES)),
            help="fsdp/hsdp/zero2 mixed precision: parameters gathered and computed in this dtype.",
        ),
        click.option(
            "--reduce-dtype",
            type=click.Choice(tuple(DTYPES)),
            help="fsdp/hsdp/zero2 mixed precision: gradients reduce-scattered in this dtype.",
        ),
        click.option(
            "--cpu-offload",
            is_flag=True,
            help="fsdp/hsdp/zero2: parameter and gradient shards and the optimizer state on "
            "the CPU (CPUOffloadPolicy).",
        ),
        click.option(
            "--bucket-cap-mb",
            type=float,
            help="ddp/zero1: DDP's bucket size (default 25 MiB, the first bucket 1 MiB).",
        ),
        click.option(
            "--gradient-as-bucket-view",
            is_flag=True,
            help="ddp/zero1: gradients are views of DDP's buckets (no second copy).",
        ),
        click.option(
            "--backend",
            type=click.Choice(BACKENDS),
            help="The process group's backend (default nccl): gloo adds no NCCL buffers but "
            "copies each reduce-scatter input on the device.",
        ),
        click.option(
            "--tp",
            type=int,
            help="Tensor parallel over groups of this many ranks (parallelize_module: the "
            "workload's tensor_parallel_plan, or the default plan for Llama-like and "
            "GPT-like blocks); --strategy applies over the remaining ranks.",
        ),
        click.option(
            "--sequence-parallel/--no-sequence-parallel",
            default=None,
            help="With --tp: split the activations between the blocks' attention and MLP "
            "along the sequence (SequenceParallel; default: where the model allows it).",
        ),
        click.option(
            "--pp",
            type=int,
            help="Pipeline parallel over this many stages: the model's repeated blocks divided "
            "evenly among them, the embeddings on the first, the head and the loss on the last; "
            "one row per stage (--world-size defaults to --pp × --tp); with --strategy and --tp, "
            "data and tensor parallel inside each stage.",
        ),
        click.option(
            "--pp-schedule",
            type=str,
            help="With --pp: gpipe, 1f1b (the default) or interleaved-1f1b (2 stages per rank), "
            "as torch.distributed.pipelining runs them.",
        ),
        click.option(
            "--microbatches",
            type=int,
            help="With --pp: micro-batches per step, each of --batch-size (default: twice the "
            "stages).",
        ),
        click.option(
            "--pp-split",
            metavar="I,J,...",
            help="With --pp: the block indices where the stages after the first begin "
            "(default: the blocks divided evenly).",
        ),
        click.option(
            "--cp",
            type=int,
            help="Context parallel over this many ranks: each holds 1/N of every sequence, "
            "attention through torch's ring attention (--world-size defaults to --cp; with "
            "--strategy ddp, fsdp or zero2, data parallel over the dp × cp ranks).",
        ),
        click.option(
            "--ep",
            type=int,
            help="Expert parallel over this many ranks: each holds 1/N of every MoE layer's "
            "experts, tokens exchanged all-to-all (--world-size defaults to --ep; with "
            "--strategy ddp, fsdp or zero2, carved from the data-parallel ranks: FSDP shards "
            "the experts over world/ep ranks, the rest over the world).",
        ),
        click.option(
            "--ep-imbalance",
            type=float,
            help="With --ep: the tokens the most loaded rank's experts get, as a multiple of "
            "the even share (default 1: routing assumed even).",
        ),
    ]
    names = (
        "world_size",
        "strategy",
        "shard_size",
        "shard_module",
        "reshard_after_forward",
        "param_dtype",
        "reduce_dtype",
        "cpu_offload",
        "bucket_cap_mb",
        "gradient_as_bucket_view",
        "backend",
        "tp",
        "sequence_parallel",
        "pp",
        "pp_schedule",
        "microbatches",
        "pp_split",
        "cp",
        "ep",
        "ep_imbalance",
    )

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in names}
        for name in ("backend", "tp", "pp", "cp", "ep"):
            if given[name] is None:
                del given[name]  # the plan's default
        given["pp_split"] = _split_points(given["pp_split"])
        if given.get("pp") is not None and given["world_size"] is None and given["pp"] > 1:
            given["world_size"] = given["pp"] * given.get("tp", 1)  # one rank per stage
        for name in ("cp", "ep"):  # alone, the group is the world
            size = given.get(name)
            if isinstance(size, int) and size > 1 and given["world_size"] is None:
                given["world_size"] = size
        tp = given.get("tp", 1)
        each = (
            each_strategy
            and given["world_size"] is not None
            and given["strategy"] is None
            and (tp == 1 or given["world_size"] != tp * given.get("pp", 1))
            and given.get("cp", 1) == 1
            and given.get("ep", 1) == 1
        )
        if each:
            from vramscope.distributed.sharding import ParallelPlan

            # the settings of every strategy compared; each row keeps those it takes
            settings = {k: v for k, v in given.items() if k not in ("world_size", "strategy")}
            base = ParallelPlan(strategy="fsdp", world_size=given["world_size"], **settings)
            # the world size and DDP's settings (with --tp, FSDP's: DDP does not take it,
            # nor an interleaved pipeline)
            interleaved = given.get("pp_schedule") == "interleaved-1f1b"
            base.with_strategy("ddp" if tp == 1 and not interleaved else "fsdp").check()
            kwargs["parallel"] = base
            kwargs["parallel_each"] = True
        else:
            kwargs["parallel"] = parallel_plan(**given)
            if each_strategy:
                kwargs["parallel_each"] = False
        return func(*args, **kwargs)

    for option in reversed(options):
        command = option(command)
    return command


def parallel_plan(
    world_size: int | None = None,
    strategy: str | None = None,
    **settings: Any,
) -> Any:
    """The ParallelPlan the options describe, checked (None without --world-size and
    --strategy); a bad combination is a VramscopeError (one line, exit 2)."""
    given = [f"--{k.replace('_', '-')}" for k, v in settings.items() if v not in (None, False)]
    if settings.get("ep_imbalance") is not None and settings.get("ep", 1) == 1:
        raise VramscopeError("--ep-imbalance applies with --ep N (expert parallel)")
    if settings.get("pp", 1) == 1:
        for name in ("pp_schedule", "microbatches", "pp_split"):
            if settings.get(name) is not None:
                flag = f"--{name.replace('_', '-')}"
                raise VramscopeError(f"{flag} applies with --pp N (pipeline stages)")
    if world_size is None and strategy is None:
        if given:
            raise VramscopeError(
                f"{given[0]} describes a distributed job: give --world-size N and --strategy"
            )
        return None
    if world_size is None:
        raise VramscopeError(
            f"--strategy {strategy} needs --world-size N: how many GPUs the job has"
        )
    from vramscope.distributed.sharding import NO_DATA_PARALLEL, ParallelPlan

    if strategy is None:
        if all(settings.get(name, 1) == 1 for name in ("tp", "pp", "cp", "ep")):
            raise VramscopeError(
                f"--world-size {world_size} needs --strategy: ddp, fsdp, hsdp, zero1 or zero2"
            )
        strategy = NO_DATA_PARALLEL  # check() says when ranks are left for data parallel

    return ParallelPlan(strategy=strategy, world_size=world_size, **settings).check()


def _split_points(text: str | None) -> tuple[int, ...] | None:
    """``--pp-split 4,8``: block indices, increasing."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise VramscopeError(
            f"--pp-split {text!r}: give block indices separated by commas, such as 4,8"
        ) from None
