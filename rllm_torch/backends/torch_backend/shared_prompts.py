"""Shared prompts in the scoring forward: a step's ``n`` rollouts of one task begin with the same
prompt, so each distinct prompt goes through the model once per micro-batch, followed in the same
packed row by every rollout's continuation, under a block attention mask (each continuation sees
the prompt and itself, never another rollout) and each token at its own position. The prompt's
tokens are then computed once instead of ``n`` times (SmolLM2's recipe: 46 of a row's ~71 tokens
are prompt, so a step's forward and backward take 2,048 tokens instead of 4,544), and the
gradient that reaches the shared prompt is the sum of its rollouts', as with ``n`` separate rows.

What is shared is a row's tokens before the one that predicts its first scored token (the prompt
but its last token, which every continuation starts with, as sampling's shared prefill does).
Rows that share nothing stay rows of their own. :func:`plan_shared_micro_batches` keeps a
prompt's rows together when it cuts micro-batches (budgets count packed tokens); :func:`pack_rows`
lays them out; :func:`~rllm_torch.backends.torch_backend.forward.token_scores` runs the body on
the packed rows and gathers each scored position's hidden state back. The model must take a 4D
attention mask as given (``transformers``' models with ``sdpa`` or ``eager`` attention do);
:func:`check_shared_prompts` compares both layouts on a few tokens at start-up.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rllm_torch.core.errors import ConfigError

__all__ = ["PackedRows", "prompt_prefixes", "pack_rows", "plan_shared_micro_batches", "SHARED_ATTENTION"]

SHARED_ATTENTION = ("sdpa", "eager")
"""``transformers`` attention implementations that take a custom 4D mask as given."""


def prompt_prefixes(input_ids: Tensor, attention_mask: Tensor, positions: Tensor) -> list[tuple[int, ...] | None]:
    """Each row's shared part: the tokens before the one that predicts its first scored token
    (``positions[r, t]`` true for ``t >= 1``), or None for a row with nothing scored. One host
    copy of the three ``[R, T]`` tensors.

    Examples:
        >>> ids = torch.tensor([[5, 6, 7, 8, 0], [5, 6, 7, 9, 9]])
        >>> mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
        >>> prompt_prefixes(ids, mask, torch.tensor([[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]))
        [(5, 6), (5, 6)]
    """
    ids, want = input_ids.tolist(), (positions.bool() & attention_mask.bool()).tolist()
    prefixes: list[tuple[int, ...] | None] = []
    for row_ids, row_want in zip(ids, want, strict=True):
        first = next((t for t in range(1, len(row_want)) if row_want[t]), None)
        prefixes.append(None if first is None else tuple(row_ids[: first - 1]))
    return prefixes


def plan_shared_micro_batches(
    prefixes: list[tuple[int, ...] | None], lengths: list[int], budget: int | None
) -> list[list[int]]:
    """Rows grouped into micro-batches whose packed rows (a prompt once, then its rollouts'
    continuations) times the longest of them is at most ``budget`` tokens; a prompt's rows stay
    together unless they do not fit in one packed row (then the prompt is repeated). Packed rows
    are placed longest first, greedily, as :func:`~.micro_batches.plan_micro_batches` places rows.

    Args:
        prefixes: :func:`prompt_prefixes` of the rows (None: nothing scored; a packed row of its own).
        lengths: each row's real length in tokens.
        budget: ``backend.micro_batch_tokens`` (None: one micro-batch).

    Raises:
        ConfigError: a single row longer than ``budget`` (naming the setting).

    Examples:
        >>> plan_shared_micro_batches([(1, 2), (1, 2), (3,), (3,)], [6, 5, 4, 4], 12)
        [[0, 1], [2, 3]]
    """
    if not lengths:
        return []
    groups: dict[object, list[int]] = {}
    for r, prefix in enumerate(prefixes):
        groups.setdefault(prefix if prefix is not None else ("row", r), []).append(r)
    units: list[tuple[int, list[int]]] = []  # (packed length, rows)
    for key, rows in groups.items():
        shared = len(key) if prefixes[rows[0]] is not None else 0
        rows = sorted(rows, key=lambda r: (-lengths[r], r))
        if budget is not None and lengths[rows[0]] > budget:
            raise ConfigError(
                f"backend.micro_batch_tokens={budget} is smaller than a row of {lengths[rows[0]]} tokens (prompt and "
                f"response): raise it to {lengths[rows[0]]} or more, or lower rllm.rollout.max_new_tokens."
            )
        chunk, cost = [], shared
        for r in rows:
            extra = lengths[r] - shared
            if chunk and budget is not None and cost + extra > budget:
                units.append((cost, chunk))
                chunk, cost = [], shared
            chunk.append(r)
            cost += extra
        units.append((cost, chunk))
    units.sort(key=lambda unit: (-unit[0], unit[1][0]))
    plan, current, longest = [], [], 0
    for cost, rows in units:
        if current and budget is not None and (len(current) + 1) * max(longest, cost) > budget:
            plan.append([r for unit in current for r in unit])
            current, longest = [], 0
        current.append(rows)
        longest = max(longest, cost)
    return plan + [[r for unit in current for r in unit]]


class PackedRows(NamedTuple):
    """Rows packed by shared prompt: ``input_ids`` and ``position_ids`` ``[G, L]`` int64,
    ``attention_mask`` ``[G, 1, L, L]`` (bool, True: attends; ``eager``: float, 0 or the dtype's
    minimum), and for each scored token of the original rows, in their row-major order, the packed
    ``rows`` and ``columns`` ``[M]`` of the hidden state that predicts it."""

    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor
    rows: Tensor
    columns: Tensor


def pack_rows(
    input_ids: Tensor, attention_mask: Tensor, positions: Tensor, *, eager: bool = False, min_saving: float = 0.25
) -> PackedRows | None:
    """Pack right-padded ``[R, T]`` rows by :func:`prompt_prefixes` (see the module docstring);
    None when that saves less than ``min_saving`` of the padded tokens (nothing worth sharing).
    ``eager``: an additive float mask (``eager`` attention) instead of a boolean one."""
    device = input_ids.device
    prefixes = prompt_prefixes(input_ids, attention_mask, positions)
    lengths = attention_mask.sum(-1).tolist()
    ids, want = input_ids.tolist(), (positions.bool() & attention_mask.bool()).tolist()
    groups: dict[object, list[int]] = {}
    for r, prefix in enumerate(prefixes):
        if prefix is not None:
            groups.setdefault(prefix, []).append(r)
    packed_ids, packed_pos, segments, start = [], [], [], {}
    for prefix, rows in groups.items():
        shared = len(prefix)
        row_ids, row_pos, row_seg = list(prefix), list(range(shared)), [0] * shared
        for j, r in enumerate(rows, start=1):
            start[r] = (len(packed_ids), len(row_ids))  # packed row, and the column of the row's token `shared`
            row_ids += ids[r][shared : lengths[r]]
            row_pos += range(shared, lengths[r])
            row_seg += [j] * (lengths[r] - shared)
        packed_ids.append(row_ids)
        packed_pos.append(row_pos)
        segments.append(row_seg)
    width = max(map(len, packed_ids), default=0)
    if len(packed_ids) * width > (1 - min_saving) * input_ids.shape[0] * max(lengths, default=0):
        return None
    ids_GL = torch.zeros((len(packed_ids), width), dtype=torch.int64)
    pos_GL = torch.zeros_like(ids_GL)
    seg_GL = torch.full_like(ids_GL, -1)  # -1: padding
    for g, (row_ids, row_pos, row_seg) in enumerate(zip(packed_ids, packed_pos, segments, strict=True)):
        ids_GL[g, : len(row_ids)], pos_GL[g, : len(row_pos)] = torch.tensor(row_ids), torch.tensor(row_pos)
        seg_GL[g, : len(row_seg)] = torch.tensor(row_seg)
    column_L = torch.arange(width)
    causal_LL = column_L[None, :] <= column_L[:, None]
    same_GLL = seg_GL[:, :, None] == seg_GL[:, None, :]
    mask_GLL = causal_LL & (same_GLL | (seg_GL[:, None, :] == 0))  # its own segment, and the shared prompt
    rows_M, columns_M = [], []
    for r, row_want in enumerate(want):
        if r not in start:
            continue
        g, column = start[r]
        shared = len(prefixes[r])
        for t in range(1, lengths[r]):
            if row_want[t]:  # hidden t - 1 (>= shared: the first scored token is shared + 1) predicts token t
                rows_M.append(g)
                columns_M.append(column + t - 1 - shared)
    mask = mask_GLL[:, None].to(device)
    if eager:
        mask = torch.zeros(mask.shape, device=device).masked_fill_(~mask, torch.finfo(torch.float32).min)
    return PackedRows(
        ids_GL.to(device),
        pos_GL.to(device),
        mask,
        torch.tensor(rows_M, dtype=torch.int64, device=device),
        torch.tensor(columns_M, dtype=torch.int64, device=device),
    )
