"""Factories that are wrong in one way each: scalertune must refuse them in one line."""

import torch
from torch import nn

NOT_CALLABLE = 42


def _parts():
    model = nn.Linear(4, 1)
    return {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss_fn": nn.MSELoss(),
        "batches": [(torch.randn(8, 4), torch.randn(8, 1))],
    }


def raises():
    raise ValueError("dataset path /data/train is missing")


def wrong_shape():
    parts = _parts()
    return [parts["model"], parts["optimizer"]]


def empty_batches():
    return {**_parts(), "batches": []}


def one_shot_batches():
    return {**_parts(), "batches": iter(_parts()["batches"])}


def non_scalar_loss():
    return {**_parts(), "loss_fn": nn.MSELoss(reduction="none")}


def non_tensor_loss():
    return {**_parts(), "loss_fn": lambda out, y: ((out - y) ** 2).mean().item()}


def no_trainable_parameters():
    parts = _parts()
    for p in parts["model"].parameters():
        p.requires_grad_(False)
    return parts


def foreign_optimizer():
    other = nn.Linear(4, 1)
    return {**_parts(), "optimizer": torch.optim.SGD(other.parameters(), lr=0.1)}


def unknown_key():
    return {**_parts(), "lr": 0.1}


class _LikeHuggingFace(nn.Module):
    """Returns what a Hugging Face model returns when called without labels: an output with
    ``logits`` and a ``loss`` of None."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.head(x), loss=None)


def model_output_without_labels():
    model = _LikeHuggingFace()
    return {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss_fn": lambda output, target: output.loss,
        "batches": [(torch.randn(8, 4), torch.randint(0, 3, (8,)))],
    }


def _with_step(returns):
    """``_parts()`` with a step of its own that returns ``returns(output, loss)``."""
    parts = _parts()
    optimizer, loss_fn = parts["optimizer"], parts.pop("loss_fn")

    def step(model, batch, amp):
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            output = model(x)
            loss = loss_fn(output, y)
        amp.backward(loss)
        amp.step(optimizer)
        return returns(output, loss)

    return {**parts, "step": step}


def step_returns_tuple():
    """A step that returns what a nanoGPT model returns, ``(logits, loss)``."""
    return _with_step(lambda output, loss: (output, loss))


def step_returns_non_scalar():
    """A step that returns the per-sample losses."""
    return _with_step(lambda output, loss: (output - output.detach() + loss).squeeze(1))


def wrapped_for_ranks():
    """Wraps its model in DDP, as a training that runs on N ranks does, and is searched as
    one process (no --nproc-per-node, no launcher)."""
    parts = _parts()
    parts["model"] = nn.parallel.DistributedDataParallel(parts["model"])
    return parts
