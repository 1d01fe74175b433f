"""Rollout rejection sampling: leave out tokens or whole sequences whose old-policy log-probs have
drifted too far from the sampler's (verl's ``rollout_rs``), beside the importance weights of
:mod:`~rllm_torch.core.losses.rollout_correction`.

With ``log r_t = clamp(log π_old - log π_rollout, ±20)`` on each trained token, the statistics
are ``k1 = -log r``, ``k2 = ½ (log r)²`` and ``k3 = e^{log r} - 1 - log r``; an option names a
statistic and where it is taken:

===================  =====================================================================
option               rejects
===================  =====================================================================
``token_k{1,2,3}``   a token whose statistic is out of bounds (the token only)
``seq_sum_k{1,2,3}``  a sequence whose statistic summed over its trained tokens is out of bounds
``seq_mean_k{1,2,3}`` ... whose mean over them is out of bounds
``seq_max_k{2,3}``    ... whose largest token statistic is out of bounds
===================  =====================================================================

Bounds: a ``k1`` option keeps ``log lower <= k1 <= log upper`` (a ratio range ``[lower, upper]``
for ``π_rollout / π_old``); a ``k2`` / ``k3`` option keeps ``stat <= upper``. Several options
(comma-separated) must all keep a token. Thresholds (verl's syntax): one number or string for
every option, or one per option, comma-separated; a ``k1`` entry is ``"lower_upper"`` (e.g.
``"0.5_2.0"``) or an upper ``u`` alone (lower ``1/u``); a ``k2`` / ``k3`` entry one positive
number.

Source: verl ``verl/trainer/ppo/rollout_corr_helper.py`` (``rollout_rs``,
``rollout_rs_threshold``; it applies the mask before the advantages are computed, so a
sequence rejected whole takes no part in its group's statistics, as here).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from rllm_torch.core.losses.ratio import LOG_RATIO_CLAMP

__all__ = ["ROLLOUT_RS_OPTIONS", "RejectionRule", "parse_rollout_rs", "rollout_rejection_mask"]

ROLLOUT_RS_OPTIONS = tuple(f"token_k{k}" for k in (1, 2, 3)) + tuple(
    f"seq_{how}_k{k}" for how in ("sum", "mean") for k in (1, 2, 3)
) + ("seq_max_k2", "seq_max_k3")  # fmt: skip


@dataclass(frozen=True)
class RejectionRule:
    """One option with its bounds: ``option`` (one of :data:`ROLLOUT_RS_OPTIONS`), ``lower``
    (``k1`` options only; a ratio) and ``upper`` (a ratio for ``k1``, a statistic else)."""

    option: str
    lower: float | None
    upper: float


def _number(text: str, option: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"rollout_rs_threshold: {text!r} (for {option}) is not a number.") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"rollout_rs_threshold: {text!r} (for {option}) must be a finite number > 0.")
    return value


def parse_rollout_rs(rollout_rs: str, threshold: str | float | int | None) -> list[RejectionRule]:
    """The rules of ``rollout_rs`` (``"token_k1,seq_mean_k3"``) with their thresholds.

    Raises:
        ValueError: an empty or unknown option, no threshold, a count of thresholds that is
            neither 1 nor one per option, an entry that is not a positive number, a ``k1``
            range with ``lower > upper``, or a ``"lower_upper"`` entry for a ``k2``/``k3`` option.
        TypeError: a threshold that is neither a string nor a number.

    Examples:
        >>> parse_rollout_rs("token_k1,seq_mean_k3", "0.5_2.0,0.01")
        [RejectionRule(option='token_k1', lower=0.5, upper=2.0), RejectionRule(option='seq_mean_k3', lower=None, upper=0.01)]
    """
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise ValueError(f"rollout_rs must be a non-empty string of options, e.g. 'token_k1'; got {rollout_rs!r}.")
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",")))
    for option in options:
        if option not in ROLLOUT_RS_OPTIONS:
            raise ValueError(f"rollout_rs option {option!r} is not one of {ROLLOUT_RS_OPTIONS}.")
    if threshold is None:
        raise ValueError(f"rollout_rs={rollout_rs!r} needs rollout_rs_threshold (one per option, or one for all).")
    if isinstance(threshold, bool) or not isinstance(threshold, (str, numbers.Real)):
        raise TypeError(f"rollout_rs_threshold must be a string or a number, got {threshold!r}.")
    entries = [e.strip() for e in str(threshold).split(",")]
    if len(entries) == 1:
        entries = entries * len(options)
    if len(entries) != len(options):
        raise ValueError(
            f"rollout_rs_threshold={threshold!r} has {len(entries)} entries for {len(options)} options; give one, or one per option."
        )
    rules = []
    for option, entry in zip(options, entries, strict=True):
        if option.endswith("k1"):
            if "_" in entry:
                low_text, _, high_text = entry.partition("_")
                lower, upper = _number(low_text, option), _number(high_text, option)
            else:
                upper = _number(entry, option)
                lower = 1.0 / upper
            if lower > upper:
                raise ValueError(f"rollout_rs_threshold {entry!r} for {option}: lower {lower} > upper {upper}.")
            rules.append(RejectionRule(option, lower, upper))
        else:
            if "_" in entry:
                raise ValueError(
                    f"rollout_rs_threshold {entry!r}: {option} takes one upper bound, not a 'lower_upper' range."
                )
            rules.append(RejectionRule(option, None, _number(entry, option)))
    return rules


def _statistic(log_ratio_NT: Tensor, kind: str) -> Tensor:
    if kind == "k1":
        return -log_ratio_NT
    if kind == "k2":
        return 0.5 * log_ratio_NT.square()
    return log_ratio_NT.exp() - 1.0 - log_ratio_NT


def rollout_rejection_mask(
    old_log_probs: Tensor, rollout_log_probs: Tensor, response_mask: Tensor, rules: list[RejectionRule]
) -> tuple[Tensor, dict[str, Tensor]]:
    """``(keep, stats)``: ``[N, T]`` float, 1 on the trained tokens every rule keeps (a sequence
    rule keeps or rejects all of a sequence's tokens), 0 elsewhere; and 0-d sums to add over
    ranks: ``tokens``, ``sequences``, ``rejected_tokens``, ``rejected_sequences`` (a sequence with a
    trained token of which some was rejected) and, per option, ``rejected_tokens/<option>``.
    Without gradient; no host sync.

    Examples:
        >>> old, rollout = torch.tensor([[0.0, -0.1], [0.0, -3.0]]), torch.zeros(2, 2)
        >>> keep, _ = rollout_rejection_mask(old, rollout, torch.ones(2, 2), parse_rollout_rs("seq_max_k2", 0.5))
        >>> keep
        tensor([[1., 1.],
                [0., 0.]])
    """
    with torch.no_grad():
        trained_NT = response_mask > 0
        mask_NT = trained_NT.to(torch.float64)
        log_ratio_NT = (old_log_probs.double() - rollout_log_probs.double()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        keep_NT = trained_NT.clone()
        stats: dict[str, Tensor] = {}
        for rule in rules:
            where, _, kind = rule.option.rpartition("_")
            stat_NT = _statistic(log_ratio_NT, kind) * mask_NT
            if where == "token":
                stat = stat_NT
            elif where == "seq_sum":
                stat = stat_NT.sum(-1, keepdim=True)
            elif where == "seq_mean":
                stat = stat_NT.sum(-1, keepdim=True) / mask_NT.sum(-1, keepdim=True).clamp(min=1.0)
            else:  # seq_max
                stat = torch.where(trained_NT, stat_NT, -math.inf).amax(-1, keepdim=True).clamp(min=0.0)
            if kind == "k1":
                ok = (stat >= math.log(rule.lower)) & (stat <= math.log(rule.upper))
            else:
                ok = stat <= rule.upper
            ok_NT = ok.expand_as(trained_NT) & trained_NT
            stats[f"rejected_tokens/{rule.option}"] = (trained_NT & ~ok_NT).double().sum()
            keep_NT &= ok_NT
        rejected_N = (trained_NT & ~keep_NT).any(-1)
        stats |= {
            "tokens": mask_NT.sum(),
            "sequences": trained_NT.any(-1).double().sum(),
            "rejected_tokens": (trained_NT & ~keep_NT).double().sum(),
            "rejected_sequences": rejected_N.double().sum(),
        }
        return keep_NT.to(response_mask.dtype), stats
