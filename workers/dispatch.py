"""Dropless grouped dispatch for DeepSpeed's MoE layer (docs/methods.md, "Dispatch").

DeepSpeed's `MOELayer` copies every routed token into an [experts, capacity, d] buffer whose capacity, with
`drop_tokens=False`, is the largest expert's token count: every expert computes as many rows as the busiest one,
and with expert parallelism the all-to-all moves that padded buffer. `GroupedMOELayer` keeps DeepSpeed's gate (its
routing decisions, gate values and load-balancing loss, computed by the very same call), its experts, its
expert-parallel group and its parameter names (so engines and checkpoints are unchanged), and replaces only the
way tokens reach the experts and come back:

1. the k·S (token, expert) pairs are sorted by expert (stable), so each expert's rows are contiguous;
2. with expert parallelism the per-expert counts are exchanged first, then one all-to-all with per-rank split sizes
   sends each rank exactly the rows of its local experts (no padding), and the rows are regrouped by local expert;
3. each local expert runs on its rows only: one GEMM chain per expert on CPU, `torch._grouped_mm` on CUDA in bf16
   where the widths meet its 16-byte alignment (`grouped_mm_dtype`), the GEMM chains otherwise;
4. the rows go back (the reverse all-to-all), are unsorted, and are summed over the k routes weighted by the gate
   in fp32, the same arithmetic as DeepSpeed's `_sparse_decode`.

DeepSpeed is imported lazily (`grouped_moe_layer_class`) so that importing the model does not import it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    """The inverse of a permutation (index_select with it undoes index_select with `perm`)."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return inv


def grouped_mm_dtype(device_type: str, dtype: torch.dtype, d_model: int, d_expert: int) -> torch.dtype | None:
    """bf16 where `torch._grouped_mm` is the fast path for experts of widths d_model -> d_expert -> d_model computing
    in `dtype` on `device_type`; None = the loop of GEMMs.

    The fast path needs CUDA, bf16, and every operand's row stride a multiple of 16 bytes (torch's check, also on
    its meta kernel: "strides should be multiple of 16 bytes"): the input rows and stacked weights have strides
    d_model and d_expert, so both widths must be multiples of 8 bf16 values. An imported model or a fine expert
    split (d_model 36, a d_ff/n slice) runs the loop rather than failing."""
    if device_type != "cuda" or dtype != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        return None
    per_row = 16 // dtype.itemsize
    return dtype if d_model % per_row == 0 and d_expert % per_row == 0 else None


def _compute_dtype(rows: torch.Tensor) -> torch.dtype:
    """The dtype the experts' GEMMs run in: the autocast dtype when autocast is on for the rows' device."""
    device = rows.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rows.dtype


def experts_loop(experts: list[nn.Module], rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Each expert on its contiguous slice of `rows` (counts[i] rows for expert i), concatenated in order."""
    return torch.cat([e(part) for e, part in zip(experts, rows.split(counts), strict=True)])


def experts_grouped_mm(experts: list[nn.Module], rows: torch.Tensor, counts: list[int],
                       dtype: torch.dtype) -> torch.Tensor:
    """The same as `experts_loop` for SwiGLU experts through three `torch._grouped_mm` calls (one per matrix)."""
    offs = torch.tensor(counts, device=rows.device).cumsum(0).to(torch.int32)

    def stacked(name: str) -> torch.Tensor:  # [experts, in, out]: nn.Linear stores out x in
        return torch.stack([getattr(e, name).weight for e in experts]).transpose(1, 2).to(dtype)

    x = rows.to(dtype)
    with torch.autocast(rows.device.type, enabled=False):
        gate = torch._grouped_mm(x, stacked("w_gate"), offs=offs)
        h = F.silu(gate) * torch._grouped_mm(x, stacked("w_up"), offs=offs)
        return torch._grouped_mm(h, stacked("w_down"), offs=offs)


class _AllToAllV(torch.autograd.Function):
    """all_to_all_single with per-rank split sizes; the backward is the reverse exchange."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        import torch.distributed as dist

        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = rows.new_empty((sum(recv), *rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _AllToAllV.apply(grad.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None


def grouped_moe_layer_class() -> type:
    """`MOELayer` with the grouped dispatch; built lazily so that importing this module does not import DeepSpeed."""
    import torch.distributed as dist
    from deepspeed.moe.sharded_moe import MOELayer

    class GroupedMOELayer(MOELayer):
        def forward(self, *input: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            hidden = input[0]
            d_model = hidden.shape[-1]
            x = hidden.reshape(-1, d_model)
            used_token = input[1] if len(input) > 1 else None
            # DeepSpeed's gate in its sparse form: indices/gates [k, S], route-major; nothing is dropped
            self.l_aux, _, n_expert, indices, _, gates, self.exp_counts = self.gate(x, used_token, True, False)
            k, s = indices.shape
            expert = indices.reshape(-1).long()
            order = torch.argsort(expert, stable=True)
            counts = torch.bincount(expert, minlength=n_expert)
            rows = x.index_select(0, order % s)  # flat route-major index i is token i % S
            out = self._local_experts(rows, counts) if self.ep_size == 1 else self._exchanged(rows, counts)
            routed = out.index_select(0, _inverse(order)).view(k, s, d_model)
            # fp32 gate values: the product and the sum over routes in fp32, as DeepSpeed's _sparse_decode
            combined = (routed * gates.unsqueeze(-1)).sum(0).to(out.dtype)
            return combined.reshape(hidden.shape)

        def _local_experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
            experts = list(self.experts.deepspeed_experts)
            sizes = counts.tolist()
            dtype = grouped_mm_dtype(rows.device.type, _compute_dtype(rows), rows.shape[-1],
                                     experts[0].w_gate.out_features)
            if dtype is None:
                return experts_loop(experts, rows, sizes)
            return experts_grouped_mm(experts, rows, sizes, dtype)

        def _exchanged(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
            """Rows sorted by global expert -> the ranks owning those experts -> back, with exact split sizes."""
            ep, local = self.ep_size, self.num_local_experts
            # recv_by_expert[j, i]: rows rank j sends to this rank's local expert i
            recv_by_expert = torch.empty_like(counts)
            dist.all_to_all_single(recv_by_expert, counts.contiguous(), group=self.ep_group)
            recv_by_expert = recv_by_expert.view(ep, local)
            send = counts.view(ep, local).sum(1).tolist()
            recv = recv_by_expert.sum(1).tolist()
            got = _AllToAllV.apply(rows, send, recv, self.ep_group)
            # received rows are ordered (source rank, local expert): regroup them by local expert
            local_id = torch.arange(local, device=rows.device).repeat(ep).repeat_interleave(recv_by_expert.flatten())
            regroup = torch.argsort(local_id, stable=True)
            out = self._local_experts(got.index_select(0, regroup), recv_by_expert.sum(0))
            return _AllToAllV.apply(out.index_select(0, _inverse(regroup)), recv, send, self.ep_group)

    return GroupedMOELayer
