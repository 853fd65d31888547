"""Parameters in one flat buffer, and Adam on it.

The residual learner's networks are small (a few hundred thousand weights in ~10 tensors),
so on a CPU an optimiser step is bounded by per-tensor dispatch, not arithmetic: PyTorch's
``foreach`` Adam loops over the tensors in C++ and reads every step counter back with
``.item()``. Making each parameter a view of one contiguous buffer (and each ``.grad`` a
view of another) turns Adam, zeroing and Polyak averaging into a handful of whole-buffer
operations, with the same arithmetic as ``torch.optim.Adam`` (tested bit for bit).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class FlatParameters:
    """Rebinds ``module``'s parameters (and their gradients) to views of two flat buffers.

    ``data`` (N,) holds every parameter, ``grad`` (N,) every gradient; N = total numel.
    Autograd then accumulates into ``grad`` in place, so it must be zeroed with
    ``zero_grad()`` (never ``set_to_none``, which would detach a gradient from the buffer).
    """

    def __init__(self, module: nn.Module):
        params = list(module.parameters())
        self.data = torch.cat([p.detach().reshape(-1) for p in params])
        self.grad = torch.zeros_like(self.data)
        offset = 0
        for p in params:
            n = p.numel()
            p.data = self.data[offset:offset + n].view_as(p)
            if p.requires_grad:
                p.grad = self.grad[offset:offset + n].view_as(p)
            offset += n

    def zero_grad(self) -> None:
        self.grad.zero_()

    def grad_norm(self) -> float:
        return float(torch.linalg.vector_norm(self.grad))


class FlatAdam:
    """Adam (Kingma & Ba; ``torch.optim.Adam``'s update, no weight decay or amsgrad) on a
    ``FlatParameters`` buffer: six whole-buffer operations per step."""

    def __init__(self, params: FlatParameters, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.params, self.lr, self.betas, self.eps = params, lr, betas, eps
        self.exp_avg = torch.zeros_like(params.data)
        self.exp_avg_sq = torch.zeros_like(params.data)
        self.steps = 0

    def zero_grad(self) -> None:
        self.params.zero_grad()

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        grad, p = self.params.grad, self.params.data
        self.steps += 1
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**self.steps
        bias_correction2_sqrt = math.sqrt(1 - beta2**self.steps)
        denom = self.exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(self.eps)
        p.addcdiv_(self.exp_avg, denom, value=(self.lr / bias_correction1) * -1)

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone(), "steps": self.steps,
                "lr": self.lr, "betas": self.betas, "eps": self.eps}

    def load_state_dict(self, state: dict) -> None:
        if "exp_avg" not in state:
            raise ValueError("optimiser state is not a FlatAdam's (a checkpoint written before the flat "
                             "optimiser, with torch.optim state): start a fresh run from this one's actor "
                             "instead of resuming it")
        if state["exp_avg"].shape != self.exp_avg.shape:
            raise ValueError(f"optimiser state has {state['exp_avg'].numel()} entries, these parameters "
                             f"{self.exp_avg.numel()}: the checkpoint is of another network shape")
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.steps = int(state["steps"])
        self.lr, self.betas, self.eps = float(state["lr"]), tuple(state["betas"]), float(state["eps"])
