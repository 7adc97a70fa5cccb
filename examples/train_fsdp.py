"""A sharded job (FSDP2, or HSDP: replicas of one node's shards) that keeps its processes through resizes.

A small transformer built from code (nothing downloaded), `fully_shard` per block over a device mesh rebuilt in
`on_world` for each world, AdamW, synthetic tokens dealt by `ElasticSampler`. Under elasticd the workers that
stay keep their processes through joins, drains, scale changes and leaves; a newcomer receives its shards from
the ranks holding them (trainer_shim.heal); a lost shard with no replica falls back to the newest checkpoint,
resharded. Runs under plain torchrun, or as one process with no environment at all.
Usage: train_fsdp.py --steps N --ckpt-dir DIR [--mesh hsdp|fsdp] [--ckpt-every K] [--step-time S]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LRScheduler

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trainer_shim
from trainer_shim.data import ElasticSampler, GlobalBatch

VOCAB, SEQ, DATASET = 256, 16, 4096


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--mesh", choices=("hsdp", "fsdp"), default="hsdp",
                        help="hsdp: (nodes, workers per node), a node's workers shard and nodes are replicas; "
                             "fsdp: every rank holds its own shard, no replica")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    add_loop_args(parser, ckpt_every=0)
    return parser.parse_args()


def add_loop_args(parser: argparse.ArgumentParser, ckpt_every: int) -> None:
    """The options `train` reads (this script's and examples/train_titan.py's)."""
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    parser.add_argument("--ckpt-every", type=int, default=ckpt_every, help="a DCP checkpoint every K steps (0: off)")
    parser.add_argument("--batch", type=int, default=24, help="global batch of sequences over all ranks")
    parser.add_argument("--micro", type=int, default=12, help="largest micro-batch per rank")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra sleep per step (seconds)")
    parser.add_argument("--no-in-place", action="store_true", help="restart on every membership change instead "
                        "(each new process loads the newest checkpoint)")
    parser.add_argument("--steps-file", default="", help="tests: once this file exists, the number in it replaces "
                        "--steps (a test ends the job at a step it picks)")
    parser.add_argument("--digest-log", default="", help="tests: rank 0 appends `round step digest` of the whole "
                        "state as each step begins (the state after the step before)")


class Block(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        # No biases (as in Llama): the key bias gets a zero gradient, whose rounding noise AdamW would amplify.
        self.attn = torch.nn.MultiheadAttention(dim, 4, bias=False, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(torch.nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.pos = torch.nn.Parameter(torch.zeros(SEQ, dim))
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tokens() -> torch.Tensor:
    """Sequences with structure to learn (each token follows from the one before), the same on every rank."""
    g = torch.Generator().manual_seed(1234)
    start = torch.randint(0, VOCAB, (DATASET, 1), generator=g)
    stride = torch.randint(1, 5, (DATASET, 1), generator=g)
    return (start + stride * torch.arange(SEQ + 1)) % VOCAB


class World:
    """What the world decides: the mesh, the sharded model and its optimizer, the batch split."""

    model: Transformer
    opt: torch.optim.Optimizer
    gb: GlobalBatch
    rank, size = 0, 1
    mesh: tuple[int, int] = (1, 1)
    schedule: LRScheduler | None = None  # stepped after the optimizer when the script has one
    max_norm = 0.0  # gradients clipped to this total norm before each update, as torchtitan does (0: never)
    shown = -1  # the round whose world line rank 0 printed


def main() -> int:
    args = parse_args()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if torch.cuda.is_available() \
        else torch.device("cpu")
    session = trainer_shim.init()
    sampler = ElasticSampler(DATASET, seed=42)
    data = tokens()
    w = World()

    def on_world(rank: int, size: int) -> None:
        """A new world: its mesh, the model sharded over it, a new optimizer. The shim heals the state after."""
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        shape = (size // per_node, per_node) if args.mesh == "hsdp" and size % per_node == 0 else (1, size)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))
        torch.manual_seed(0)  # the same start on every rank and in every world: a run is comparable to any other
        model = Transformer(args.dim, args.layers).to(device)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        w.model, w.rank, w.size = model, rank, size
        w.opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        w.gb = GlobalBatch.fit(args.batch, size, args.micro)
        w.mesh = shape

    def get_state() -> dict:
        model, optim = get_state_dict(w.model, w.opt)
        return {"model": model, "optim": optim}

    def set_state(state: dict) -> None:
        set_state_dict(w.model, w.opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    elastic = trainer_shim.Elastic(session, state_dict=get_state, load_state_dict=set_state, on_world=on_world,
                                   sampler=sampler, sharded=True, checkpoint_dir=args.ckpt_dir,
                                   in_place=not args.no_in_place)
    elastic.init()
    train(args, elastic, session, w, sampler, data, device)
    return 0


def train(args: argparse.Namespace, elastic: trainer_shim.Elastic,
          session: trainer_shim.Session | trainer_shim.NullSession, w: World,
          sampler: ElasticSampler, data: torch.Tensor, device: torch.device) -> None:
    """The training loop of a sharded script (this one's and examples/train_titan.py's): each step through
    `run_step`, a save every --ckpt-every steps or when asked, a drain on the restart path."""

    def train_step(step: int) -> None:
        if w.rank == 0 and w.shown != elastic.round:  # the world's line once its state is healed
            w.shown = elastic.round
            lr = f" lr={w.schedule.get_last_lr()[0]:.6f}" if w.schedule is not None else ""
            print(f"world_size={w.size} round={elastic.round} start_step={step - 1} mesh={w.mesh} "
                  f"consumed={sampler.consumed}{lr} pid={os.getpid()} t={time.time():.4f}", flush=True)
        if args.digest_log:  # before the step changes anything: a peer lost in the gather loses nothing
            log_digest(args.digest_log, f"{elastic.round} {step - 1}", w)
        w.opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for micro in range(w.gb.accum_steps):
            if sampler.exhausted:
                sampler.set_epoch(sampler.epoch + 1)
            batch = data[torch.tensor(sampler.next_batch(w.gb.micro_batch))].to(device)
            w.model.set_requires_gradient_sync(micro == w.gb.accum_steps - 1)
            logits = w.model(batch[:, :-1])
            # Summed over this rank's sequences, scaled so FSDP's mean over ranks is the global batch's mean.
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1),
                                                     reduction="sum") * w.size / (args.batch * SEQ)
            loss.backward()
            total += loss.detach()
        if w.max_norm:
            clip(w.model, w.max_norm)
        w.opt.step()
        if w.schedule is not None:
            w.schedule.step()
        session.report(step, loss=total.item(), samples=w.gb.micro_batch * w.gb.accum_steps)
        if w.rank == 0:
            print(f"step={step} world_size={w.size} loss={total.item():.4f} t={time.time():.4f}", flush=True)

    while elastic.step < last_step(args):
        step = elastic.run_step(train_step)
        if session.should_stop(step):  # a drain on the restart path: save at the agreed step, then leave
            elastic.save(session.last_request_id)
            session.drained(step, session.last_request_id)
            break
        if session.should_checkpoint(step) or (args.ckpt_every and step % args.ckpt_every == 0):
            elastic.save()
        if args.step_time > 0:
            time.sleep(args.step_time)
    if args.digest_log:
        log_digest(args.digest_log, f"final {elastic.step}", w, keep=args.digest_log + ".final.pt")
    session.close()
    elastic.close()


def clip(model: torch.nn.Module, max_norm: float) -> None:
    """torchtitan's clipping: the total norm of sharded gradients is a DTensor, made whole before it scales them."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)


def last_step(args: argparse.Namespace) -> int:
    if args.steps_file and os.path.exists(args.steps_file):
        with open(args.steps_file) as fh:
            text = fh.read().strip()
        if text.isdigit():
            return min(args.steps, int(text))
    return args.steps


def log_digest(path: str, label: str, w: World, keep: str = "") -> None:
    """Collective: the whole state gathered; rank 0 appends its digest (and keeps it, for `final`)."""
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model = get_model_state_dict(w.model, options=full)
    optim = get_state_dict(w.model, w.opt, options=full)[1]
    if w.rank != 0:
        return
    h = hashlib.sha256()
    for name in sorted(model):
        h.update(model[name].contiguous().view(torch.uint8).numpy().tobytes())
        for key in sorted(optim["state"].get(name, {})):  # a tied parameter's state is under its first name
            h.update(optim["state"][name][key].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    with open(path, "a") as fh:
        fh.write(f"{label} {h.hexdigest()}\n")
    if keep:
        torch.save({"model": model, "optim": optim["state"]}, keep)


if __name__ == "__main__":
    sys.exit(main())
