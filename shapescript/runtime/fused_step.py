"""AdamW's step on the CPU as one call of torch's fused kernel, without torch.optim's step() around it.

`torch.optim.AdamW(fused=True).step()` ends in `torch._foreach_add_` on the step counts and one call
of `torch._fused_adamw_` for each param group. Around them it runs Python that a ShapeScript step
doesn't need: the step hooks, a profiler range, the grad mode switch, `_init_group`'s walk over the
params, grouping the tensors by device and dtype. That costs about 25 µs a step (measured once: 36 µs
against 10 µs for the README MLP's 12-32-5 version, measured alone), a sixth of a small model's whole
step. `optimizer_step` calls the same two kernels with the same arguments, on the optimizer's own state, so
the results are torch's to the bit and `state_dict()`, checkpoints and a later `step()` see
nothing different. It does so only where that is all `step()` would do: torch's AdamW with
`fused=True` on the CPU, no amsgrad, maximize, differentiable or capturable, a float lr, every
param with a gradient and the state of an earlier step, one dtype a group, no step hooks. Anything
else, and every first step (which makes the state), goes through `step()`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

_FUSED_ADAMW = getattr(torch, "_fused_adamw_", None)  # a private op: without it, every step is step()'s


def optimizer_step(opt: torch.optim.Optimizer) -> None:
    """`opt.step()`, with the fused kernel called directly where that is all it would do."""
    calls = _fused_adamw_calls(opt)
    if calls is None:
        opt.step()
        return
    assert _FUSED_ADAMW is not None  # _fused_adamw_calls gives calls only where there is the kernel
    grad_was = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)  # the kernels write into leaves that require grad
    try:
        for params, grads, exp_avgs, exp_avg_sqs, steps, group in calls:
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            _FUSED_ADAMW(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                         beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                         maximize=False)
    finally:
        torch._C._set_grad_enabled(grad_was)


def _fused_adamw_calls(opt: torch.optim.Optimizer) -> list[tuple[Any, ...]] | None:
    """Each param group's kernel arguments, or None where step() must run (checked before any write)."""
    if (_FUSED_ADAMW is None or type(opt) is not torch.optim.AdamW or opt._optimizer_step_pre_hooks
            or opt._optimizer_step_post_hooks or _global_optimizer_pre_hooks or _global_optimizer_post_hooks):
        return None
    calls = []
    state = opt.state
    for group in opt.param_groups:
        if not (group["fused"] and group["decoupled_weight_decay"]) or group["amsgrad"] or group["maximize"] \
                or group["differentiable"] or group["capturable"] or not isinstance(group["lr"], float):
            return None
        params = group["params"]
        if not params:
            continue
        kind = (params[0].device, params[0].dtype)
        if kind[0].type != "cpu" or kind[1].is_complex:
            return None
        grads, exp_avgs, exp_avg_sqs, steps = [], [], [], []
        for p in params:
            per = state.get(p)
            if per is None or "step" not in per or p.grad is None or (p.device, p.dtype) != kind:
                return None
            grads.append(p.grad)
            exp_avgs.append(per["exp_avg"])
            exp_avg_sqs.append(per["exp_avg_sq"])
            steps.append(per["step"])
        calls.append((params, grads, exp_avgs, exp_avg_sqs, steps, group))
    return calls
