"""Exceptions raised for bad input.

Every error this package raises about user input is an :class:`RLLMTorchError`, and also a
:class:`ValueError` or :class:`TypeError`, so ``except ValueError`` keeps working for callers
who do not know this package. Messages name the argument, the group or position, the value
received and the fix.
"""

from __future__ import annotations

__all__ = [
    "RLLMTorchError",
    "InvalidRewardsError",
    "InvalidRewardTypeError",
    "InvalidGroupIndexError",
    "UnknownEstimatorError",
    "EstimatorOutputError",
    "EstimatorRegistrationError",
    "ConfigError",
    "LossDeclarationError",
    "UnknownArgumentError",
    "InvalidTrajectoryError",
    "UnknownBackendError",
    "BackendRegistrationError",
    "DatasetNotFoundError",
    "DatasetFormatError",
    "ModelNotFoundError",
    "WorkflowError",
    "RewardTimeoutError",
    "CheckpointError",
    "CheckpointMismatchError",
    "DistributedSetupError",
    "DistributedBatchError",
    "DistributedTimeoutError",
    "OutOfMemoryError",
    "NonFiniteGradientError",
]


class RLLMTorchError(Exception):
    """Base class of every input error raised by ``rllm_torch``."""


class InvalidRewardsError(RLLMTorchError, ValueError):
    """Rewards have the wrong shape, length, device, or contain ``None``."""


class InvalidRewardTypeError(RLLMTorchError, TypeError):
    """Rewards (or a group of them) are of a type that is not a number."""


class InvalidGroupIndexError(RLLMTorchError, ValueError):
    """A group index, group label or padding mask is inconsistent with the rewards."""


class UnknownEstimatorError(RLLMTorchError, ValueError):
    """An advantage estimator name that is not registered."""


class EstimatorRegistrationError(RLLMTorchError, TypeError):
    """``register_rllm_adv_estimator`` used without a name, or with something that is not a function."""


class EstimatorOutputError(RLLMTorchError, TypeError):
    """A registered (custom) estimator returned something other than the documented pair."""


class ConfigError(RLLMTorchError, ValueError):
    """A setting (algorithm or training run) that is missing, invalid, of the wrong type, or
    inconsistent with another one."""


class LossDeclarationError(ConfigError):
    """A built-in loss declared with an option that no run setting feeds (or a setting the run's
    schema does not have): refused when its module is imported, naming the loss, the option and
    where to declare it."""


class UnknownArgumentError(RLLMTorchError, TypeError):
    """A keyword argument that the function does not take (a misspelling, or one of rLLM's that
    ``rllm_torch`` does not implement)."""


class InvalidTrajectoryError(RLLMTorchError, ValueError):
    """Episodes, trajectories or steps that cannot be grouped or trained on as given."""


class UnknownBackendError(ConfigError):
    """``backend.name`` (or a ``backend_cls``) that is not a known backend: not registered, or an
    import path ``package.module:Class`` that cannot be imported."""


class BackendRegistrationError(RLLMTorchError, TypeError):
    """``register_backend`` given something that cannot be a backend: a name that is not a
    non-empty string, something other than a class, a class that does not implement
    ``BackendProtocol``'s methods, settings that are not a dataclass with a ``name`` field, or a
    name registered already to another class."""


class DatasetNotFoundError(ConfigError):
    """A dataset file named in the task config does not exist."""


class DatasetFormatError(ConfigError):
    """A dataset file that is there but cannot be read as given: an unknown suffix, no rows, a
    line that is not one JSON object, a row without the prompt or answer key."""


class ModelNotFoundError(ConfigError):
    """``model.path`` names a directory that does not exist or holds no model."""


class WorkflowError(RLLMTorchError, RuntimeError):
    """A workflow kept failing on one task after every retry (with ``raise_on_error``).

    Not an input error: it wraps the workflow's own last exception (``__cause__``).
    """


class RewardTimeoutError(WorkflowError):
    """A reward function did not return within ``rllm.workflow.reward_timeout_s`` (the attempt
    fails like any workflow error: retried, then raised or recorded as ``termination_reason=timeout``)."""


class CheckpointError(RLLMTorchError, RuntimeError):
    """A checkpoint could not be written (e.g. a full disk) or the one asked for cannot be read.

    Not an input error when saving fails: it wraps the ``OSError`` (``__cause__``) and says which
    earlier checkpoint is still intact.
    """


class CheckpointMismatchError(ConfigError):
    """The run's config changed, since its newest checkpoint, in a setting resuming cannot honour
    (model architecture, estimator, group size, batch size, seed, data)."""


class DistributedSetupError(RLLMTorchError, ValueError):
    """``torch.distributed`` is not set up for what was asked: no initialised process group, an
    object that is not a ``ProcessGroup``, a rank outside the group, a backend that cannot carry
    the tensors' device, or a run launched on more ranks than its settings allow."""


class DistributedTimeoutError(RLLMTorchError, RuntimeError):
    """A collective of a run of several processes did not complete within ``backend.dist_timeout_s``,
    or its peer went away: another rank stopped, hangs, or is slower by more than the timeout.

    Not an input error: it wraps the communication backend's own error (``__cause__``).
    """


class DistributedBatchError(RLLMTorchError, ValueError):
    """The ranks of a process group passed batches that do not fit together (different
    ``num_groups``, reward dtypes or layouts)."""


class OutOfMemoryError(RLLMTorchError, RuntimeError):
    """A stage of a training step (sampling, the log-prob passes, the update) ran out of device or
    host memory. Not an input error, and not retried: it wraps the allocator's error
    (``__cause__``) and names the stage and the settings that lower its memory."""


class NonFiniteGradientError(RLLMTorchError, RuntimeError):
    """An optimizer step's gradient norm was NaN or infinite: the step was not taken (the weights
    stay those of the last good step). Names the step's loss and the settings that usually cause it."""
