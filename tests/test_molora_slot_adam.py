"""SlotAdamW: AdamW's updates without resets; a reset slot restarts Adam exactly; other slots untouched."""

import pytest
import torch

from copes_lib.molora.slot_adam import SlotAdamW

SLOTS, SLOT_DIM = 4, 1


def _grads(n_steps: int, shape, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    # a drifting mean keeps the moments far from a fresh start, as in training
    return [torch.randn(shape, generator=generator) + 0.5 * (t % 7) for t in range(n_steps)]


def _run(optimizer, param, grads):
    updates = []
    for g in grads:
        before = param.detach().clone()
        param.grad = g.clone()
        optimizer.step()
        updates.append(param.detach() - before)
    return updates


def _param(seed: int = 1) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn((3, SLOTS, 5), generator=torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_without_resets_it_is_adamw(weight_decay):
    ours, theirs = _param(), _param()
    grads = _grads(30, ours.shape)
    _run(SlotAdamW([ours], slot_dims=[(ours, SLOT_DIM)], lr=1e-2, weight_decay=weight_decay), ours, grads)
    _run(torch.optim.AdamW([theirs], lr=1e-2, weight_decay=weight_decay), theirs, grads)
    torch.testing.assert_close(ours.detach(), theirs.detach(), atol=1e-6, rtol=0)


def test_reset_slot_restarts_adam_for_that_slot_only():
    history, after = _grads(300, (3, SLOTS, 5)), _grads(5, (3, SLOTS, 5), seed=9)
    reset, kept = _param(), _param()
    opt_reset = SlotAdamW([reset], slot_dims=[(reset, SLOT_DIM)], lr=1e-3, weight_decay=0.0)
    opt_kept = SlotAdamW([kept], slot_dims=[(kept, SLOT_DIM)], lr=1e-3, weight_decay=0.0)
    _run(opt_reset, reset, history)
    _run(opt_kept, kept, history)
    opt_reset.reset_slot(reset, 2)
    assert opt_reset.state[reset]["step"].flatten().tolist() == [300, 300, 0, 300]

    # a fresh AdamW on slot 2 alone, from the same weights, with the same gradients
    fresh = torch.nn.Parameter(reset.detach()[:, 2].clone())
    fresh_updates = _run(torch.optim.AdamW([fresh], lr=1e-3, weight_decay=0.0), fresh,
                         [g[:, 2] for g in after])
    reset_updates, kept_updates = _run(opt_reset, reset, after), _run(opt_kept, kept, after)
    for ours, theirs in zip(reset_updates, fresh_updates):
        torch.testing.assert_close(ours[:, 2], theirs, atol=1e-7, rtol=0)
    untouched = [0, 1, 3]
    for ours, theirs in zip(reset_updates, kept_updates):
        assert torch.equal(ours[:, untouched], theirs[:, untouched])
    # a fresh Adam's first step is lr * sign(g): never larger than lr (the old reset gave ~5 lr)
    assert reset_updates[0][:, 2].abs().max() <= 1e-3 * (1 + 1e-3)


def test_zeroed_moments_under_a_shared_step_count_inflate_the_update():
    """The scheme SlotAdamW replaces, measured, so the test above is known to be able to fail."""
    param = _param()
    optimizer = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.0)
    _run(optimizer, param, _grads(300, param.shape))
    for name in ("exp_avg", "exp_avg_sq"):
        optimizer.state[param][name][:, 2].zero_()
    first = _run(optimizer, param, _grads(1, param.shape, seed=9))[0]
    assert first[:, 2].abs().mean() > 2 * first[:, [0, 1, 3]].abs().mean()
    assert first[:, 2].abs().min() > 1.4e-3  # a fresh Adam's first step is at most lr = 1e-3


def test_reset_of_a_tensor_without_slot_dimension_is_refused():
    plain = _param()
    optimizer = SlotAdamW([plain])
    with pytest.raises(KeyError, match="slot dimension"):
        optimizer.reset_slot(plain, 0)
