"""How many sequences a worker passes forward at once when the segment does not say: the largest micro-batch whose
estimated memory (`sweeps.sizes.training_memory`) fits the device, a GPU's memory or the worker's share of the
node's RAM (docs/training.md)."""

from __future__ import annotations

import os

import torch

from upscale.sweeps.sizes import MEMORY_HEADROOM, largest_micro_batch, training_memory
from upscale.workers.errors import WorkerError
from upscale.workers.model import ModelConfig


def device_memory(device: str, num_threads: int) -> int:
    """Bytes a worker may fill: its GPU's memory, or its CPUs' share of the node's physical RAM."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram * min(1.0, num_threads / (os.cpu_count() or 1))


def fitting_micro_batch(cfg: ModelConfig, rows: int, workers: int, checkpointing: bool, memory: float) -> int:
    """The largest micro-batch dividing `rows` (a worker's sequences per step) that fits MEMORY_HEADROOM of `memory`
    bytes; a WorkerError naming the knobs when not even one sequence does."""
    def need(micro: int):
        return training_memory(cfg.shape, cfg.n_expert, cfg.topk, cfg.d_expert, cfg.shared_d_ff, vocab=cfg.vocab_size,
                               context=cfg.context, sequences=micro, workers=workers, checkpointing=checkpointing)

    micro = largest_micro_batch(rows, MEMORY_HEADROOM * memory, need)
    if micro is None:
        one = need(1)
        raise WorkerError(f"one sequence of {cfg.context} tokens needs about {one.total / 2**30:.3g} GiB "
                          f"({one.state / 2**30:.3g} GiB of weights, gradients and AdamW state) but this worker has "
                          f"{memory / 2**30:.3g} GiB: set train.activation_checkpointing, use more resources.workers "
                          f"(experts split over them), or a smaller model or context")
    return micro
