"""A LightningModule trained with Trainer.fit."""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

small = "--small" in sys.argv
width = 128 if small else 2048


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    torch.manual_seed(0)
    n = (3 if small else 8) * 64
    data = TensorDataset(torch.randn(n, width), torch.randint(0, 10, (n,)))
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Classifier(), DataLoader(data, batch_size=64))
