"""The core: packed rewards, segment reductions and their collectives, the token helpers and the
estimators as pure functions of tensors. It imports torch and numpy only (a test checks it), so
it is all a custom training loop needs.

* :mod:`~rllm_torch.core.packing`: :class:`GroupedRewards`, flat ⇄ padded, constructors with input checks;
* :mod:`~rllm_torch.core.segment`: segment reductions and :class:`~rllm_torch.core.segment.SegmentLayout`
  (the one place estimators' numerics and collectives are defined);
* :mod:`~rllm_torch.core.distributed`: process groups for the packed layout, cross-rank input checks;
* :mod:`~rllm_torch.core.tokens`: ``[B, T]`` token rewards and advantages;
* :mod:`~rllm_torch.core.turns`: :class:`GroupedTurns`, the turns of multi-turn trajectories
  (their credit schemes are in :mod:`~rllm_torch.core.estimators.turns`);
* :mod:`~rllm_torch.core.estimators`: one module per estimator family;
* :mod:`~rllm_torch.core.losses`: the policy losses, their aggregation and the registry of users' losses;
* :mod:`~rllm_torch.core.errors`: the package's exception hierarchy.
"""

from rllm_torch.core.distributed import ONE_PROCESS
from rllm_torch.core.errors import *  # noqa: F403 - re-exported public surface
from rllm_torch.core.errors import __all__ as _errors_all
from rllm_torch.core.estimators import *  # noqa: F403 - re-exported public surface
from rllm_torch.core.estimators import __all__ as _estimators_all
from rllm_torch.core.labels import factorize_group_labels
from rllm_torch.core.losses.registry import LossContext, register_loss
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.returns import discounted_returns, masked_whiten
from rllm_torch.core.segment import segment_count, segment_mean, segment_sum, segment_var_mean
from rllm_torch.core.tokens import TokenRewards, broadcast_to_tokens, sequence_scores
from rllm_torch.core.turns import GroupedTurns

__all__ = [
    "GroupedRewards",
    "GroupedTurns",
    "ONE_PROCESS",
    "factorize_group_labels",
    "segment_count",
    "segment_sum",
    "segment_mean",
    "segment_var_mean",
    "TokenRewards",
    "sequence_scores",
    "broadcast_to_tokens",
    "discounted_returns",
    "masked_whiten",
    "LossContext",
    "register_loss",
    *_estimators_all,
    *_errors_all,
]
