"""A PyTorch DDP training job for Muster: no wrapper, no flags to find peers.

Muster starts one copy per task of the gang with the standard launcher
environment (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, and MASTER_PORT from
the gang's reserved port), so ``init_process_group`` finds its rendezvous
through its default ``env://``. Run it as a gang of four on CPUs (gloo):

    muster submit -n 4 --checkpoint manual -- python3 "$PWD/examples/torch_ddp/train.py" --steps 200

Every ``--checkpoint-every`` steps each rank saves the model, optimiser and
step into ``MUSTER_CHECKPOINT_DIR`` (written to a temporary name, then
renamed, so a SIGKILL never leaves a torn file), keeping the last two, and
writes the step to ``.muster/step`` (Muster records it in the checkpoint's
manifest). ``--model-mb`` adds that many MiB of frozen weights, for
checkpoints of a real model's size (ResNet-50: about 100). When a rank dies,
its peers' collective fails and they exit too; Muster tears the gang down,
saves each rank's checkpoint directory to the checkpoint store (by default
the node's own disk; the log holds only a manifest), places the gang again,
and each rank's agent fetches its checkpoint (from the node that wrote it,
if the rank moved), checks its SHA-256 and restores it. The ranks then agree
on the newest step every one of them has saved, and continue from there,
not from step 0. A priority preemption's checkpoint hint (SIGUSR1) makes
every rank save at the next step and tell the agent it is done.

At the end each rank prints a SHA-256 of its parameters: DDP keeps them
equal on every rank.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

KEEP = 2


def checkpoint_dir() -> str:
    d = os.environ.get("MUSTER_CHECKPOINT_DIR", "checkpoints")
    os.makedirs(d, exist_ok=True)
    return d


def saved_steps(d: str) -> list[int]:
    steps = []
    for name in os.listdir(d):
        if name.startswith("step-") and name.endswith(".pt"):
            try:
                steps.append(int(name[len("step-") : -len(".pt")]))
            except ValueError:
                pass
    return sorted(steps)


def save(d: str, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    path = os.path.join(d, f"step-{step}.pt")
    tmp = path + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in saved_steps(d)[:-KEEP]:
        os.remove(os.path.join(d, f"step-{old}.pt"))
    proto = os.path.join(d, ".muster")
    os.makedirs(proto, exist_ok=True)
    with open(os.path.join(proto, "step.tmp"), "w") as f:
        f.write(str(step))
    os.replace(os.path.join(proto, "step.tmp"), os.path.join(proto, "step"))


hinted = False


def on_hint(signum, frame) -> None:
    """A priority preemption asks for a checkpoint: save at the next step."""
    global hinted
    hinted = True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.0, help="pause per step (tests: time to act mid-run)")
    p.add_argument("--model-mb", type=int, default=0, help="MiB of frozen weights, for a real-sized checkpoint")
    p.add_argument("--data", default=None, help="train on this dataset (a file of tensors x and y; relative: under --work)")
    p.add_argument("--save", default=None, help="rank 0 saves the trained model here (relative: under --work)")
    p.add_argument("--work", default=None, help="default: $TMPDIR/muster-workflow-$MUSTER_WORKFLOW_ID")
    args = p.parse_args()
    work = args.work or os.path.join(tempfile.gettempdir(), f"muster-workflow-{os.environ.get('MUSTER_WORKFLOW_ID', 0)}")
    data = torch.load(os.path.join(work, args.data)) if args.data else None
    signal.signal(signal.SIGUSR1, on_hint)

    # env://: MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE come from Muster.
    dist.init_process_group(backend="gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    if args.model_mb:
        # Frozen weights: saved and restored with the model, never trained.
        net.register_buffer("frozen", torch.randn(args.model_mb * (1 << 18), generator=torch.Generator().manual_seed(7)))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    d = checkpoint_dir()
    mine = saved_steps(d)
    # The newest step every rank has: ranks run in lockstep, so they differ
    # by at most one save, and each keeps the last two.
    latest = torch.tensor([mine[-1] if mine else 0])
    dist.all_reduce(latest, op=dist.ReduceOp.MIN)
    start = int(latest.item())
    if start > 0:
        state = torch.load(os.path.join(d, f"step-{start}.pt"))
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        print(f"rank {rank}/{world}: resumed from step {start}", flush=True)
    else:
        print(f"rank {rank}/{world}: starting at step 0 ({os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']})", flush=True)

    for step in range(start + 1, args.steps + 1):
        if data is not None:
            # Each rank its own shard of the dataset, 64 rows a step.
            n = data["x"].shape[0]
            at = ((step * world + rank) * 64) % max(1, n - 64)
            x, y = data["x"][at : at + 64], data["y"][at : at + 64]
        else:
            g = torch.Generator().manual_seed(step * 1000 + rank)  # each rank its own shard
            x = torch.randn(64, 16, generator=g)
            y = x.sum(dim=1, keepdim=True).sin()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        # Every rank is hinted, but not at the same step: agree on the step
        # to save at (one tiny all-reduce), so every rank saves the same one.
        asked = torch.tensor([1 if hinted else 0])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        stop_here = bool(asked.item())
        if step % args.checkpoint_every == 0 or stop_here:
            save(d, step, model.module, opt)
            print(f"rank {rank}: step {step} loss {loss.item():.4f} (checkpoint saved)", flush=True)
        if stop_here:
            # The agent stops the task now; its directory goes to the store.
            open(os.path.join(d, ".muster", "done"), "w").close()
            print(f"rank {rank}: checkpointed at step {step} for a preemption", flush=True)
            time.sleep(3600)
        if args.step_seconds:
            time.sleep(args.step_seconds)

    digest = hashlib.sha256()
    for t in model.module.state_dict().values():
        digest.update(repr(t.detach().flatten().tolist()).encode())  # exact, and no numpy needed
    print(f"rank {rank}: done at step {args.steps}; params sha256 {digest.hexdigest()}", flush=True)
    if args.save and rank == 0:
        path = os.path.join(work, args.save)
        torch.save(model.module.state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"rank 0: model saved to {path}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
