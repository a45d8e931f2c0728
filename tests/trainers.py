"""Trainers as users build them, tiny, and what those trainers do on their own.

Factories that return a Hugging Face ``Trainer`` (GPT-2 from its config class, a subclass
with its own ``compute_loss``, TRL's ``SFTTrainer``), a Lightning ``Trainer`` with its module
and data, and an Accelerate ``Accelerator`` with what it prepares; and the yardsticks: each
framework's own training of the same factory, with a plain ``torch.amp.GradScaler`` where
float16 is asked for, and no scalertune code in it.
"""

import torch
from torch import nn
from torch.utils.data import Dataset

VOCAB, LENGTH = 128, 16

#: The HF Trainer's steps: its max_steps, hence a search's default horizon.
HF_STEPS = 24


class Sequences(Dataset):
    """Arithmetic sequences of token ids: a causal language model learns them."""

    def __init__(self, n=96):
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        step = torch.randint(1, 5, (n, 1), generator=g)
        self.ids = (start + step * torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(
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


def _arguments(tmp="/tmp/scalertune-tests-hf", **overrides):
    from transformers import TrainingArguments

    kwargs = dict(
        output_dir=tmp,
        max_steps=HF_STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        warmup_steps=3,
        optim="adamw_torch",
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )
    kwargs.update(overrides)
    return TrainingArguments(**kwargs)


def hf_trainer(**overrides):
    """GPT-2 (dropout on) in a plain Trainer: AdamW, warm-up, clipping at 1.0, gradient
    accumulation over 2 micro-batches of a shuffled dataset."""
    from transformers import Trainer

    return Trainer(model=_gpt2(), args=_arguments(**overrides), train_dataset=Sequences())


#: The factor ScaledLossTrainer multiplies its loss by: its gradients overflow float16 at
#: PyTorch's default scale (as a summed loss's do), so a float16 run skips steps.
LOSS_FACTOR = 3e4


def scaled_loss_trainer(**overrides):
    """A Trainer subclass with its own ``compute_loss``: the mean token loss times
    ``LOSS_FACTOR``."""
    from transformers import Trainer

    class ScaledLossTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(input_ids=inputs["input_ids"])
            logits = outputs.logits[:, :-1].reshape(-1, VOCAB)
            loss = nn.functional.cross_entropy(logits, inputs["labels"][:, 1:].reshape(-1))
            loss = loss * LOSS_FACTOR
            return (loss, outputs) if return_outputs else loss

    overrides.setdefault("max_grad_norm", 0.0)
    return ScaledLossTrainer(model=_gpt2(), args=_arguments(**overrides), train_dataset=Sequences())


def scaled_loss_trainer_float16():
    """The same, made with fp16=True, as a user with a GPU would make it."""
    return scaled_loss_trainer(fp16=True)


def sft_trainer():
    """TRL's SFTTrainer on pre-tokenized sequences (no tokenizer download), in float32 on its
    own (TRL's configs default to bf16=True, which Accelerate runs on a CPU too)."""
    from datasets import Dataset as HFDataset
    from trl import SFTConfig, SFTTrainer

    ids = Sequences().ids.tolist()
    # a constant learning rate over 2 micro-batches: float32 learns by more than the target's
    # tolerance in a trial's 20 steps, as a search needs
    config = SFTConfig(
        output_dir="/tmp/scalertune-tests-sft",
        max_steps=HF_STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        dataset_kwargs={"skip_prepare_dataset": True},
        max_length=LENGTH,
        remove_unused_columns=False,
        bf16=False,
    )
    return SFTTrainer(
        model=_gpt2(),
        args=config,
        train_dataset=HFDataset.from_dict({"input_ids": ids}),
        processing_class=_tokenizer(),
    )


def _tokenizer():
    """A word-level tokenizer over the token ids, built in memory."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {str(i): i for i in range(VOCAB)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="0"))
    )
    tokenizer.pad_token, tokenizer.eos_token, tokenizer.unk_token = "0", "0", "0"
    return tokenizer


def hf_losses_and_skips(trainer, scaler=None):
    """``trainer.train()`` on its own: each optimizer step's loss (what ``training_step``
    returned, summed over the micro-batches) and the steps its optimizer skipped (counted by
    a post-hook on the torch optimizer). With ``scaler``, Accelerate's own float16 path runs
    on a CPU: native autocast from ``fp16=True`` and ``scaler`` as its GradScaler."""
    if scaler is not None:
        trainer.accelerator.native_amp, trainer.accelerator.scaler = True, scaler
    micro, taken = [], []
    own_step = trainer.training_step

    def training_step(model, inputs, num_items_in_batch=None):
        loss = own_step(model, inputs, num_items_in_batch)
        micro.append(loss.item())
        return loss

    trainer.training_step = training_step
    hooked = []
    create = trainer.create_optimizer

    def create_optimizer(*args, **kwargs):
        optimizer = create(*args, **kwargs)
        if not hooked:
            hooked.append(optimizer.register_step_post_hook(lambda *_: taken.append(1)))
        return optimizer

    trainer.create_optimizer = create_optimizer
    steps = []

    class Count(_callback_base()):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(len(taken))

    trainer.add_callback(Count())
    trainer.train()
    accumulate = trainer.args.gradient_accumulation_steps
    losses = [sum(micro[i : i + accumulate]) for i in range(0, len(micro), accumulate)]
    skipped = [i for i, n in enumerate(steps) if n == (steps[i - 1] if i else 0)]
    return losses, skipped


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


# --- Lightning ------------------------------------------------------------------------------

LIGHTNING_STEPS = 30


def _regression(n=192):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    return torch.utils.data.TensorDataset(x, 10.0 * torch.tanh(x[:, :3].sum(1, keepdim=True)))


def lightning_module():
    import lightning.pytorch as pl

    class Regressor(pl.LightningModule):
        """A summed squared error, large enough that float16 gradients overflow at
        PyTorch's default scale; dropout draws from torch's RNG."""

        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.1), nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y, reduction="sum")
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters(), lr=2e-2)
            schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
            return [optimizer], [{"scheduler": schedule, "interval": "step"}]

    return Regressor()


def lightning_trainer(**overrides):
    import lightning.pytorch as pl

    kwargs = dict(
        max_steps=LIGHTNING_STEPS,
        accelerator="cpu",
        devices=1,
        accumulate_grad_batches=2,
        gradient_clip_val=1e4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    kwargs.update(overrides)
    return pl.Trainer(**kwargs)


def lightning_loader():
    return torch.utils.data.DataLoader(_regression(), batch_size=16, shuffle=True)


def lightning_parts():
    """The factory: what ``trainer.fit(module, loader)`` takes."""
    return {
        "trainer": lightning_trainer(),
        "model": lightning_module(),
        "batches": lightning_loader(),
    }


def lightning_losses_and_skips(trainer, module, loader):
    """``trainer.fit(module, loader)`` on its own: each optimizer step's loss (the mean of
    its batches' losses) and the optimizer steps that were skipped (a post-hook)."""
    import lightning.pytorch as pl

    micro, taken, steps = [], [], []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            micro.append(float(outputs["loss"]) * trainer.accumulate_grad_batches)

        def on_train_start(self, trainer, pl_module):
            trainer.optimizers[0].register_step_post_hook(lambda *_: taken.append(1))

        def on_before_zero_grad(self, trainer, pl_module, optimizer):
            steps.append(len(taken))

    trainer.callbacks.append(Record())
    trainer.fit(module, loader)
    accumulate = trainer.accumulate_grad_batches
    losses = [
        sum(micro[i : i + accumulate]) / len(micro[i : i + accumulate])
        for i in range(0, len(micro), accumulate)
    ]
    counts = [*steps[1:], len(taken)]  # the count after each optimizer step
    skipped = [i for i, n in enumerate(counts) if n == (counts[i - 1] if i else 0)]
    return losses, skipped


# --- Accelerate -----------------------------------------------------------------------------


def accelerate_parts():
    """An Accelerator and what a training script prepares with it."""
    from accelerate import Accelerator

    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    return {
        "accelerator": Accelerator(cpu=True),
        "model": model,
        "optimizer": optimizer,
        "loss_fn": lambda out, y: nn.functional.mse_loss(out, y, reduction="sum"),
        "batches": lightning_loader(),
        "schedulers": [torch.optim.lr_scheduler.StepLR(optimizer, 10, gamma=0.7)],
        "horizon": 40,
    }
