"""Every collective of a multi-process segment gets its tensor on the device of the group's backend.

NCCL (the GPU backend Ray Train starts) refuses a tensor exactly when it is not a CUDA tensor; validation loss used
to all-reduce a CPU float64 tensor, a certain crash with more than one GPU per segment. No CUDA here, so the check is
in two parts that together give NCCL safety: `backend_device` maps nccl to CUDA and gloo to CPU; and on a real gloo
group, torch.distributed's own all_reduce/all_gather are wrapped to record each tensor they receive and the device
`collective_device()` names for the group, then run. Every collective of evaluation, the expert-load reduction and
the step's loss reduction must receive its tensor on that device (so under NCCL, on CUDA), whatever device the
caller's tensor was on. The evaluation runs as rank 0 of 2 over the one-process group, so its collective runs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from upscale.workers.evaluate import reduce_expert_counts, val_loss
from upscale.workers.model import UpscaleLM
from upscale.workers.parallel import Ranks, backend_device, collective_device

TWO = Ranks(rank=0, world=2)


def test_backend_device_is_cuda_for_nccl_and_cpu_for_gloo() -> None:
    assert backend_device("nccl") == torch.device("cuda")
    assert backend_device("cpu:gloo,cuda:nccl") == torch.device("cuda")
    assert backend_device("gloo") == torch.device("cpu")


@pytest.fixture
def received(dist_group: None, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, torch.device, torch.device]]:
    """(collective, tensor's device, the group's device) for every all_reduce / all_gather from now on."""
    calls: list[tuple[str, torch.device, torch.device]] = []
    for name in ("all_reduce", "all_gather"):
        real = getattr(dist, name)

        def spy(*args, _name=name, _real=real, **kwargs):
            tensor = args[1] if _name == "all_gather" else args[0]
            calls.append((_name, tensor.device, collective_device(kwargs.get("group"))))
            return _real(*args, **kwargs)

        monkeypatch.setattr(dist, name, spy)
    return calls


def test_evaluation_and_reductions_hand_collectives_the_groups_device(
        received: list, dense_model: UpscaleLM, tokens: torch.Tensor) -> None:
    loss = val_loss(dense_model, [tokens, tokens[:4]], "cpu", TWO)  # float64 sums built on the host
    model = UpscaleLM.__new__(UpscaleLM)
    torch.nn.Module.__init__(model)
    model.expert_counts = [torch.tensor([3, 5]), torch.tensor([8, 0])]
    reduce_expert_counts(model, TWO)
    means = TWO.mean(torch.tensor([2.0, 4.0]))
    assert len(received) == 4  # val_loss once, one per MoE layer, the step's loss mean
    assert all(got == want for _, got, want in received), received
    # one-process group: the "sum over ranks" is the rank's own value, back on the caller's device
    assert loss > 0 and model.expert_counts[0].tolist() == [3, 5] and means.tolist() == [1.0, 2.0]
