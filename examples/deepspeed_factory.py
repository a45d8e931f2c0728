"""A DeepSpeed workload: the factory returns the DeepSpeed config it trains with.

A small regression (readings in the tens, as a sensor's) trained with ZeRO stage 2 in
float16, as ``deepspeed.initialize`` trains it: the model cast to float16, DeepSpeed's own
dynamic loss scaler, its gradient clipping. The factory returns the model and optimizer as
they are before ``deepspeed.initialize``, the batches, the loss and the config; scalertune
makes each run's engine itself, with the run's ``fp16`` block (or bf16, or float32 for the
reference), and searches DeepSpeed's scaler knobs:

    scalertune search examples/deepspeed_factory.py:make_model --space float16

Its gradients reach about 100 at the start, so DeepSpeed's default initial scale (2**16)
overflows float16 until the scaler has backed off to about 2**9: each of those steps is
skipped. The answer is an ``fp16`` block; write it into your ds_config.json with

    scalertune export deepspeed_factory_make_model.yaml --to deepspeed --best-amp

(on a CPU, float16 steps are slower than float32's: the answer there is float32, and
``--best-amp`` takes the best float16 block that held). No DeepSpeed launcher is needed:
scalertune makes the one-process group DeepSpeed wants, and with ``--nproc-per-node N`` each
run is N ranks of one.
"""

import torch
from torch import nn

FEATURES, BATCH = 16, 32

DEEPSPEED = {
    "train_micro_batch_size_per_gpu": BATCH,
    "zero_optimization": {"stage": 2},
    "fp16": {"enabled": True},
    "gradient_clipping": 1.0,
}


def make_model():
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))
    weights = torch.randn(FEATURES, 1, generator=generator)
    batches = []
    for _ in range(16):
        x = torch.randn(BATCH, FEATURES, generator=generator)
        y = x @ weights * 10.0 + torch.sin(x[:, :1] * 3) * 20
        batches.append((x, y))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=2e-2),
        "loss_fn": nn.functional.mse_loss,
        "batches": batches,
        "deepspeed": DEEPSPEED,
    }
