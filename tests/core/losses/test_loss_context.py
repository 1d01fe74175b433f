"""What a loss registered with ``register_loss`` is given and what becomes of its metrics, at the
core (no model): ``LossContext.seq_reduce`` (each row's masked mean or sum, broadcast back to
the row's tokens), and the names its metrics are logged under by ``RegisteredLoss.compute`` (a key
with a ``/`` kept as it is, rLLM's ``"icepop/mask_frac"``; any other under the loss's name).
Expected values are worked by hand in the comments."""

from __future__ import annotations

import torch

from rllm_torch.core.losses.registry import LossContext, RegisteredLoss

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [2.0, 10.0, 20.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


def context(values: torch.Tensor = VALUES, mask: torch.Tensor = MASK) -> LossContext:
    def aggregate(per_token, m, mode=None):  # token-mean, as check_registered_loss's
        return (per_token * m).sum() / m.sum().clamp(min=1.0)

    return LossContext(
        logp_curr=values.log().requires_grad_(),
        logp_old=values.log(),
        advantages=torch.ones_like(values),
        action_mask=mask,
        obs_mask=torch.zeros_like(mask),
        aggregate=aggregate,
    )


def test_seq_reduce_mean_is_each_rows_masked_mean_on_every_token_of_the_row():
    # row 0: (1 + 2) / 2 = 1.5; row 1: (4 + 5 + 6) / 3 = 5; row 2: no token, 0 / max(0, 1) = 0;
    # row 3: 10 / 1 = 10 (the masked 2 and 20 left out)
    want = [[1.5] * 3, [5.0] * 3, [0.0] * 3, [10.0] * 3]
    ctx = context()
    assert ctx.seq_reduce(VALUES, MASK, "mean").tolist() == want
    assert ctx.seq_reduce(VALUES, MASK).tolist() == want  # mean is the default


def test_seq_reduce_sum_is_each_rows_masked_sum_on_every_token_of_the_row():
    # row 0: 1 + 2 = 3; row 1: 4 + 5 + 6 = 15; row 2: 0; row 3: 10
    got = context().seq_reduce(VALUES, MASK, "sum")
    assert got.tolist() == [[3.0] * 3, [15.0] * 3, [0.0] * 3, [10.0] * 3]
    assert got.shape == VALUES.shape


def test_a_sequence_level_loss_written_with_seq_reduce_gets_each_rows_mean_log_ratio():
    """GSPO's sequence ratio exp(mean_t(log pi - log pi_old)) from seq_reduce: the mean of the
    row's two log-ratios log 2 and log 8 is log 4 (a sum would give log 16)."""
    logp_old = torch.zeros(1, 3)
    logp = torch.tensor([[2.0, 8.0, 100.0]]).log()
    ctx = context(mask=torch.tensor([[1.0, 1.0, 0.0]]))
    ratio = ctx.seq_reduce(logp - logp_old, ctx.action_mask).exp()
    torch.testing.assert_close(ratio, torch.full((1, 3), 4.0))


def _loss_returning(name: str, metrics: dict) -> RegisteredLoss:
    def fn(ctx: LossContext):
        return ctx.aggregate(-ctx.advantages * ctx.logp_curr, ctx.action_mask), metrics

    return RegisteredLoss(name, fn, None, frozenset())


def test_a_metric_key_with_a_slash_keeps_its_name_and_one_without_gets_the_losss_name():
    loss = _loss_returning("my_icepop", {"icepop/mask_frac": 0.25, "ratio_mean": torch.tensor(1.5), "a/b/c": 2})
    _, metrics = loss.compute(context())
    assert sorted(metrics) == ["a/b/c", "icepop/mask_frac", "my_icepop/ratio_mean"]
    assert {k: v.item() for k, v in metrics.items()} == {
        "icepop/mask_frac": 0.25,
        "my_icepop/ratio_mean": 1.5,
        "a/b/c": 2.0,
    }
    assert all(v.dtype == torch.float32 and v.dim() == 0 and not v.requires_grad for v in metrics.values())
