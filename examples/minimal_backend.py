"""A training backend in one file: sampling, log-probs and a policy-gradient update in plain
PyTorch, with its own settings section (``backend.lr``, ``backend.optimizer``, ``backend.seed``).

It trains the default job of ``rllm-torch-train`` with only ``backend.name`` changed::

    PYTHONPATH=. rllm-torch-train backend.name=examples.minimal_backend:MinimalBackend
    PYTHONPATH=. rllm-torch-train backend.name=minimal imports=[examples.minimal_backend] backend.optimizer=sgd

The trainer samples through the engine this backend gives the workflows, groups the episodes,
computes the advantages (``rllm.algorithm.adv_estimator``) on the :class:`TokenBatch` this backend
builds, and calls :meth:`MinimalBackend.update_policy`: REINFORCE with the trainer's advantages,
``-mean(A * log pi)`` over the response tokens, one optimiser step per batch. It reuses the
project's model and tokenizer builders; what it does not implement it refuses at start-up
(:meth:`MinimalBackend.validate_config`). See docs/add-a-backend.md.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import torch

from rllm_torch import register_backend
from rllm_torch.backends.torch_backend.model import build_policy
from rllm_torch.backends.torch_backend.tokenizer import build_char_tokenizer
from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.settings import setting
from rllm_torch.trainer.pipeline.token_batch import TokenBatch, build_token_batch
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.rollout_engine import ModelOutput, RolloutEngine

OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


@dataclass
class MinimalSettings:
    """The run's ``backend`` section when this backend trains (``backend.<key>=...``)."""

    name: str = setting("minimal", "the training backend")
    lr: float = setting(1e-3, "the optimiser's learning rate", minimum=0, exclusive_minimum=True)
    optimizer: str = setting("adamw", "adamw | sgd", choices=tuple(OPTIMIZERS))
    seed: int = setting(0, "the model's initialisation and the sampler")


class _Sampler(RolloutEngine):
    """Gathers the ``generate`` calls of one turn of the event loop (the episodes of a batch start
    together) and samples them as one batch."""

    def __init__(self, backend: MinimalBackend) -> None:
        self.backend, self.pending = backend, []

    async def generate(self, prompt: str) -> ModelOutput:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((prompt, future))
        if len(self.pending) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self.pending = self.pending, []
        try:
            outputs = self.backend.sample([prompt for prompt, _ in batch], validation=self.validation)
        except Exception as exc:  # noqa: BLE001 - every waiting episode gets the error
            outputs = [exc] * len(batch)
        for (_, future), output in zip(batch, outputs, strict=True):
            if not future.done():
                (future.set_exception if isinstance(output, Exception) else future.set_result)(output)


@register_backend("minimal")  # or register_backend("minimal", settings=...) with no class attribute
class MinimalBackend(BackendProtocol):
    """A tiny model from scratch on one process; ``self.config.backend`` is a :class:`MinimalSettings`."""

    settings = MinimalSettings  # what types the run's backend section (register_backend reads it)

    def __init__(self, config, ranks=None, *, alphabet=None, max_new_tokens=None, tasks=(), **kwargs) -> None:
        super().__init__(config, ranks)
        section, rows = self.config.backend, [t for t in tasks if isinstance(t, dict)]
        alphabet = alphabet or "".join(sorted({c for t in rows for c in f"{t['prompt']}{t.get('answer', '')}"}))
        self.tokenizer = build_char_tokenizer(alphabet)
        self.model = build_policy(self.config.model, self.tokenizer, seed=section.seed)
        self.optimizer = OPTIMIZERS[section.optimizer](self.model.parameters(), lr=section.lr)
        self.generator, self.device = torch.Generator().manual_seed(section.seed), torch.device("cpu")
        rollout = self.config.rllm.rollout
        if rollout.max_new_tokens is None:  # the run records the length it trains with
            longest = max((len(str(t.get("answer", ""))) for t in rows), default=1)
            rollout.max_new_tokens = max_new_tokens or 2 * longest  # the answer and the end token, with room

    def validate_config(self) -> None:
        algorithm, rollout = self.config.rllm.algorithm, self.config.rllm.rollout
        refused = {
            "rllm.algorithm.loss_fn (its loss is REINFORCE's)": algorithm.loss_fn not in (None, "ppo")
            or bool(algorithm.loss_fn_map),
            "rllm.algorithm.use_kl_loss / use_kl_in_reward": algorithm.use_kl_loss or algorithm.use_kl_in_reward,
            "rllm.rollout.top_p / val_top_p below 1": min(rollout.top_p, rollout.val_top_p) < 1,
            "rllm.async_training.enable": self.config.rllm.async_training.enable,
            "model.path (it builds its model from scratch)": self.config.model.path is not None,
            "several processes": self.ranks.distributed,
        }
        if found := [what for what, on in refused.items() if on]:
            raise ConfigError(f"the minimal backend does not implement {'; '.join(found)}: use backend.name=torch.")

    def init_rollout_engine(self, **kwargs) -> _Sampler:
        return _Sampler(self)

    def get_dataloader(self, dataset, trainer_state) -> list:
        """One pass's batches of ``(task_id, task)`` pairs, in the dataset's order."""
        rows, size = list(dataset or []), self.config.data.train_batch_size
        return [[(f"task-{i}", rows[i]) for i in range(s, min(s + size, len(rows)))] for s in range(0, len(rows), size)]

    async def generate_episodes(self, batch, agent_workflow_engine, is_validation=False) -> list:
        rollout = self.config.rllm.rollout
        n = rollout.n_val if is_validation else rollout.n
        agent_workflow_engine.rollout_engine.validation = is_validation
        tasks = [(task_id, task, k) for task_id, task in batch for k in range(n)]
        return await agent_workflow_engine.execute_tasks(
            [t for _, t, _ in tasks], [i for i, _, _ in tasks], [k for *_, k in tasks]
        )

    def _logits(self, ids_RT: torch.Tensor, mask_RT: torch.Tensor) -> torch.Tensor:
        """``[R, T, V]`` next-token logits, positions counted over real tokens (left or right padding)."""
        positions_RT = (mask_RT.cumsum(-1) - 1).clamp(min=0)
        return self.model(input_ids=ids_RT, attention_mask=mask_RT, position_ids=positions_RT).logits.float()

    @torch.no_grad()
    def sample(self, prompts: list[str], *, validation: bool) -> list[ModelOutput]:
        """One completion per prompt, each token drawn from ``softmax(logits / temperature)``
        (temperature 0: greedy), with its log-prob; a row ends at the end token."""
        rollout, eos = self.config.rllm.rollout, self.tokenizer.eos_token_id
        temperature = rollout.val_temperature if validation else rollout.temperature
        prompt_ids = [self.tokenizer(p)["input_ids"] for p in prompts]
        width = max(map(len, prompt_ids))
        ids_RT = torch.tensor([[eos] * (width - len(p)) + p for p in prompt_ids])  # left padded
        mask_RT = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
        ended_R = torch.zeros(len(prompts), dtype=torch.bool)
        tokens, logps = [], []
        for _ in range(rollout.max_new_tokens):
            logp_RV = (self._logits(ids_RT, mask_RT)[:, -1] / (temperature or 1.0)).log_softmax(-1)
            if temperature > 0:
                token_R = torch.multinomial(logp_RV.exp(), 1, generator=self.generator).squeeze(1)
            else:
                token_R = logp_RV.argmax(-1)
            token_R = token_R.masked_fill(ended_R, eos)
            tokens.append(token_R)
            logps.append(logp_RV.gather(1, token_R[:, None]).squeeze(1))
            ids_RT = torch.cat([ids_RT, token_R[:, None]], 1)
            mask_RT = torch.cat([mask_RT, (~ended_R).long()[:, None]], 1)
            ended_R |= token_R == eos
            if ended_R.all():
                break
        tokens_RS, logps_RS = torch.stack(tokens, 1).tolist(), torch.stack(logps, 1).tolist()
        outputs = []
        for prompt, row, logp in zip(prompt_ids, tokens_RS, logps_RS, strict=True):
            stop = eos in row
            length = row.index(eos) + 1 if stop else len(row)
            text = self.tokenizer.decode(row[: length - stop])  # without the end token
            outputs.append(
                ModelOutput(
                    text=text,
                    prompt_ids=prompt,
                    completion_ids=row[:length],
                    logprobs=logp[:length],
                    finish_reason="stop" if stop else "length",
                )
            )
        return outputs

    def transform_to_backend_batch(self, trainer_state) -> TokenBatch:
        return build_token_batch(trainer_state.trajectory_groups, pad_token_id=self.tokenizer.pad_token_id)

    async def process_backend_batch(self, trainer_state) -> None:
        if trainer_state.needs:  # e.g. a critic's values, sum_pi_squared: not computed here
            raise ConfigError(
                f"the minimal backend does not compute {sorted(trainer_state.needs)}: use backend.name=torch."
            )

    async def update_policy(self, trainer_state) -> None:
        """One optimiser step on ``-mean(A * log pi)`` over the batch's response tokens."""
        batch: TokenBatch = trainer_state.backend_batch
        temperature = self.config.rllm.rollout.temperature or 1.0
        logits_RTV = self._logits(batch.input_ids, batch.attention_mask)[:, :-1] / temperature
        logp_RT = logits_RTV.log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)  # token t+1
        mask_RT, adv_RT = batch.response_mask[:, 1:], batch.advantages[:, 1:]
        loss = -(adv_RT * logp_RT * mask_RT).sum() / mask_RT.sum().clamp(min=1.0)
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), float("inf"))
        self.optimizer.step()
        trainer_state.metrics |= {"actor/pg_loss": loss.item(), "actor/grad_norm": grad_norm.item()}
        trainer_state.metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def rank_state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_rank_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
