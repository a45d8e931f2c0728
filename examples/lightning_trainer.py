"""A Lightning ``Trainer`` as the workload: the module, its data and the Trainer you fit.

A small MLP regresses sensor readings near 1000 with a summed squared error, as a fit that
cares about every sample's error would: the loss is around 1e6 and its gradients overflow
float16 at PyTorch's default loss scale of 65536, so the default scaler skips its first steps
while it backs off. The factory returns what ``trainer.fit(module, loader)`` takes; scalertune
searches it over the Trainer's ``max_steps`` with its ``gradient_clip_val``.

    scalertune search examples/lightning_trainer.py:make_trainer

Then train with the answer:

    parts = make_trainer()
    amp = scalertune.attach(parts["trainer"], "lightning_trainer_make_trainer.yaml")
    parts["trainer"].fit(parts["model"], parts["batches"])
"""

import lightning.pytorch as pl
import torch
from torch import nn


class Readings(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x) + 1000.0, y, reduction="sum")
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        schedule = torch.optim.lr_scheduler.OneCycleLR(  # warm up over 5%, then anneal
            optimizer,
            max_lr=3e-3,
            pct_start=0.05,
            total_steps=int(self.trainer.estimated_stepping_batches),
        )
        return [optimizer], [{"scheduler": schedule, "interval": "step"}]


def readings(n=1024):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = 1000.0 + 5.0 * torch.tanh(x[:, :4].sum(1, keepdim=True)) + 2.0 * x[:, 4:5]
    return torch.utils.data.TensorDataset(x, y)


def make_trainer():
    module = Readings()
    loader = torch.utils.data.DataLoader(readings(), batch_size=64, shuffle=True)
    trainer = pl.Trainer(
        max_steps=600,
        accelerator="auto",
        devices=1,
        gradient_clip_val=50.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return {"trainer": trainer, "model": module, "batches": loader}
