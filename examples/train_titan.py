"""A torchtitan-shaped sharded job: a Llama-style model built on the meta device, HSDP, AdamW with a warm-up.

Written the way torchtitan writes its training, with only trainer_shim's documented calls: the model is built
on the meta device, `fully_shard` per layer (`reshard_after_forward`) then at the root, `to_empty` and
`init_weights`; the mesh is named (`dp_replicate`, `dp_shard`): a node's workers shard, nodes are replicas;
AdamW and a warm-up `LambdaLR` are in the state; `ElasticSampler` deals synthetic tokens; `elastic.save()`
every --ckpt-every steps. Under elasticd the workers that stay keep their processes through every change.
Usage: train_titan.py --steps N --ckpt-dir DIR [--layers 4] [--dim 64] [--ckpt-every 50] [--step-time S]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.optim.lr_scheduler import LambdaLR

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trainer_shim
from examples.train_fsdp import SEQ, VOCAB, World, add_loop_args, tokens, train
from trainer_shim.data import ElasticSampler, GlobalBatch

WARMUP = 20  # steps of the learning rate's linear warm-up


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    add_loop_args(parser, ckpt_every=50)
    return parser.parse_args()


class Attention(torch.nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        # Rotary angles: a buffer recomputed by `init_weights` (a meta tensor until then), never saved.
        self.register_buffer("rope", torch.empty(SEQ, dim // heads // 2), persistent=False)

    def init_weights(self, std: float) -> None:
        half = self.rope.shape[1]
        freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32, device=self.rope.device) / half))
        self.rope.copy_(torch.outer(torch.arange(SEQ, dtype=torch.float32, device=self.rope.device), freqs))
        for linear in (self.wq, self.wk, self.wv):
            torch.nn.init.trunc_normal_(linear.weight, std=0.02)
        torch.nn.init.trunc_normal_(self.wo.weight, std=std)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        cos, sin = self.rope.cos(), self.rope.sin()
        return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).type_as(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = (w(x).view(batch, seq, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(self.rotate(q), self.rotate(k), v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, dim))


class FeedForward(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        hidden = 4 * dim * 2 // 3
        self.w1, self.w3 = torch.nn.Linear(dim, hidden, bias=False), torch.nn.Linear(dim, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, dim, bias=False)

    def init_weights(self, std: float) -> None:
        torch.nn.init.trunc_normal_(self.w1.weight, std=0.02)
        for linear in (self.w2, self.w3):
            torch.nn.init.trunc_normal_(linear.weight, std=std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(torch.nn.Module):
    def __init__(self, dim: int, heads: int, layer: int) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = torch.nn.RMSNorm(dim), torch.nn.RMSNorm(dim)
        self.attention, self.feed_forward = Attention(dim, heads), FeedForward(dim)
        self.std = 0.02 / math.sqrt(2 * (layer + 1))  # torchtitan's depth-scaled init

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.std)
        self.feed_forward.init_weights(self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(torch.nn.Module):
    def __init__(self, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(VOCAB, dim)
        self.layers = torch.nn.ModuleDict({str(i): TransformerBlock(dim, heads, i) for i in range(layers)})
        self.norm = torch.nn.RMSNorm(dim)
        self.output = torch.nn.Linear(dim, VOCAB, bias=False)

    def init_weights(self) -> None:
        torch.nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()  # type: ignore[operator]
        self.norm.reset_parameters()
        torch.nn.init.trunc_normal_(self.output.weight, std=self.output.in_features ** -0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            x = layer(x)
        return self.output(self.norm(x))


def main() -> int:
    args = parse_args()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() \
        else torch.device("cpu")
    session = trainer_shim.init()
    data = tokens()
    sampler = ElasticSampler(data.shape[0], seed=42)
    w = World()

    def on_world(rank: int, size: int) -> None:
        """A new world: the named HSDP mesh, the model on meta, sharded per layer, materialized, its optimizer and
        schedule. The shim heals the state after."""
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        shape = (size // per_node, per_node) if size % per_node == 0 else (1, size)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("dp_replicate", "dp_shard"))
        with torch.device("meta"):
            model = Transformer(args.dim, args.layers, args.heads)
        for layer in model.layers.values():
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        model.to_empty(device=device)
        torch.manual_seed(0)
        with torch.no_grad():
            model.init_weights()
        w.model, w.rank, w.size, w.mesh = model, rank, size, shape
        w.opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        w.schedule = LambdaLR(w.opt, lambda step: min(1.0, (step + 1) / WARMUP))
        w.gb = GlobalBatch.fit(args.batch, size, args.micro)

    run(args, session, w, sampler, data, device, on_world)
    return 0


def run(args: argparse.Namespace, session: trainer_shim.Session | trainer_shim.NullSession, w: World,
        sampler: ElasticSampler, data: torch.Tensor, device: torch.device,
        on_world: Callable[[int, int], None]) -> None:
    """The state through DCP (model, optimizer, schedule), `Elastic` around `on_world`, then the training loop."""

    def get_state() -> dict:
        model, optim = get_state_dict(w.model, w.opt)
        return {"model": model, "optim": optim, "lr_scheduler": w.schedule.state_dict()}

    def set_state(state: dict) -> None:
        set_state_dict(w.model, w.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        w.schedule.load_state_dict(state["lr_scheduler"])

    elastic = trainer_shim.Elastic(session, state_dict=get_state, load_state_dict=set_state, on_world=on_world,
                                   sampler=sampler, sharded=True, checkpoint_dir=args.ckpt_dir,
                                   in_place=not args.no_in_place)
    elastic.init()
    train(args, elastic, session, w, sampler, data, device)


if __name__ == "__main__":
    sys.exit(main())
