"""``rllm.trainer.algorithms.loss``: users' policy losses (rLLM's ``terminal-rl`` branch). Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`).

``echo`` is rLLM's (:func:`rllm_torch.core.losses.echo_loss`). The branch's other built-in losses
(``ppo_clip``, ``dppo_tv``, ... as functions of a ``LossContext``) and its resolution helpers (``RLLM_LOSS_REGISTRY``, ``resolve_loss``, ``get_loss``, ...) are not
mirrored: importing one raises an ``ImportError`` that says what to use here."""

from rllm_torch.core.losses import LOSS_INPUTS, LossContext, register_loss
from rllm_torch.core.losses import echo_loss as echo
from rllm_torch.rllm.config_fields import load_loss_plugins

__all__ = ["LOSS_INPUTS", "LossContext", "register_loss", "load_loss_plugins", "echo"]

_BUILT_INS = ("ppo_clip", "dppo_tv", "dppo_kl", "icepop", "cispo", "gspo", "reinforce", "reinforce_kl")
_HELPERS = (
    "RLLM_LOSS_REGISTRY",
    "ResolvedLoss",
    "resolve_loss",
    "get_loss",
    "is_custom_loss",
    "native_loss_names",
    "DEFAULT_LOSS_AGG_MODE",
    "LOSS_AGG_MODES",
    "offpolicy_metrics",
)
_HERE = (
    "rllm.algorithm.loss_fn (or loss_fn_map) at start-up, one of rllm_torch.core.losses.loss_names(); a loss of your "
    "own is written with register_loss(name)"
)
#: terminal-rl's names here that are not mirrored, and what to use instead.
NOT_MIRRORED = {
    **dict.fromkeys(
        _BUILT_INS,
        f"the branch's built-in losses are functions of a LossContext; here a run's loss is named by {_HERE}",
    ),
    **dict.fromkeys(_HELPERS, f"the branch resolves its losses with these; here a run resolves {_HERE}"),
}


def __getattr__(name: str) -> object:
    """Raises ``ImportError`` for the branch's names that are not mirrored, saying what to use here."""
    if name in NOT_MIRRORED:
        raise ImportError(
            f"rLLM's rllm.trainer.algorithms.loss.{name} (branch terminal-rl) is not mirrored in rllm_torch: "
            f"{NOT_MIRRORED[name]}."
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
