"""A Hugging Face ``Trainer`` made with ``deepspeed=``: GPT-2, built from its config class.

The factory returns the Trainer you would call ``train()`` on, with its DeepSpeed config as
you would write it for the Trainer (ZeRO stage 2, fp16, ``"auto"`` where the
``TrainingArguments`` say): scalertune searches it as it is, each run in the engine its own
``deepspeed_init`` and ``accelerator.prepare`` make, with the run's ``fp16`` block (or bf16,
or float32 for the reference), over its ``max_steps``. Nothing is downloaded: the model is
built from ``GPT2Config`` with random weights, the text is arithmetic sequences of token ids.

    scalertune search examples/deepspeed_trainer.py:make_trainer --space float16

Then train with the answer, under torchrun (or the deepspeed launcher) as usual:

    trainer = make_trainer()
    amp = scalertune.attach(trainer, "deepspeed_trainer_make_trainer.yaml", best_amp=True)
    trainer.train()
    print(amp.skipped_steps, trainer.model_wrapped.skipped_steps)  # DeepSpeed's own count

``attach`` puts the YAML's ``fp16`` block, ``bf16`` and ``gradient_clipping`` into the
Trainer's DeepSpeed config before ``train()`` makes the engine, and watches the engine's
scaler against the search's prediction.
"""

import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB, LENGTH = 256, 32

DEEPSPEED = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
    "zero_optimization": {"stage": 2},
}


class ArithmeticText(Dataset):
    """Sequences ``start, start + step, start + 2 step, ...`` modulo the vocabulary: a
    language a small model learns, with labels the inputs themselves (causal LM)."""

    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        step = torch.randint(1, 8, (n, 1), generator=g)
        self.ids = (start + step * torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def make_trainer(max_steps=200):
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_head=2,
            n_embd=32,
            vocab_size=VOCAB,
            n_positions=LENGTH,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    args = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "scalertune-deepspeed-trainer"),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        warmup_steps=5,
        report_to=[],
        save_strategy="no",
        logging_steps=50,
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
        fp16=True,
        deepspeed=DEEPSPEED,
    )
    return Trainer(model=model, args=args, train_dataset=ArithmeticText())
