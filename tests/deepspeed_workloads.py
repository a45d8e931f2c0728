"""DeepSpeed workloads for the tests, and DeepSpeed's own training of them: the yardstick.

- :func:`regression`: a factory returning a small regression with its ZeRO-2 config, whose
  gradients overflow float16 at DeepSpeed's default scale (the shipped example's shape,
  smaller); :func:`with_config` the same with a config of one's own;
- :func:`deepspeed_training`: the user's own loop, as DeepSpeed's tutorials write it
  (``deepspeed.initialize``, the inputs cast to float16, ``engine.backward``,
  ``engine.step``), over the same batches: its losses and DeepSpeed's own count of skipped
  steps (``engine.skipped_steps``);
- :func:`trainer`: a Hugging Face Trainer made with ``deepspeed=`` (ZeRO-2, fp16, ``"auto"``
  fields), GPT-2 from its config class.

DeepSpeed's CPU accelerator refuses fp16 where oneDNN has no float16 matmul; the loop makes
it train as scalertune does (``allow_float16``), or it could not train fp16 here at all.
"""

import functools
import os
import tempfile

import torch
from torch import nn

FEATURES, BATCH, BATCHES = 8, 16, 8

CONFIG = {
    "train_micro_batch_size_per_gpu": BATCH,
    "zero_optimization": {"stage": 2},
    "fp16": {"enabled": True},
    "gradient_clipping": 1.0,
}


def regression(config=None, optimizer=True):
    """A regression to readings in the tens, its gradients about 100 at the start."""
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))
    weights = torch.randn(FEATURES, 1, generator=generator)
    batches = []
    for _ in range(BATCHES):
        x = torch.randn(BATCH, FEATURES, generator=generator)
        batches.append((x, x @ weights * 10.0 + torch.sin(x[:, :1] * 3) * 20))
    result = {
        "model": model,
        "loss_fn": nn.functional.mse_loss,
        "batches": batches,
        "deepspeed": dict(CONFIG if config is None else config),
    }
    if optimizer:
        result["optimizer"] = torch.optim.Adam(model.parameters(), lr=2e-2)
    return result


def with_config(**changes):
    """:func:`regression` with ``changes`` over its DeepSpeed config (``None`` drops a key)."""
    config = {**CONFIG, **changes}
    return functools.partial(regression, {k: v for k, v in config.items() if v is not None})


def deepspeed_training(factory, fp16, steps, *, seed=0, clipping=1.0):
    """DeepSpeed's own training of ``factory``'s workload with the ``fp16`` block (``None``:
    float32), seeded as a search seeds its runs: (losses, engine.skipped_steps, scale)."""
    import deepspeed

    from scalertune._frameworks._deepspeed import process_group, quiet
    from scalertune._frameworks._deepspeed_private import allow_float16, scale
    from scalertune._workload._rng import seed_everything

    seed_everything(seed)
    parts = factory()
    config = {
        **parts["deepspeed"],
        "fp16": fp16 or {"enabled": False},
        "gradient_clipping": clipping or 0.0,
    }
    allow_float16()
    process_group()
    with quiet():
        engine, *_ = deepspeed.initialize(
            model=parts["model"], optimizer=parts["optimizer"], config=config
        )
    dtype = torch.float16 if fp16 else torch.float32
    losses = []
    for i in range(steps):
        x, y = parts["batches"][i % len(parts["batches"])]
        loss = parts["loss_fn"](engine(x.to(dtype)), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    last_scale = scale(engine)
    skipped = engine.skipped_steps
    engine.destroy()
    return losses, skipped, last_scale


def trainer(max_steps=30, output_dir=None, **arguments):
    """A Hugging Face Trainer made with ``deepspeed=`` (ZeRO-2, fp16, ``"auto"`` fields):
    GPT-2 from its config class on arithmetic token sequences."""
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    vocab, length = 64, 16
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, vocab, (128, 1), generator=g)
    ids = (start + torch.randint(1, 5, (128, 1), generator=g) * torch.arange(length)) % vocab
    data = [{"input_ids": row, "labels": row} for row in ids]
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=1,
            n_head=2,
            n_embd=16,
            vocab_size=vocab,
            n_positions=length,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    deepspeed_config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "fp16": {"enabled": "auto", "initial_scale_power": 16},
        "zero_optimization": {"stage": 2},
    }
    args = TrainingArguments(
        output_dir=output_dir or os.path.join(tempfile.gettempdir(), "scalertune-ds-test"),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        fp16=True,
        deepspeed=deepspeed_config,
        **arguments,
    )
    return Trainer(model=model, args=args, train_dataset=data)


#: The steps of the Trainer a search is given: its horizon, and what attach trains after.
SEARCHED_STEPS = 20


def make_trainer():
    """:func:`trainer` as a factory spec names it (:data:`SEARCHED_STEPS`: its horizon)."""
    return trainer(max_steps=SEARCHED_STEPS)
