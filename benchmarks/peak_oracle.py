"""An independent oracle for every step's peak and for what the run's peak is made of.

It shares no code with vramscope (it never imports it): it runs each script of
``benchmarks/scripts/`` in a process of its own, twice, and then runs ``vramscope run`` on it
in each detail, and compares.

- **Every step's peak** (pass ``steps``): a training step ends where its last optimizer
  step ends (the post-hook): there ``torch.cuda.max_memory_allocated()`` is its peak so far
  and ``reset_peak_memory_stats()`` starts what follows. What follows is the next step's,
  the one that consumes the next batch, once that step begins with a ``zero_grad`` or a
  DataLoader fetch, or with the same optimizer stepping again (a closure runs in it);
  another optimizer step or a backward first (two optimizers stepped one after the other),
  and it is more of the same step; the end of the script first, and it
  belongs to the last step. A step that began after the last optimizer step and never ended
  (an out-of-memory error, a signal) is the ``tail``. (vramscope begins a step at a forward
  too, which the oracle does not watch: in the scripts a ``zero_grad`` or a fetch comes
  first, or in the same step.)
- **The instant of the peak** (pass ``instant``): the same script again, now under a dispatch
  mode that reads ``memory_allocated()`` before each operator and ``max_memory_allocated()``
  after it (resetting the peak before it), so the operator in which the run's peak falls is
  known, and under saved-tensor hooks that record every tensor autograd saves for backward.
  Right after that operator returns, every live allocator block (``memory_snapshot()``) is
  classified by tensor identity: parameters, buffers, gradients and optimizer state by the
  storages the objects hold (every ``nn.Module`` and ``Optimizer`` alive, found through the
  garbage collector, which is never run), activations by the storages saved for backward,
  the rest temporaries; what the operator allocated and freed again before it returned
  (``max_memory_allocated() - memory_allocated()`` there) is temporaries too. A block that
  no object holds yet is classified as the objects hold it at the next operator's start,
  once the autograd node the peak fell in has returned (a weight's gradient, computed by
  that node, is ``.grad`` then; a forward's output is saved for backward once the operator
  is recorded); one still unheld then waits for the next optimizer step's start as long as
  it lives (a weight's gradient becomes ``.grad`` once its whole node has run, a compiled
  backward's when it returns; a block freed meanwhile is dropped: on the CPU the dispatch
  mode sees its storage die, on CUDA the allocator's history, recorded from the peak on,
  says so). The classes add up to the peak.
  Pass ``instant`` also checks its own step peaks against pass ``steps`` (``faithful``): a
  dispatch mode does not change eager allocations, but torch.compile runs eagerly under one,
  so a compiled run's instant is not seen; where the two passes' peaks differ, only the
  peak and the steps are judged.
- On a CPU there is no caching allocator: the dispatch mode keeps the live storages every
  operator returned (freed when their storage dies), and their sum stands for allocated
  memory, in both passes. That checks the classification without a GPU; the caching
  allocator's own numbers need CUDA.

Usage (results as JSON and a text table in OUT):

    python benchmarks/peak_oracle.py --out OUT [--only NAME ...] [--details default modules lines]
        [--timeout 600] [--small] [--jobs N]

Targets: parameters, buffers, gradients and optimizer state within 0.1 % of the
oracle; activations plus temporaries (plus vramscope's "other") within 2 % of the peak; the
default and the modules detail give the same categories; every step entry's peak equals the
oracle's highest step peak among the steps it stands for.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import gc
import json
import os
import platform
import runpy
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS_DIR = HERE / "scripts"
CATEGORIES = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "temporaries")
OBJECT_CATEGORIES = CATEGORIES[:4]
# name -> (script, extra arguments); every script also takes --small
SCRIPTS: dict[str, tuple[str, list[str]]] = {
    "tutorial-toplevel": ("tutorial_toplevel.py", []),
    "model-in-function": ("model_in_function.py", []),
    "model-in-class": ("model_in_class.py", []),
    "lightning-fit": ("lightning_fit.py", []),
    "nanogpt-like": ("nanogpt_like.py", []),
    "dcgan-like": ("dcgan_like.py", []),
    "hf-trainer": ("hf_trainer.py", []),
    "accelerate-loop": ("accelerate_loop.py", []),
    "accumulation": ("accumulation.py", []),
    "zero-grad-keep": ("zero_grad_keep.py", []),
    "frozen": ("frozen.py", []),
    "compiled": ("compiled.py", []),
    "data-parallel": ("data_parallel.py", []),
    "ddp": ("ddp.py", []),
    "fsdp2": ("fsdp2.py", []),
    "leak-until-oom": ("leak_until_oom.py", []),
}
MAX_ENTRIES = 2_000_000  # the allocator's history kept from the peak to the next optimizer step
OBJECT_SHARE = 0.001  # parameters, buffers, gradients, optimizer state: of the oracle's value
REST_SHARE = 0.02  # activations + temporaries (+ other): of the peak


# ==== inside the script's process ==============================================================


class _Saved:
    """What the pack hook returns: an alias of the saved tensor (no grad_fn, so no cycle)."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


class Probe:
    """Step peaks and, in pass ``instant``, the classification at the peak's operator."""

    def __init__(self, instant: bool, target: int | None) -> None:
        import torch

        self.torch = torch
        self.cuda = torch.cuda.is_available()
        self.instant = instant
        self.target = target
        self.steps: list[int] = []
        self.step_peak = 0  # pass instant / CPU: the highest op peak of the open step
        # the open step's peak up to its last optimizer step's end, while no step began after
        # it; a step that went on after that keeps it in ``carry``
        self.ended: int | None = None
        self.carry = 0
        self._ended_by = 0  # id() of the optimizer whose step set ``ended``
        self._instant_after_update = False  # the peak's instant came after an ``ended``
        self.best = -1
        self.best_info: dict[str, Any] | None = None
        self.pending: dict[int, int] = {}  # unheld at the peak: block address -> bytes
        self.waiting = False  # pending waits for the next optimizer step
        self._watching = False  # CUDA: the allocator's history runs since the peak
        self.saved: weakref.WeakSet[_Saved] = weakref.WeakSet()
        self.live: dict[int, int] = {}  # CPU: storage pointer -> bytes
        self._refs: dict[int, Any] = {}  # CPU: storage pointer -> weak reference
        self.live_total = 0
        self.ops = 0
        self._mode: Any = None

    # ---- allocated memory: the allocator's (CUDA) or the live storages' (CPU) -------------
    def allocated(self) -> int:
        if self.cuda:
            return self.torch.cuda.memory_allocated()
        return self.live_total

    def _track(self, out: Any) -> None:
        torch = self.torch
        for t in _tensors(out):
            if t.device.type != "cpu" or t.layout is not torch.strided:
                continue
            try:
                storage = t.untyped_storage()
                ptr, size = storage.data_ptr(), storage.nbytes()
            except Exception:
                continue
            if ptr == 0 or ptr in self.live:
                continue
            self.live[ptr] = size
            self.live_total += size
            self._refs[ptr] = weakref.ref(storage, lambda _, ptr=ptr: self._freed(ptr))

    def _freed(self, ptr: int) -> None:
        self._refs.pop(ptr, None)
        size = self.live.pop(ptr, 0)
        self.live_total -= size
        if self.waiting:
            self.pending.pop(ptr, None)

    # ---- steps -----------------------------------------------------------------------------------
    def on_optimizer_start(self, optimizer: Any, *args: Any) -> None:
        if self.pending:  # a compiled backward's gradients are .grad by now
            self._resolve_pending()
        if self.ended is not None and id(optimizer) == self._ended_by:
            self.begins()  # the same optimizer again: the next step (a closure runs in it)
        else:
            self.goes_on()

    def on_step(self, optimizer: Any, *args: Any) -> None:
        """An optimizer step ended: the step's peak so far."""
        self._resolve_pending()
        self.ended = max(self.carry, self._close_step())
        self.carry = 0
        self._ended_by = id(optimizer)

    def begins(self, *args: Any) -> None:
        """A ``zero_grad`` or a DataLoader fetch: after an optimizer step, a new step began
        where that ended."""
        if self.ended is None:
            return
        self.steps.append(self.ended)
        self.ended = None
        if self._instant_after_update and self.best_info is not None:
            self.best_info["step"] += 1
        self._instant_after_update = False

    def goes_on(self, *args: Any) -> None:
        """Another optimizer step or a backward: the step that ended goes on."""
        if self.ended is not None:
            self.carry, self.ended = self.ended, None
            self._instant_after_update = False

    def _close_step(self) -> int:
        if self.cuda and not self.instant:
            if not self.torch.cuda.is_initialized():
                return 0
            peak = self.torch.cuda.max_memory_allocated()
            self.torch.cuda.reset_peak_memory_stats()
            return int(peak)
        peak, self.step_peak = self.step_peak, self.allocated()
        return int(max(peak, self.step_peak))

    # ---- operators ---------------------------------------------------------------------------------
    def before_op(self) -> int:
        if self.pending and not self.waiting:
            self._resolve_pending(keep=True)
        if self.cuda and self.torch.cuda.is_initialized():
            before = self.torch.cuda.memory_allocated()
            self.torch.cuda.reset_peak_memory_stats()
            return before
        return self.live_total

    def after_op(self, func: Any, out: Any = None) -> None:
        self.ops += 1
        if self.cuda:
            if not self.torch.cuda.is_initialized():
                return
            peak = int(self.torch.cuda.max_memory_allocated())
        else:
            self._track(out)
            peak = self.live_total
        if peak > self.step_peak:
            self.step_peak = peak
        if self.instant and peak > self.best and peak >= 0.98 * (self.target or 0):
            self.best = peak
            self._classify(peak, func, out)

    # ---- classification ------------------------------------------------------------------------------
    def _blocks(self) -> dict[int, int]:
        """Every live block: address -> bytes."""
        if not self.cuda:
            return dict(self.live)
        device = self.torch.cuda.current_device()
        blocks: dict[int, int] = {}
        for segment in self.torch.cuda.memory_snapshot():
            if segment.get("device", device) != device:
                continue
            for block in segment.get("blocks", []):
                if block.get("state") == "active_allocated":
                    blocks[int(block["address"])] = int(block["size"])
        return blocks

    def _identities(self) -> list[tuple[int, str]]:
        """(storage address, category) of every tensor the objects hold now, by priority."""
        torch = self.torch
        modules, optimizers, fsdp_params = [], [], []
        for obj in gc.get_objects():
            kind = type(obj)
            try:
                if issubclass(kind, torch.nn.Module):
                    modules.append(obj)
                elif issubclass(kind, torch.optim.Optimizer):
                    optimizers.append(obj)
                elif kind.__name__ == "FSDPParam":
                    fsdp_params.append(obj)
            except Exception:
                continue
        unsharded = set()
        params: list[Any] = []
        for fp in fsdp_params:  # FSDP2: the shards are the parameters; gathered copies are not
            for attr in ("_unsharded_param",):
                value = getattr(fp, attr, None)
                if value is not None:
                    unsharded.add(id(value))
            sharded = getattr(fp, "sharded_param", None)
            if sharded is not None:
                params.append(sharded)
        for m in modules:
            params.extend(
                p for p in m._parameters.values() if p is not None and id(p) not in unsharded
            )
        for opt in optimizers:
            for group in opt.param_groups:
                params.extend(group["params"])
        out: list[tuple[int, str]] = []

        def add(t: Any, category: str) -> None:
            t = getattr(t, "_local_tensor", t)
            if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
                return
            if (t.device.type == "cuda") != self.cuda:
                return
            try:
                ptr = t.untyped_storage().data_ptr()
            except Exception:
                return
            if ptr:
                out.append((ptr, category))

        for p in params:
            add(p, "parameters")
        for m in modules:
            for b in m._buffers.values():
                if b is not None:
                    add(b, "buffers")
        for p in params:
            add(p.grad, "gradients")
        for opt in optimizers:
            for state in opt.state.values():
                for t in _tensors(state):
                    add(t, "optimizer_state")
        for holder in list(self.saved):
            add(holder.tensor, "activations")
        return out

    def _label(self, blocks: dict[int, int]) -> dict[int, str]:
        """Block address -> category of the first identity (by priority) inside it."""
        starts = sorted(blocks)
        labels: dict[int, str] = {}
        for ptr, category in self._identities():
            i = bisect.bisect_right(starts, ptr) - 1
            if i < 0:
                continue
            start = starts[i]
            if ptr < start + blocks[start] and start not in labels:
                labels[start] = category
        return labels

    def _classify(self, peak: int, func: Any, out: Any) -> None:
        blocks = self._blocks()
        labels = self._label(blocks)
        live = sum(blocks.values())
        categories = dict.fromkeys(CATEGORIES, 0)
        for start, size in blocks.items():
            categories[labels.get(start, "temporaries")] += size
        inside = peak - live  # made and freed inside the operator before it returned
        categories["temporaries"] += inside
        # what the operator (and the autograd node it runs in) made is the objects' once it
        # returned: a weight's gradient is ``.grad`` right after its node, an output saved
        # for backward once the forward operator is recorded
        self.pending = {start: size for start, size in blocks.items() if start not in labels}
        self.waiting = False
        if self.cuda:  # from now on, the allocator's frees: a pending block freed is dropped
            self._watch_frees(True)
        self.best_info = {
            "allocated_bytes": peak,
            "live_blocks_bytes": live,
            "inside_operator_bytes": inside,
            "allocated_after_operator": self.allocated(),
            "operator": str(func),
            "step": len(self.steps),
            "categories": categories,
        }
        self._instant_after_update = self.ended is not None

    def _watch_frees(self, on: bool) -> None:
        """On CUDA, record the allocator's history from the peak on (alloc and free entries,
        no stacks), so that a pending block freed, and its address used again, is seen."""
        memory = self.torch.cuda.memory
        try:
            if on:
                memory._record_memory_history(
                    enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES,
                    clear_history=True,
                )  # fmt: skip
            else:
                memory._record_memory_history(enabled=None)
            self._watching = on
        except Exception:
            self._watching = False

    def _freed_since_peak(self) -> set[int] | None:
        """Addresses freed since the peak (None: not known, the history is off or full)."""
        if not self._watching:
            return None
        trace = self.torch.cuda.memory._snapshot().get("device_traces") or []
        entries = trace[self.torch.cuda.current_device()] if trace else []
        if len(entries) >= MAX_ENTRIES:
            return None
        return {e["addr"] for e in entries if str(e.get("action", "")).startswith("free")}

    def _resolve_pending(self, keep: bool = False) -> None:
        """The blocks no object held at the peak, as the objects hold them now. ``keep``:
        those still unheld wait for the next optimizer step (a block freed meanwhile leaves
        ``pending``: on the CPU at once, on CUDA by the allocator's history)."""
        pending = self.pending
        info = self.best_info
        if self.cuda and pending:
            freed = self._freed_since_peak()
            if freed is None:
                keep = False
            pending = {k: v for k, v in pending.items() if freed is None or k not in freed}
        if not pending or info is None:
            self.pending = {}
            if self.cuda and self._watching:
                self._watch_frees(False)
            return
        blocks = {start: size for start, size in self._blocks().items() if start in pending}
        labels = self._label(blocks)
        cats = info["categories"]
        for start, category in labels.items():
            cats["temporaries"] -= pending[start]
            cats[category] += pending[start]
            info.setdefault("labelled_after", {})[category] = (
                info.get("labelled_after", {}).get(category, 0) + pending[start]
            )
        self.pending = (
            {k: v for k, v in pending.items() if k in blocks and k not in labels} if keep else {}
        )
        self.waiting = bool(self.pending)
        if self.cuda and not self.pending and self._watching:
            self._watch_frees(False)

    # ---- the run ---------------------------------------------------------------------------------------------
    def run(self, script: str, args: list[str]) -> dict[str, Any]:
        torch = self.torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils._python_dispatch import TorchDispatchMode

        probe = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                probe.before_op()
                try:
                    out = func(*args, **(kwargs or {}))
                except BaseException:  # an out-of-memory error: what it reached still counts
                    probe.after_op(func, None)
                    raise
                probe.after_op(func, out)
                return out

        def pack(t: Any) -> _Saved:
            holder = _Saved(t.detach())
            probe.saved.add(holder)
            return holder

        def unpack(holder: _Saved) -> Any:
            return holder.tensor

        handles = [
            register_optimizer_step_pre_hook(self.on_optimizer_start),
            register_optimizer_step_post_hook(self.on_step),
        ]
        patched = _watch(
            [
                (torch.optim.Optimizer, "zero_grad", self.begins),
                (torch.nn.Module, "zero_grad", self.begins),
                (torch.utils.data.dataloader._BaseDataLoaderIter, "__next__", self.begins),
                (torch.autograd, "backward", self.goes_on),
            ]
        )
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).resolve().parent))
        use_mode = self.instant or not self.cuda
        exit_info = "ok"
        started = time.perf_counter()
        try:
            hooks = torch.autograd.graph.saved_tensors_hooks(pack, unpack) if self.instant else None
            if hooks is not None:
                hooks.__enter__()
            mode = Mode() if use_mode else None
            if mode is not None:
                mode.__enter__()
            try:
                runpy.run_path(script, run_name="__main__")
            finally:
                if mode is not None:
                    mode.__exit__(None, None, None)
                if hooks is not None:
                    hooks.__exit__(None, None, None)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                exit_info = f"exit {exc.code}"
        except BaseException as exc:  # an OOM ends the leak script: its tail is kept
            exit_info = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            )
        finally:
            for handle in handles:
                handle.remove()
            for owner, name, original in patched:
                setattr(owner, name, original)
        self._resolve_pending()
        tail: int | None = max(self.carry, self._close_step())
        if self.ended is not None:  # the end after the last optimizer step: that step's
            self.steps.append(max(self.ended, tail or 0))
            tail = None
        peaks = [*self.steps, *([] if tail is None else [tail])]
        run_peak = max(peaks) if peaks else 0
        return {
            "pass": "instant" if self.instant else "steps",
            "device": "cuda" if self.cuda else "cpu",
            "exit": exit_info,
            "seconds": round(time.perf_counter() - started, 2),
            "steps": self.steps,
            "tail": tail,
            "run_peak": run_peak,
            "peak_step": peaks.index(run_peak) if peaks else None,
            "operators": self.ops,
            "instant": self.best_info,
        }


def _watch(targets: list[tuple[Any, str, Any]]) -> list[tuple[Any, str, Any]]:
    """Call ``then`` before each ``owner.name``; returns what to put back."""
    import functools

    saved = []
    for owner, name, then in targets:
        original = getattr(owner, name)

        @functools.wraps(original)
        def watched(*args: Any, _original: Any = original, _then: Any = then, **kwargs: Any) -> Any:
            _then()
            return _original(*args, **kwargs)

        saved.append((owner, name, original))
        setattr(owner, name, watched)
    return saved


def _tensors(value: Any) -> list[Any]:
    import torch

    found: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


def probe_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="peak_oracle.py probe")
    parser.add_argument("--pass", dest="which", choices=("steps", "instant"), required=True)
    parser.add_argument("--target", type=int, default=None)
    parser.add_argument("--json", required=True)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    result = Probe(ns.which == "instant", ns.target).run(ns.script, ns.args)
    Path(ns.json).write_text(json.dumps(result, indent=1))
    return 0


# ==== the driver: oracle passes and vramscope runs, each in its own process ======================


def _run(cmd: list[str], timeout: float, env: dict[str, str]) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT)
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return None, f"timed out after {timeout:.0f} s\n{out[-2000:]}"
    return proc.returncode, (proc.stdout + proc.stderr)[-4000:]


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def compare(oracle: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """One vramscope report against the oracle: the differences and whether each is in target.

    When the instant pass did not reach the run's peak (torch.compile runs eagerly under a
    dispatch mode), only the peak and the steps are judged."""
    steps, instant = oracle["steps"], oracle["instant"]
    result: dict[str, Any] = {"ok": True, "problems": []}
    if instant and abs(instant["run_peak"] - steps["run_peak"]) > 0.001 * steps["run_peak"]:
        instant = None
        result["instant"] = "not faithful: the categories are not judged"
    peak = report.get("peak", {}).get("allocated_bytes")
    cuda = steps["device"] == "cuda"
    if not cuda:  # the CPU: the recorded storages' highest point (--detail modules, lines)
        peak = (report.get("attribution") or {}).get("peak_bytes")
    truth_peak = steps["run_peak"] if cuda else (instant or {}).get("allocated_bytes")
    result["peak"] = peak
    result["oracle_peak"] = truth_peak
    if peak is not None and truth_peak is not None and peak != truth_peak:
        result["problems"].append(f"peak {peak} != oracle {truth_peak}")
    cats = report.get("categories_at_peak") or {}
    result["categories"] = cats
    if instant and instant.get("instant"):
        truth = instant["instant"]["categories"]
        base = truth_peak or instant["instant"]["allocated_bytes"]
        diffs = {}
        # the CPU with the default detail reports the objects' bytes, at no instant: their
        # parameters and buffers are the peak's, gradients and state the highest held
        at_peak = cuda or report.get("categories_source") != "objects"
        for key in OBJECT_CATEGORIES if at_peak else ("parameters", "buffers"):
            ours = cats.get(key)
            if ours is None:
                continue
            d = ours - truth[key]
            diffs[key] = d
            if abs(d) > max(OBJECT_SHARE * truth[key], 0.0001 * base):
                result["problems"].append(f"{key} {ours} vs oracle {truth[key]}")
        if cats.get("activations") is not None:
            rest = sum(cats.get(k) or 0 for k in ("activations", "temporaries", "other"))
            d = rest - truth["activations"] - truth["temporaries"]
            diffs["rest"] = d
            if base and abs(d) > REST_SHARE * base:
                result["problems"].append(f"rest {rest} vs oracle {rest - d} ({d / base:+.2%})")
        result["differences"] = diffs
    if cuda:
        tail = steps.get("tail")
        all_steps = [*steps["steps"], *([] if tail is None else [tail])]
        bad = []
        for entry in report.get("steps") or []:
            first = entry["index"]
            last = entry.get("last_index") if entry.get("last_index") is not None else first
            if last >= len(all_steps) or entry.get("peak_allocated_bytes") is None:
                continue
            truth = max(all_steps[first : last + 1])
            if entry["peak_allocated_bytes"] != truth:
                bad.append(f"steps {first}-{last}: {entry['peak_allocated_bytes']} vs {truth}")
        if bad:
            result["problems"].append("step entries: " + "; ".join(bad[:4]))
        result["step_entries_checked"] = len(report.get("steps") or [])
    result["ok"] = not result["problems"]
    return result


def check_script(
    name: str, out: Path, details: list[str], small: bool, timeout: float, judge: bool = False
) -> dict:
    """The oracle's two passes and a vramscope run per detail on one script, compared.
    ``judge``: nothing is run; the files a earlier run left in ``out`` are compared."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    script, extra = SCRIPTS[name]
    path = str(SCRIPTS_DIR / script)
    args = [*extra, *(["--small"] if small else [])]
    row: dict[str, Any] = {"script": name, "runs": {}}
    passes: dict[str, Any] = {}
    for which in ("steps", "instant"):
        target = passes.get("steps", {}) or {}
        dest = out / f"{name}.oracle-{which}.json"
        cmd = [sys.executable, __file__, "probe", "--pass", which, "--json", str(dest)]
        if which == "instant" and target.get("run_peak"):
            cmd += ["--target", str(target["run_peak"])]
        code, text = (
            (None, "not in the folder") if judge else _run([*cmd, path, *args], timeout, env)
        )
        data = _load(dest)
        if data is None:
            row["error"] = f"oracle pass {which} failed ({code}): {text[-1500:]}"
            break
        passes[which] = data
    row["oracle"] = passes
    if "error" not in row:
        gap = abs(passes["instant"]["run_peak"] - passes["steps"]["run_peak"])
        row["faithful"] = gap <= 0.001 * passes["steps"]["run_peak"]
    for detail in details:
        dest = out / f"{name}.vramscope-{detail}.json"
        cmd = [sys.executable, "-m", "vramscope", "run", "--detail", detail, "--json", str(dest)]
        code, text = (
            (None, "not in the folder") if judge else _run([*cmd, path, *args], timeout, env)
        )
        report = _load(dest)
        if report is None:
            problem = f"no report ({code}): {text[-800:]}"
            row["runs"][detail] = {"ok": False, "problems": [problem]}
        elif "error" in row:
            row["runs"][detail] = {"ok": False, "problems": ["no oracle"]}
        else:
            row["runs"][detail] = compare(passes, report)
    same = [run.get("categories") for run in row["runs"].values() if run.get("categories")]
    if len(same) > 1:
        row["details_agree"] = all(
            all(c.get(k) == same[0].get(k) for k in OBJECT_CATEGORIES) for c in same
        )
    return row


def drive(ns: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    names = ns.only or list(SCRIPTS)
    with ThreadPoolExecutor(max_workers=max(1, ns.jobs)) as pool:
        futures = [
            pool.submit(check_script, name, out, ns.details, ns.small, ns.timeout, ns.judge)
            for name in names
        ]
        rows = []
        for future in futures:
            rows.append(future.result())
            print(_row_text(rows[-1]), flush=True)
    meta = _meta()
    if ns.judge:  # not this machine's: the machine and day of the run that left the files
        meta = {"judged": meta["date"], "judged_from": "the files of an earlier run"}
        for path in sorted(out.glob("*.vramscope-default.json")):
            report = _load(path) or {}
            device = report.get("device") or {}
            meta.update(
                date=(report.get("created_at") or "")[:10],
                torch=device.get("torch_version"),
                python=device.get("python_version"),
                device=device.get("name"),
                gpu=device.get("name") if device.get("type") == "cuda" else None,
            )
            break
    meta["small"] = ns.small
    (out / "oracle_results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out / "oracle_results.txt").write_text(_table(rows, meta))
    print(_table(rows, meta))
    return (
        0
        if all(r.get("runs") and all(x.get("ok") for x in r["runs"].values()) for r in rows)
        else 1
    )


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f}"


def _row_text(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['script']}: {row['error'].splitlines()[0]}"
    parts = [row["script"]]
    for detail, run in row["runs"].items():
        parts.append(f"{detail}: {'ok' if run.get('ok') else '; '.join(run['problems'])[:300]}")
    return " | ".join(parts)


def _table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "What the peak is made of, MiB: oracle and vramscope (parameters / buffers / gradients / "
        "optimizer state / rest)",
        "",
        "| script | oracle peak | oracle P/B/G/O/rest | detail | vramscope P/B/G/O/rest | "
        "steps | in target |",
        "|---|---:|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(
                f"| {row['script']} | error | {row['error'].splitlines()[0][:80]} | | | | |"
            )
            continue
        inst = (row["oracle"]["instant"].get("instant") or {}).get("categories") or {}
        peak = (
            row["oracle"]["steps"]["run_peak"]
            if row["oracle"]["steps"]["device"] == "cuda"
            else (row["oracle"]["instant"].get("instant") or {}).get("allocated_bytes")
        )
        oracle = (
            "/".join(_mib(inst.get(k)) for k in OBJECT_CATEGORIES)
            + "/"
            + _mib(
                (inst.get("activations") or 0) + (inst.get("temporaries") or 0) if inst else None
            )
        )
        faithful = "" if row.get("faithful", True) else " (instant pass not faithful)"
        for detail, run in row["runs"].items():
            cats = run.get("categories") or {}
            rest = None
            if cats.get("activations") is not None:
                rest = sum(cats.get(k) or 0 for k in ("activations", "temporaries", "other"))
            ours = "/".join(_mib(cats.get(k)) for k in OBJECT_CATEGORIES) + "/" + _mib(rest)
            steps = run.get("step_entries_checked", "-")
            ok = "yes" if run.get("ok") else "no: " + "; ".join(run.get("problems", []))[:160]
            lines.append(
                f"| {row['script']}{faithful} | {_mib(peak)} | {oracle} | {detail} | {ours} | "
                f"{steps} | {ok} |"
            )
    lines += ["", f"{meta['device']}, torch {meta['torch']}, {meta['date']}."]
    return "\n".join(lines) + "\n"


def _meta() -> dict[str, Any]:
    import torch

    meta: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        meta["device"] = meta["gpu"] = torch.cuda.get_device_name(0)
    else:
        meta["device"] = meta["cpu"] = f"CPU ({platform.machine()}, {os.cpu_count()} CPUs)"
    return meta


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "probe":
        return probe_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "oracle_out"))
    parser.add_argument("--only", nargs="*", choices=list(SCRIPTS))
    parser.add_argument("--details", nargs="*", default=["default", "modules", "lines"])
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--small", action="store_true", help="the scripts' small sizes (CPU)")
    parser.add_argument("--jobs", type=int, default=1, help="scripts checked at once")
    parser.add_argument(
        "--judge", action="store_true", help="run nothing: compare the files already in --out"
    )
    return drive(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
