"""Collectives and point-to-point ops on CUDA tensors carried over gloo through CPU copies,
for the measured rank jobs of ``distributed_accuracy.py`` (``install()``, in the rank job).

Why it exists. The benchmark measures a multi-rank job with every rank on the one GPU of the
host: NCCL does not run two ranks of a communicator on one device, so the job runs over gloo.
gloo has no CUDA path for some of what the parallel code calls, and the job dies there:

* point to point (``dist.isend``/``irecv``/``send``/``recv``, what a pipeline's stages and
  ``send_object_list`` call): gloo's transport is handed the device pointer (torch 2.11 on an
  H200: ``writev ... Bad address``, the rank aborts);
* torch's functional collectives (``torch.ops._c10d_functional``: DTensor's redistributions
  in tensor parallel, context parallel's ring attention, ``all_to_all_single_autograd`` of
  expert parallel): the functional all-gather is the group's
  ``allgather_into_tensor_coalesced``, which gloo runs on device pointers (SIGSEGV).

What it does. With ``install()``, every such op whose tensors are on a device is carried out
on CPU copies over the same gloo group and its results are copied into the device tensors
the op was given, or that it returns:

* the functional collectives (and DTensor's ``_dtensor.shard_dim_alltoall``): kernels for
  the ``CUDA`` dispatch key (``torch.library``), ahead of torch's own
  ``CompositeExplicitAutograd`` ones; each allocates its output on the device as torch's
  kernel does (``Functional.cpp``: the all-gather's and all-to-all's new output, the
  all-reduce's and broadcast's contiguous clone), runs the collective on CPU copies through
  the group's own methods and copies the result into the output. The work is done when the
  kernel returns, so ``wait_tensor`` has nothing to wait for;
* ``dist.isend``, ``irecv``, ``send``, ``recv`` and the tensor collectives FSDP2 calls
  (``all_gather_into_tensor``/``all_gather_single``, ``reduce_scatter_tensor``/
  ``reduce_scatter_single``, ``all_reduce``, ``broadcast``): replaced, in
  ``torch.distributed`` and its ``distributed_c10d`` (where ``P2POp`` and
  ``batch_isend_irecv`` look them up), by functions that call torch's own on CPU copies. A
  receive copies into the device tensor when its work is waited on; an asynchronous
  collective is done at once and returns a finished ``dist.Work``.

Why it does not change the device memory measured. The device tensors are those the job
makes over NCCL: the parallel code allocates its receive buffers and collective outputs
itself, and the functional kernels allocate theirs as torch's do, in the same order. The
staging adds none: a device tensor's copy to the CPU (``Tensor.cpu()`` of a contiguous
tensor) and a CPU tensor's copy into a device tensor (``copy_``) allocate nothing on the
device, and every temporary here is a CPU tensor. Tensors that are not contiguous are
refused (a device-to-host copy of one would make a contiguous device temporary; NCCL needs
them contiguous too). So the caching allocator sees the allocations of the same job over
NCCL, and its peaks are compared with estimates made for NCCL. Unlike gloo's own CUDA paths
(pinned host copies, a device copy of each reduce-scatter input), nothing of gloo's is on
the device either.

What it does not capture. NCCL's own device memory (its buffers per communicator, outside
the caching allocator), which a job over gloo never had either: device used is compared
without it. Nor NCCL's streams: a collective here is done, synchronously, on the caller's
stream, where NCCL runs it on its own stream and the caching allocator may keep an input's
block until that stream is done with it (``recordStream``); the peaks can differ by such a
block where a collective overlaps the frees after it. DDP's reducer calls its group from
C++ (not staged): its all-reduces keep gloo's CUDA path, pinned host copies, nothing on
the device.

``VRAMSCOPE_STAGE_CPU=1`` (or ``install(cpu=True)``) stages CPU tensors too, each through a
clone, so that the whole path runs on a machine without a GPU (``--allow-cpu --stage-cpu``).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

ENV = "VRAMSCOPE_STAGE_CPU"
_STATE: dict[str, Any] = {"installed": False, "cpu": False, "libraries": []}
COUNTS: dict[str, int] = {}  # staged calls by op name
_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}


def staged(tensor: Any) -> bool:
    """Whether ``tensor`` goes through CPU copies: on a device, or on the CPU when forced."""
    if not isinstance(tensor, torch.Tensor):
        return False
    return tensor.device.type != "cpu" or _STATE["cpu"]


def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``tensor``'s values (a clone of a CPU tensor); nothing on the device."""
    if not tensor.is_contiguous():
        raise RuntimeError(
            "staged_gloo: a tensor that is not contiguous (its copy to the host would make a "
            f"contiguous device temporary; NCCL needs it contiguous too): {tuple(tensor.shape)} "
            f"strides {tensor.stride()}"
        )
    return tensor.clone() if tensor.device.type == "cpu" else tensor.cpu()


def cpu_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")


# ---- the functional collectives: kernels for the device's dispatch key --------------------


def _group(name: Any) -> Any:
    return torch._C._distributed_c10d._resolve_process_group(name)


def _all_reduce_cpu(tensor: torch.Tensor, reduce_op: str, pg: Any) -> None:
    """``tensor`` (CPU) all-reduced in place over ``pg``; ``avg`` as a sum divided."""
    op = _REDUCE_OPS.get(reduce_op, dist.ReduceOp.SUM if reduce_op == "avg" else None)
    if op is None:
        raise RuntimeError(f"staged_gloo: reduce op {reduce_op!r} is not staged")
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    pg.allreduce([tensor], opts).wait()
    if reduce_op == "avg":
        tensor.div_(pg.size())


def _all_gather_into(out: torch.Tensor, input: torch.Tensor, pg: Any) -> torch.Tensor:
    cpu_out = cpu_like(out)
    pg._allgather_base(cpu_out, to_cpu(input)).wait()
    return out.copy_(cpu_out)


def _reduce_scatter_into(
    out: torch.Tensor, input: torch.Tensor, reduce_op: str, pg: Any
) -> torch.Tensor:
    whole = to_cpu(input)
    _all_reduce_cpu(whole, reduce_op, pg)  # on the CPU: this rank's chunk of the whole
    return out.copy_(whole.reshape(-1)[pg.rank() * out.numel() :][: out.numel()].view(out.shape))


def _gathered_shape(input: torch.Tensor, group_size: int) -> list[int]:
    shape = list(input.shape)
    if shape:
        shape[0] *= group_size
    else:
        shape = [group_size]
    return shape


def all_gather_into_tensor(input: torch.Tensor, group_size: int, group_name: Any) -> torch.Tensor:
    out = torch.empty(_gathered_shape(input, group_size), dtype=input.dtype, device=input.device)
    return _all_gather_into(out, input, _group(group_name))


def all_gather_into_tensor_coalesced(
    inputs: list[torch.Tensor], group_size: int, group_name: Any
) -> list[torch.Tensor]:
    outs = [
        torch.empty(_gathered_shape(t, group_size), dtype=t.dtype, device=t.device) for t in inputs
    ]
    pg = _group(group_name)
    return [_all_gather_into(out, t, pg) for out, t in zip(outs, inputs, strict=True)]


def all_gather_into_tensor_out(
    input: torch.Tensor, group_size: int, group_name: Any, *, out: torch.Tensor
) -> torch.Tensor:
    return _all_gather_into(out, input, _group(group_name))


def _scattered_shape(input: torch.Tensor, group_size: int) -> list[int]:
    shape = list(input.shape)
    shape[0] //= group_size
    return shape


def reduce_scatter_tensor(
    input: torch.Tensor, reduce_op: str, group_size: int, group_name: Any
) -> torch.Tensor:
    shape = _scattered_shape(input, group_size)
    out = torch.empty(shape, dtype=input.dtype, device=input.device)
    return _reduce_scatter_into(out, input, reduce_op, _group(group_name))


def reduce_scatter_tensor_coalesced(
    inputs: list[torch.Tensor], reduce_op: str, group_size: int, group_name: Any
) -> list[torch.Tensor]:
    outs = [
        torch.empty(_scattered_shape(t, group_size), dtype=t.dtype, device=t.device) for t in inputs
    ]
    pg = _group(group_name)
    return [
        _reduce_scatter_into(out, t, reduce_op, pg) for out, t in zip(outs, inputs, strict=True)
    ]


def reduce_scatter_tensor_out(
    input: torch.Tensor, reduce_op: str, group_size: int, group_name: Any, *, out: torch.Tensor
) -> torch.Tensor:
    return _reduce_scatter_into(out, input, reduce_op, _group(group_name))


def all_reduce_(input: torch.Tensor, reduce_op: str, group_name: Any) -> torch.Tensor:
    cpu = to_cpu(input)
    _all_reduce_cpu(cpu, reduce_op, _group(group_name))
    return input.copy_(cpu)


def all_reduce(input: torch.Tensor, reduce_op: str, group_name: Any) -> torch.Tensor:
    return all_reduce_(input.clone(memory_format=torch.contiguous_format), reduce_op, group_name)


def all_reduce_coalesced_(
    inputs: list[torch.Tensor], reduce_op: str, group_name: Any
) -> list[torch.Tensor]:
    return [all_reduce_(t, reduce_op, group_name) for t in inputs]


def all_reduce_coalesced(
    inputs: list[torch.Tensor], reduce_op: str, group_name: Any
) -> list[torch.Tensor]:
    outs = [t.clone(memory_format=torch.contiguous_format) for t in inputs]
    return all_reduce_coalesced_(outs, reduce_op, group_name)


def _all_to_all_into(
    out: torch.Tensor, input: torch.Tensor, out_splits: list, in_splits: list, pg: Any
) -> torch.Tensor:
    cpu_out = cpu_like(out)
    pg.alltoall_base(
        cpu_out, to_cpu(input), [int(s) for s in out_splits], [int(s) for s in in_splits]
    ).wait()
    return out.copy_(cpu_out)


def all_to_all_single(
    input: torch.Tensor, output_split_sizes: list, input_split_sizes: list, group_name: Any
) -> torch.Tensor:
    shape = list(input.shape)
    shape[0] = sum(int(s) for s in output_split_sizes)
    out = input.new_empty(shape)
    return _all_to_all_into(out, input, output_split_sizes, input_split_sizes, _group(group_name))


def broadcast_(input: torch.Tensor, src: int, group_name: Any) -> torch.Tensor:
    cpu = to_cpu(input)
    opts = dist.BroadcastOptions()
    opts.rootRank = src
    _group(group_name).broadcast([cpu], opts).wait()
    return input.copy_(cpu)


def broadcast(input: torch.Tensor, src: int, group_name: Any) -> torch.Tensor:
    return broadcast_(input.clone(memory_format=torch.contiguous_format), src, group_name)


def shard_dim_alltoall(
    input: torch.Tensor, gather_dim: int, shard_dim: int, group_name: Any
) -> torch.Tensor:
    """DTensor's Shard(i) to Shard(j), with the device tensors torch's kernel makes."""
    pg = _group(group_name)
    size = pg.size()
    sizes = list(input.shape)
    sizes[shard_dim] //= size
    sizes.insert(shard_dim, size)
    send = input.view(sizes).movedim(shard_dim, 0).contiguous()
    received = torch.empty_like(send)
    _all_to_all_into(received, send, [], [], pg)
    out_sizes = list(input.shape)
    out_sizes[shard_dim] //= size
    out_sizes[gather_dim] *= size
    return received.movedim(0, gather_dim).contiguous().view(out_sizes)


FUNCTIONAL: dict[str, Callable[..., Any]] = {
    "all_gather_into_tensor": all_gather_into_tensor,
    "all_gather_into_tensor_coalesced": all_gather_into_tensor_coalesced,
    "all_gather_into_tensor_out": all_gather_into_tensor_out,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter_tensor_coalesced": reduce_scatter_tensor_coalesced,
    "reduce_scatter_tensor_out": reduce_scatter_tensor_out,
    "all_reduce": all_reduce,
    "all_reduce_": all_reduce_,
    "all_reduce_coalesced": all_reduce_coalesced,
    "all_reduce_coalesced_": all_reduce_coalesced_,
    "all_to_all_single": all_to_all_single,
    "broadcast": broadcast,
    "broadcast_": broadcast_,
}


def _counted(name: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(kernel)
    def call(*args: Any, **kwargs: Any) -> Any:
        COUNTS[name] = COUNTS.get(name, 0) + 1
        return kernel(*args, **kwargs)

    return call


def _register(keys: list[str]) -> None:
    for namespace, kernels in (
        ("_c10d_functional", FUNCTIONAL),
        ("_dtensor", {"shard_dim_alltoall": shard_dim_alltoall}),
    ):
        ops = getattr(torch.ops, namespace)
        library = torch.library.Library(namespace, "IMPL")
        for name, kernel in kernels.items():
            if not hasattr(ops, name):  # not in this torch
                continue
            for key in keys:
                library.impl(name, _counted(name, kernel), key)
        _STATE["libraries"].append(library)  # kept: a dropped Library takes its kernels away


# ---- torch.distributed's own functions: point to point, and the tensor collectives --------


class Done(dist.Work):
    """The work of a staged op, already done (``wait`` returns at once)."""

    def __init__(self) -> None:
        super().__init__()

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class Received(dist.Work):
    """A staged receive: gloo's work on the CPU buffer, copied into the device tensor when
    waited on."""

    def __init__(self, work: Any, buffer: torch.Tensor, tensor: torch.Tensor) -> None:
        super().__init__()
        self._work, self._buffer, self._tensor = work, buffer, tensor

    def wait(self, timeout: Any = None) -> bool:
        if self._buffer is not None:
            self._work.wait()
            with torch.no_grad():  # a transport's write, as NCCL's: not autograd's
                self._tensor.copy_(self._buffer)
            self._buffer = None
        return True

    def is_completed(self) -> bool:
        return self._buffer is None


def _wrap(original: Callable[..., Any], stage: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` with its arguments bound by name; ``stage(arguments, original)`` when a
    tensor among them is staged, ``original`` as it is otherwise."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        tensors = [v for v in bound.arguments.values() if isinstance(v, torch.Tensor)]
        if not any(staged(t) for t in tensors):
            return original(*args, **kwargs)
        name = original.__name__
        COUNTS[name] = COUNTS.get(name, 0) + 1
        return stage(bound.arguments, original)

    call.__staged__ = original  # type: ignore[attr-defined]
    return call


def _first(arguments: dict, *names: str) -> str:
    return next(n for n in names if n in arguments)


def _isend(arguments: dict, original: Callable[..., Any]) -> Any:
    key = _first(arguments, "tensor")
    return original(**{**arguments, key: to_cpu(arguments[key])})


def _send(arguments: dict, original: Callable[..., Any]) -> Any:
    return _isend(arguments, original)


def _irecv(arguments: dict, original: Callable[..., Any]) -> Any:
    tensor = arguments["tensor"]
    buffer = cpu_like(tensor)
    work = original(**{**arguments, "tensor": buffer})
    return Received(work, buffer, tensor) if work is not None else None


def _recv(arguments: dict, original: Callable[..., Any]) -> Any:
    tensor = arguments["tensor"]
    buffer = cpu_like(tensor)
    source = original(**{**arguments, "tensor": buffer})
    with torch.no_grad():
        tensor.copy_(buffer)
    return source


def _collective(output: str | None, inputs: tuple[str, ...]) -> Callable[..., Any]:
    """A tensor collective of torch.distributed (``output`` written, ``inputs`` read: an
    in-place one names its tensor in both) run on CPU copies, synchronously; its async
    form returns a finished work."""

    def stage(arguments: dict, original: Callable[..., Any]) -> Any:
        out_key = _first(arguments, *output.split("|")) if output else None
        keys = [_first(arguments, *names.split("|")) for names in inputs]
        copies = {key: to_cpu(arguments[key]) for key in keys}
        if out_key is not None and out_key not in copies:
            copies[out_key] = cpu_like(arguments[out_key])
        call = {**arguments, **copies}
        asynchronous = bool(call.get("async_op"))
        if "async_op" in call:
            call["async_op"] = False
        original(**call)
        if out_key is not None:
            with torch.no_grad():
                arguments[out_key].copy_(copies[out_key])
        return Done() if asynchronous else None

    return stage


P2P = {"isend": _isend, "irecv": _irecv, "send": _send, "recv": _recv}
COLLECTIVES = {
    "all_gather_into_tensor": _collective("output_tensor|output", ("input_tensor|input",)),
    "all_gather_single": _collective("output_tensor|output", ("input_tensor|input",)),
    "reduce_scatter_tensor": _collective("output|output_tensor", ("input|input_tensor",)),
    "reduce_scatter_single": _collective("output|output_tensor", ("input|input_tensor",)),
    "all_reduce": _collective("tensor", ("tensor",)),
    "broadcast": _collective("tensor", ("tensor",)),
}


def _replace_functions() -> None:
    for name, stage in {**P2P, **COLLECTIVES}.items():
        original = getattr(c10d, name, None)
        if original is None or hasattr(original, "__staged__"):
            continue
        wrapped = _wrap(original, stage)
        setattr(c10d, name, wrapped)  # what P2POp and batch_isend_irecv compare with
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)


def install(cpu: bool | None = None) -> None:
    """Stage device tensors' collectives and point-to-point ops through CPU copies (see the
    module's docstring); CPU tensors too with ``cpu`` (default: ``VRAMSCOPE_STAGE_CPU=1``).
    Once per process, before the parallel code makes its ops."""
    if _STATE["installed"]:
        return
    if cpu is None:
        cpu = os.environ.get(ENV, "") not in ("", "0")
    _STATE["cpu"] = bool(cpu)
    _register(["CUDA", "CPU"] if cpu else ["CUDA"])
    _replace_functions()
    _STATE["installed"] = True
