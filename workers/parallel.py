"""What changes when one segment trains on several processes: ranks, expert parallelism, full-model views.

A segment with `runtime.workers = W > 1` runs the same `run_segment` on W processes of one torch.distributed group
(Ray Train sets it up; torchrun would do too). The global batch of `batch_size` sequences is the single-process one,
split row-wise across ranks (data parallel: DeepSpeed averages the gradients), so the optimisation is the same one
a single process runs, up to float summation order and one real difference: DeepSpeed's load-balancing loss is
computed per rank over that rank's tokens. MoE layers are expert parallel with `ep_size = gcd(W, n_expert)`:
each rank holds `n_expert / ep_size` experts and tokens reach them through all-to-all.

Everything a segment hands to others stays in the single-process format: the `model/` export of a checkpoint is
the full model (experts gathered from every rank, global expert ids), and a model that starts from such weights
(a fresh init, an upcycled MoE) gives each rank its slice. Only DeepSpeed's own engine state (per-rank optimiser
shards of the experts) depends on ep_size; the checkpoint sidecar records it and a resume with another ep_size is
refused (workers/checkpoints.py).

A collective's tensors must sit on the device of the group's backend (NCCL refuses CPU tensors): small reductions
go through `Ranks`, which moves them to `collective_device()` and back; the MoE all-to-alls move activations, which
are on the model's device, the group's device by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from upscale.workers.errors import WorkerError
from upscale.workers.model import EXPERT_KEY, ModelConfig


@dataclass(frozen=True)
class Ranks:
    """This process's place in the segment's process group (rank 0 alone writes files and logs)."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean over ranks of a small tensor (every rank gets it)."""
        return values if self.world == 1 else self.sum(values) / self.world

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of a small tensor (every rank gets it, on the tensor's own device); it travels on the
        process group's device (`collective_device`), so a CPU tensor may be summed over NCCL."""
        if self.world == 1:
            return values
        moved = values.to(collective_device(), copy=True)
        torch.distributed.all_reduce(moved)
        return moved.to(values.device)

    def rows(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's share of a global batch: an equal, contiguous block of rows."""
        if self.world == 1:
            return batch
        if batch.shape[0] % self.world:
            raise WorkerError(f"a batch of {batch.shape[0]} rows does not split evenly over {self.world} workers")
        per = batch.shape[0] // self.world
        return batch[self.rank * per:(self.rank + 1) * per]


SINGLE = Ranks()


def backend_device(backend: str) -> torch.device:
    """Where a collective's tensors must live for a torch.distributed backend: NCCL accepts CUDA tensors only (on
    the device this process was given: Ray Train and torchrun set it), gloo is upscale's CPU backend."""
    return torch.device("cuda") if "nccl" in backend else torch.device("cpu")


def collective_device(group: object = None) -> torch.device:
    """`backend_device` of a process group (the default one when None)."""
    return backend_device(str(torch.distributed.get_backend(group)))


def current_ranks(workers: int) -> Ranks:
    """The ranks of a segment asked to run on `workers` processes; the process group must already exist."""
    if workers == 1:
        return SINGLE
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise WorkerError(f"workers={workers}: no torch.distributed process group in this process; a multi-process "
                          f"segment is launched by the orchestrator (Ray Train) or torchrun, one process per worker")
    if dist.get_world_size() != workers:
        raise WorkerError(f"workers={workers} but the process group has {dist.get_world_size()} processes")
    return Ranks(dist.get_rank(), workers)


def ep_size_for(cfg: ModelConfig, world: int) -> int:
    """Expert-parallel size on `world` processes: the largest that divides both (1 for a dense model)."""
    return math.gcd(world, cfg.n_expert) if cfg.is_moe else 1


def expert_slice(state_dict: dict[str, torch.Tensor], cfg: ModelConfig, ep_size: int,
                 ep_rank: int) -> dict[str, torch.Tensor]:
    """A full state dict cut to the experts expert-parallel rank `ep_rank` holds, renumbered to local ids."""
    if ep_size == 1:
        return state_dict
    local = cfg.n_expert // ep_size
    out = {}
    for key, value in state_dict.items():
        m = EXPERT_KEY.match(key)
        if m is None:
            out[key] = value
        elif int(m[2]) // local == ep_rank:
            out[f"{m[1]}{int(m[2]) % local}{m[3]}"] = value
    return out


def full_state_dict(module: torch.nn.Module, cfg: ModelConfig, ep_size: int) -> dict[str, torch.Tensor]:
    """The whole model's state dict with global expert ids, gathered over the expert-parallel group (a collective:
    every rank calls it; every rank gets the result)."""
    state = module.state_dict()
    if ep_size == 1:
        return state
    from deepspeed.utils import groups

    group = groups._get_expert_parallel_group(_group_name(ep_size))
    device = collective_device(group)
    local = cfg.n_expert // ep_size
    out = {}
    for key in sorted(state):  # the same order on every rank: the all_gathers pair up
        value = state[key]
        m = EXPERT_KEY.match(key)
        if m is None:
            out[key] = value
            continue
        parts = [torch.empty_like(value, device=device) for _ in range(ep_size)]
        torch.distributed.all_gather(parts, value.to(device).contiguous(), group=group)
        for ep_rank, part in enumerate(parts):
            out[f"{m[1]}{ep_rank * local + int(m[2])}{m[3]}"] = part.to(value.device)
    return out


def expert_parallel_rank(ep_size: int) -> int:
    """This process's rank within its expert-parallel group (DeepSpeed's groups, created by the engine)."""
    if ep_size == 1:
        return 0
    from deepspeed.utils import groups

    return groups._get_expert_parallel_rank(_group_name(ep_size))


def _group_name(ep_size: int) -> str:
    """DeepSpeed-MoE's name for the expert-parallel groups of size `ep_size` (the experts' `group_name`)."""
    return f"ep_size_{ep_size}"
