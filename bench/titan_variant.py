"""The titan example as another torchtitan-style script might write it, for bench/resize.py --script titan-variant.

What differs from examples/train_titan.py: tied embeddings, bf16 `MixedPrecisionPolicy`, the last layer kept
unsharded after its forward, torchtitan's gradient clipping, AdamW with `foreach`, a warm-up then cosine schedule;
still only the documented `Elastic` calls. The same flags and output lines.
"""

from __future__ import annotations

import math
import os
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.optim.lr_scheduler import LambdaLR

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trainer_shim
from examples.train_fsdp import World, tokens
from examples.train_titan import Transformer, parse_args, run
from trainer_shim.data import ElasticSampler, GlobalBatch

WARMUP, DECAY = 10, 2000  # steps of the learning rate's linear warm-up, then of its cosine decay


def lr_factor(step: int) -> float:
    return min(1.0, (step + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * min(step, DECAY) / DECAY))


def main() -> int:
    args = parse_args()
    device = torch.device("cpu")
    session = trainer_shim.init()
    data = tokens()
    sampler = ElasticSampler(data.shape[0], seed=7)
    w = World()
    w.max_norm = 1.0
    precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

    def on_world(rank: int, size: int) -> None:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        shape = (size // per_node, per_node) if size % per_node == 0 else (1, size)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("dp_replicate", "dp_shard"))
        with torch.device("meta"):
            model = Transformer(args.dim, args.layers, args.heads)
            model.output.weight = model.tok_embeddings.weight  # tied
        last = len(model.layers) - 1
        for i, layer in model.layers.items():
            fully_shard(layer, mesh=mesh, mp_policy=precision, reshard_after_forward=int(i) < last)
        fully_shard(model, mesh=mesh, mp_policy=precision, reshard_after_forward=True)
        model.to_empty(device=device)
        torch.manual_seed(0)
        with torch.no_grad():
            model.init_weights()
        w.model, w.rank, w.size, w.mesh = model, rank, size, shape
        w.opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, foreach=True)
        w.schedule = LambdaLR(w.opt, lr_factor)
        w.gb = GlobalBatch.fit(args.batch, size, args.micro)

    run(args, session, w, sampler, data, device, on_world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
