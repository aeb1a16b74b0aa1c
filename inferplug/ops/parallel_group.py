"""The collectives a tensor-parallel DecoderModel calls; `SINGLE` is the one-device no-op set."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class SingleDevice:
    size, rank = 1, 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def embed(self, ids: torch.Tensor, table) -> torch.Tensor:
        """`table`: the float embedding, or a GGUF's in its own blocks (quant/block_linear.BlockLinear.rows)."""
        return F.embedding(ids, table) if isinstance(table, torch.Tensor) else table.rows(ids)

    def gather_logits(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        return logits


SINGLE = SingleDevice()


class TensorParallelGroup(SingleDevice):
    """This process's rank in torch.distributed's default group (gloo on the CPU, NCCL on CUDA)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(x)
        return x

    def embed(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """The vocabulary-parallel embedding: each rank looks up the ids in its rows, zeros elsewhere, summed."""
        local = ids - self.rank * table.shape[0]
        mine = (local >= 0) & (local < table.shape[0])
        x = F.embedding(local.clamp(0, table.shape[0] - 1), table) * mine[:, None]
        return self.all_reduce(x)

    def gather_logits(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Each rank's vocabulary slice of the logits, joined (and cut to the real vocabulary: the last slice is
        padded)."""
        import torch.distributed as dist

        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.all_gather(parts, logits.contiguous())
        return torch.cat(parts, dim=-1)[..., :vocab_size]
