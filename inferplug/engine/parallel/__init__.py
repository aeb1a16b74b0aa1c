"""Megatron-style tensor parallelism for the native engine (vLLM / nano-vllm's recipe, our own code).

- models/shard.py: each rank's slice of the checkpoint: q/k/v and gate/up by output rows (whole heads), o and down by
  input columns, the embedding and the head by vocabulary rows; norms whole. The KV pool follows the KV heads.
- ops/parallel_group.py: the collectives the model calls: one all-reduce after o and after down, one after the
  vocabulary-parallel embedding, one gather of the head's logits (torch.distributed: gloo on CPU, NCCL on CUDA).
- worker.py: ranks 1..N-1, each a spawned process that receives every step's rows from rank 0 and runs them.
- runner.py: rank 0's ModelRunner: spawns the workers, sends each step's rows, stops them on close.
The scheduler, the block accounting and sampling live on rank 0 only; the workers' pools mirror its block ids.
"""
