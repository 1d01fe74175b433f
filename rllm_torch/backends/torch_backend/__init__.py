"""The embedded pure-PyTorch backend: a ``transformers`` causal LM, batched sampling (``generate``, or a
colocated vLLM engine), and the policy losses (PPO, importance sampling, CISPO, DRO, cross-entropy) and
rollout correction on packed token tensors."""

from rllm_torch.backends.torch_backend.backend import TorchBackend
from rllm_torch.backends.torch_backend.forward import PolicyScorer, TokenScores, token_log_probs, token_scores
from rllm_torch.backends.torch_backend.logprobs import chunked_token_log_probs
from rllm_torch.backends.torch_backend.rollout import SamplingParams, TorchRolloutEngine
from rllm_torch.backends.torch_backend.sampling import sample_completions
from rllm_torch.backends.torch_backend.tokenizer import build_char_tokenizer
from rllm_torch.backends.torch_backend.vllm_rollout import VllmRolloutEngine, sample_with_vllm
from rllm_torch.core.losses import *  # noqa: F403 - re-exported public surface
from rllm_torch.core.losses import __all__ as _losses_all

__all__ = [
    "TorchBackend",
    "TorchRolloutEngine",
    "VllmRolloutEngine",
    "sample_with_vllm",
    "SamplingParams",
    "sample_completions",
    "token_log_probs",
    "token_scores",
    "TokenScores",
    "PolicyScorer",
    "chunked_token_log_probs",
    "build_char_tokenizer",
    *_losses_all,
]
