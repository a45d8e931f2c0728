"""A Hugging Face ``Trainer`` as the workload: GPT-2, built from its config class.

The factory returns the Trainer you would call ``train()`` on, as it is: scalertune searches
what that Trainer trains (its model, the AdamW and warm-up schedule ``TrainingArguments``
make, its dataloader and seed, its ``compute_loss``, its ``max_grad_norm`` of 1.0) over its
``max_steps``, the search's horizon. The model is built from ``GPT2Config`` with random
weights and the text is arithmetic sequences of token ids, so nothing is downloaded.

    scalertune search examples/hf_trainer.py:make_trainer

Then train with the answer, in float16 on a GPU (or on a CPU):

    trainer = make_trainer()
    amp = scalertune.attach(trainer, "hf_trainer_make_trainer.yaml", best_amp=True)
    trainer.train()
"""

import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB, LENGTH = 512, 32


class ArithmeticText(Dataset):
    """Sequences ``start, start + step, start + 2 step, ...`` modulo the vocabulary: a
    language a small model learns, with labels the inputs themselves (causal LM)."""

    def __init__(self, n=512):
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        step = torch.randint(1, 8, (n, 1), generator=g)
        self.ids = (start + step * torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_trainer():
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_head=2,
            n_embd=64,
            vocab_size=VOCAB,
            n_positions=LENGTH,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "scalertune-hf-trainer"),
        max_steps=400,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        warmup_steps=5,
        report_to=[],
        save_strategy="no",
        logging_steps=50,
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )
    return Trainer(model=model, args=args, train_dataset=ArithmeticText())
