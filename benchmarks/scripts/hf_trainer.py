"""A Hugging Face Trainer fine-tuning a small GPT-2 built from its config (no download)."""

import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

small = "--small" in sys.argv
torch.manual_seed(0)
config = GPT2Config(
    n_layer=2 if small else 6,
    n_head=2 if small else 8,
    n_embd=64 if small else 512,
    vocab_size=512 if small else 8192,
    n_positions=128,
)
seq = 32 if small else 128


class Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        ids = torch.randint(
            0, config.vocab_size, (seq,), generator=torch.Generator().manual_seed(i)
        )
        return {"input_ids": ids, "labels": ids}


with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out,
        max_steps=3 if small else 6,
        per_device_train_batch_size=4 if small else 16,
        learning_rate=1e-4,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
    )
    Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens()).train()
