"""An elastic PyTorch job for the platform: members join and leave while it runs, and it goes on from its state.

Run it under torchrun, with no arguments of torchrun's own: for an elastic job (``--elastic MIN:MAX``) the platform
sets torchrun's defaults (``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_RDZV_BACKEND=c10d``, ``PET_RDZV_ENDPOINT``,
``PET_RDZV_ID``, ``PET_MAX_RESTARTS``), so each member's torchrun joins the job's rendezvous on rank 0's member:

    gpucloud submit --gpu-type RTX3090 --gpus 2 --elastic 1:4 --image pytorch --upload examples/elastic -- \\
        torchrun train.py

When a member joins or leaves, every torchrun stops its processes and starts them again in a new world (its
size in ``WORLD_SIZE``); this script then loads ``$AUTO_TMPDIR/elastic.pt`` (written by rank 0 every
``SAVE_EVERY`` steps, on the storage every member mounts) and goes on from that step. It runs DDP over gloo on
CPU and NCCL where it sees cards. What it reads (all optional):

    STEPS        steps in all, counted across restarts (default 200)
    STEP_S       seconds each step sleeps beside its work, to make a short run last (default 0)
    SAVE_EVERY   steps between checkpoints (default 1)
    AUTO_TMPDIR  where the checkpoint goes (the platform sets it; default ./)

What it prints: each member's first process as it starts, rank 0 for each step and at the end:

    start: step S, world_size W, rank R
    step S world_size W loss L
    done: step S
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    steps = int(os.environ.get("STEPS", "200"))
    pause = float(os.environ.get("STEP_S", "0"))
    every = int(os.environ.get("SAVE_EVERY", "1"))
    path = os.path.join(os.environ.get("AUTO_TMPDIR", "."), "elastic.pt")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if os.path.exists(path):
        state = torch.load(path, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    ddp = DistributedDataParallel(model)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # each member says so: its own output is followed live
        print(f"start: step {step}, world_size {world}, rank {rank}", flush=True)
    generator = torch.Generator().manual_seed(1)
    target = torch.randn(16, 1, generator=generator).to(device)
    while step < steps:
        x = torch.randn(64, 16, generator=generator).to(device)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if rank == 0:
            print(f"step {step} world_size {world} loss {loss.item():.4f}", flush=True)
            if step % every == 0 or step == steps:
                # Written aside, then renamed: a member stopped mid-write never leaves half a checkpoint.
                torch.save(
                    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path + ".new"
                )
                os.replace(path + ".new", path)
        time.sleep(pause)
    dist.barrier()
    if rank == 0:
        print(f"done: step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
