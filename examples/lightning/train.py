"""A small PyTorch Lightning job for the platform: one node or several (DDP), on cards or on CPU.

Run it as a job on the PyTorch image (it is uploaded with ``--upload``; the command runs in its folder):

    gpucloud submit --gpu-type RTX3090 --gpus 1 --image pytorch --upload examples/lightning -- python train.py

What it reads (all optional; the platform sets the first five for every job):

    NNODES, NODE_RANK     nodes of the job and this one's place (Lightning's ``num_nodes``; its launcher reads
                          NODE_RANK, MASTER_ADDR and MASTER_PORT itself)
    NPROC_PER_NODE        processes on this node, one per card: Lightning's ``devices`` unless DEVICES is set
    AUTO_TMPDIR           where checkpoints go: it survives preemption, stop and requeue (default ./)
    ACCELERATOR           Lightning's ``accelerator`` (default "auto": the cards where CUDA sees any, else CPU)
    DEVICES               Lightning's ``devices`` (default NPROC_PER_NODE, else 1)
    MAX_EPOCHS            epochs in all, counted across resumes (default 3)
    SAMPLES, BATCH_SIZE   the synthetic data set's size and the batch (default 512 and 64)

It saves ``$AUTO_TMPDIR/last.ckpt`` (ModelCheckpoint, save_last=True) after every epoch and, when that file is
there, resumes from it: the global step and the epoch continue where the earlier run stopped. More than one
process in all (NNODES x devices) runs DDP (gloo on CPU, NCCL on cards). The data loader has no sampler of its
own: under DDP Lightning gives each process its share (a DistributedSampler of the script's own fails before the
process group exists). What it prints, from rank 0, one line each:

    start: <fresh | resuming from PATH at global_step N>, world_size W, accelerator A
    epoch E global_step S loss L
    done: global_step S, checkpoint PATH
"""

import os
import warnings

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore", ".*does not have many workers.*")


class Regression(pl.LightningModule):
    """A two-layer network fitting y = x·w + noise on synthetic data."""

    def __init__(self, features: int = 16, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.epoch_losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.epoch_losses.append(loss.detach().item())
        return loss

    def on_train_epoch_end(self):
        mean = torch.tensor(sum(self.epoch_losses) / max(len(self.epoch_losses), 1))
        loss = self.trainer.strategy.reduce(mean, reduce_op="mean").item()  # over every rank (all-reduce)
        self.epoch_losses.clear()
        if self.trainer.is_global_zero:
            print(f"epoch {self.current_epoch} global_step {self.global_step} loss {loss:.4f}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def data(samples: int, batch_size: int, features: int = 16) -> DataLoader:
    generator = torch.Generator().manual_seed(0)  # the same data on every rank and every run
    x = torch.randn(samples, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    y = x @ w + 0.1 * torch.randn(samples, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)


def main() -> None:
    keep = os.environ.get("AUTO_TMPDIR") or "./"
    nodes = int(os.environ.get("NNODES") or 1)
    devices = int(os.environ.get("DEVICES") or os.environ.get("NPROC_PER_NODE") or 1)
    accelerator = os.environ.get("ACCELERATOR") or "auto"
    last = os.path.join(keep, "last.ckpt")
    resume = last if os.path.exists(last) else None
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=devices,
        num_nodes=nodes,
        strategy="ddp" if nodes * devices > 1 else "auto",
        max_epochs=int(os.environ.get("MAX_EPOCHS") or 3),
        default_root_dir=keep,
        callbacks=[ModelCheckpoint(dirpath=keep, save_last=True)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    if trainer.is_global_zero:
        start = f"resuming from {resume} at global_step {_step(resume)}" if resume else "fresh"
        print(f"start: {start}, world_size {trainer.world_size}, accelerator {accelerator}", flush=True)
    loader = data(int(os.environ.get("SAMPLES") or 512), int(os.environ.get("BATCH_SIZE") or 64))
    trainer.fit(Regression(), loader, ckpt_path=resume)
    if trainer.is_global_zero:
        print(f"done: global_step {trainer.global_step}, checkpoint {last}", flush=True)


def _step(path: str) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


if __name__ == "__main__":
    main()
