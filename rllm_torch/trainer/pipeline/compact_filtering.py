"""Compact filtering: leave out episodes that ended for chosen reasons (rLLM's
``CompactFilteringConfig``)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import TerminationReason, parse_termination_reason
from rllm_torch.trainer.schema import CompactFilteringFlags

__all__ = ["CompactFilteringConfig"]

_FLAGS = {
    "mask_max_prompt_length_exceeded": TerminationReason.MAX_PROMPT_LENGTH_EXCEEDED,
    "mask_max_response_length_exceeded": TerminationReason.MAX_RESPONSE_LENGTH_EXCEEDED,
    "mask_env_done": TerminationReason.ENV_DONE,
    "mask_max_turns_exceeded": TerminationReason.MAX_TURNS_EXCEEDED,
    "mask_timeout": TerminationReason.TIMEOUT,
    "mask_unknown": TerminationReason.UNKNOWN,
    "mask_error": TerminationReason.ERROR,
}
#: rLLM's ``terminal-rl`` flags for the reasons its agent flows and sandboxes end episodes with
#: (``rllm/types.py``): no episode here ends for one, so they mask nothing.
_INFRA_FLAGS = (
    "mask_verifier_timeout",
    "mask_grading_error",
    "mask_sandbox_error",
    "mask_agent_setup_timeout",
    "mask_env_start_timeout",
    "mask_model_error",
)


@dataclass
class CompactFilteringConfig(CompactFilteringFlags):
    """Which termination reasons make an episode be left out of training.

    Attributes:
        enable: master switch; when False nothing is masked.
        mask_reasons: more reasons to mask, as :class:`TerminationReason` members or their
            string values (``["timeout", "error"]``); read into members at construction.

    rLLM's per-reason flags (``mask_max_prompt_length_exceeded``, ``mask_max_response_length_exceeded``,
    ``mask_env_done``, ``mask_max_turns_exceeded``, ``mask_timeout``, ``mask_unknown``, ``mask_error``)
    are :class:`~rllm_torch.trainer.schema.CompactFilteringFlags`'. An episode without a termination
    reason counts as ``UNKNOWN`` (as rLLM). Its ``terminal-rl`` branch's flags for the reasons of its
    agent flows and sandboxes (``mask_verifier_timeout``, ``mask_grading_error``, ``mask_sandbox_error``,
    ``mask_agent_setup_timeout``, ``mask_env_start_timeout``, ``mask_model_error``; False by default, as
    in its dataclass) mask nothing here, where no episode ends for those reasons.

    Warns:
        UserWarning: once, one of those flags set with ``enable``: it masks nothing here.

    Raises:
        ValueError: a reason in ``mask_reasons`` is not a TerminationReason value, or a flag is not a bool.

    Examples:
        >>> CompactFilteringConfig(enable=True, mask_reasons=["timeout"]).should_mask("timeout")
        True
    """

    mask_reasons: Iterable[TerminationReason | str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("enable", *_FLAGS, *_INFRA_FLAGS):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"CompactFilteringConfig.{name} must be a bool, got {getattr(self, name)!r}.")
        if self.enable and (infra := [f"rllm.compact_filtering.{f}" for f in _INFRA_FLAGS if getattr(self, f)]):
            warnings.warn(
                f"{', '.join(infra)}: rLLM's (branch terminal-rl) reasons of its agent flows and sandboxes, which no "
                "episode here ends for, so they mask nothing (a workflow that fails ends as error: mask_error; a reward "
                "past rllm.workflow.reward_timeout_s as timeout: mask_timeout).",
                UserWarning,
                stacklevel=3,
            )
        if isinstance(self.mask_reasons, (str, TerminationReason)):
            self.mask_reasons = (self.mask_reasons,)
        self.mask_reasons = tuple(
            parse_termination_reason(r, "CompactFilteringConfig.mask_reasons") for r in self.mask_reasons
        )

    @property
    def masked_reasons(self) -> frozenset[TerminationReason]:
        """Every reason that is masked (empty when ``enable`` is False)."""
        if not self.enable:
            return frozenset()
        return frozenset(reason for flag, reason in _FLAGS.items() if getattr(self, flag)) | frozenset(
            self.mask_reasons
        )

    def should_mask(self, termination_reason: TerminationReason | str | None) -> bool:
        """True when an episode that ended for ``termination_reason`` is left out.

        Args:
            termination_reason: a :class:`TerminationReason`, its string value, or None (= UNKNOWN).

        Raises:
            ValueError: a string that is not a TerminationReason value.
        """
        if not self.enable:
            return False
        reason = (
            TerminationReason.UNKNOWN
            if termination_reason is None
            else parse_termination_reason(termination_reason, "should_mask")
        )
        return reason in self.masked_reasons

    @classmethod
    def from_config(cls, config: DictConfig | dict) -> CompactFilteringConfig:
        """Build from rLLM's ``rllm.compact_filtering`` section (unknown keys raise ``TypeError``)."""
        values = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)
        return cls(**values)
