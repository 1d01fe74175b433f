"""rLLM's ECHO (branch ``terminal-rl`` a5fa9aa1, arXiv:2605.24517), issue 48: the ``echo``
estimator (GRPO's advantages), its default loss, and the ``echo`` loss: PPO's clip on the action
tokens plus ``env_loss_coef`` times the negative log-likelihood of the environment-observation
tokens. The loss is checked against the values rLLM's own ``echo`` and ``ppo_clip`` give
(tests/data/rllm_echo_loss.json, made by tests/data/make_rllm_echo_cases.py); the observation
tokens against hand-built multi-turn steps; the update against a plain full forward."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
import trainer_rank_tasks as tasks
from test_registered_loss_context import full_forward

from rllm_torch import LossContext, register_loss
from rllm_torch.backends.torch_backend import TorchBackend
from rllm_torch.core.losses import echo_loss, registered_loss
from rllm_torch.rllm.config import AlgorithmConfig
from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup
from rllm_torch.trainer.pipeline.token_batch import build_token_batch
from rllm_torch.trainer.state import TrainerState

CASES = json.loads((Path(__file__).resolve().parents[1] / "data" / "rllm_echo_loss.json").read_text())


def _ctx(inputs: dict, params: dict) -> tuple[LossContext, torch.Tensor]:
    logp = torch.tensor(inputs["logp_curr"], dtype=torch.float64, requires_grad=True)
    normaliser = inputs["normaliser"]
    ctx = LossContext(
        logp_curr=logp,
        logp_old=torch.tensor(inputs["logp_old"], dtype=torch.float64),
        advantages=torch.tensor(inputs["advantages"], dtype=torch.float64),
        action_mask=torch.tensor(inputs["action_mask"], dtype=torch.float64),
        obs_mask=torch.tensor(inputs["obs_mask"], dtype=torch.float64),
        aggregate=lambda per_token, mask, mode=None: (per_token * mask).sum() / normaliser,
        params=params,
    )
    return ctx, logp


@pytest.mark.parametrize("index", range(len(CASES["cases"])))
def test_the_echo_loss_gives_rllms_loss_gradient_and_metrics(index):
    case = CASES["cases"][index]
    ctx, logp = _ctx(case["inputs"], dict(case["inputs"]["params"]))
    loss, metrics = echo_loss(ctx)
    loss.backward()
    want = case["echo"]
    assert loss.item() == pytest.approx(want["loss"], rel=1e-12, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor(want["grad"], dtype=torch.float64), rtol=1e-12, atol=1e-12)
    assert metrics == pytest.approx(want["metrics"], rel=1e-12)


def test_the_cases_cover_what_the_loss_branches_on():
    cases = CASES["cases"]
    coefs = [c["inputs"]["params"].get("env_loss_coef") for c in cases]
    assert {None, 0.0, 0.5} <= set(coefs)  # rLLM's default (0.05), off, on
    assert any(c["echo"]["metrics"]["ppo/clip_frac"] > 0 for c in cases)  # ratios clipped
    assert any(
        abs(a - b) > 20
        for c in cases
        for ra, rb in zip(c["inputs"]["logp_curr"], c["inputs"]["logp_old"], strict=True)
        for a, b in zip(ra, rb, strict=True)
    )
    assert any(
        c["inputs"]["params"].get("eps_clip_high") not in (None, c["inputs"]["params"]["eps_clip"]) for c in cases
    )
    # where the term is on and there are observation tokens, echo is not ppo_clip
    assert any(c["echo"]["loss"] != c["ppo_clip"]["loss"] for c in cases)


@pytest.mark.parametrize("index", range(0, len(CASES["cases"]), 7))
def test_with_env_loss_coef_0_the_echo_loss_is_rllms_ppo_clip(index):
    case = CASES["cases"][index]
    ctx, logp = _ctx(case["inputs"], dict(case["inputs"]["params"]) | {"env_loss_coef": 0.0})
    loss, metrics = echo_loss(ctx)
    loss.backward()
    assert loss.item() == pytest.approx(case["ppo_clip"]["loss"], rel=1e-12, abs=1e-12)
    torch.testing.assert_close(
        logp.grad, torch.tensor(case["ppo_clip"]["grad"], dtype=torch.float64), rtol=1e-12, atol=1e-12
    )
    assert metrics == pytest.approx(case["ppo_clip"]["metrics"])


def test_echo_is_registered_as_needing_the_observation_tokens():
    assert registered_loss("echo").needs == frozenset({"obs_mask"})


# --------------------------------------------------------------------------- the estimator and its loss
def test_the_echo_estimator_is_grpo_and_its_run_trains_the_echo_loss_unless_a_loss_is_named():
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.5]
    echo = AlgorithmConfig(estimator="echo")
    assert echo.loss_fn == "echo" and echo.loss_fn_for("solver") == "echo"
    assert AlgorithmConfig(estimator="echo", loss_fn="cispo").loss_fn == "cispo"  # a named loss wins (rLLM's)
    assert AlgorithmConfig(estimator="grpo").loss_fn is None
    # a role's estimator_map entry changes the estimator only, as rLLM's __post_init__ does
    mapped = AlgorithmConfig(estimator="grpo", estimator_map={"judge": "echo"})
    assert mapped.loss_fn_for("judge") == "ppo"
    groups = [
        TrajectoryGroup(
            trajectories=[Trajectory(name="solver", reward=r, steps=[Step(reward=r)]) for r in rewards[:3]],
            group_id="t0:solver",
        ),
        TrajectoryGroup(
            trajectories=[Trajectory(name="solver", reward=r, steps=[Step(reward=r)]) for r in rewards[3:]],
            group_id="t1:solver",
        ),
    ]
    from rllm_torch.rllm.collect import collect_reward_and_advantage_from_trajectory_groups

    got = {}
    for name in ("echo", "grpo"):
        for g in groups:
            for t in g.trajectories:
                t.steps[0].advantage = None
        collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator=name))
        got[name] = [t.steps[0].advantage for g in groups for t in g.trajectories]
    assert got["echo"] == got["grpo"] and any(a != 0 for a in got["echo"])
    assert "obs_mask" in AdvantagePlan.of(echo).needs


# --------------------------------------------------------------------------- the observation tokens
def _step(prompt, response):
    return Step(prompt_ids=list(prompt), response_ids=list(response), logprobs=[-0.5] * len(response))


def _group(*trajectories):
    return TrajectoryGroup(
        trajectories=[
            Trajectory(name="solver", reward=float(i % 2), steps=steps) for i, steps in enumerate(trajectories)
        ],
        group_id="t0:solver",
    )


def test_a_steps_observation_tokens_are_its_prompt_after_what_the_conversation_held_before():
    eos = 9
    groups = [
        _group(
            # the response comes back without its end token, then the environment's 3 tokens
            [_step([1, 2], [5, eos]), _step([1, 2, 5, 7, 7, 8], [6]), _step([1, 2, 5, 7, 7, 8, 6, 4], [3])],
            # one step: no observation
            [_step([1, 2], [4, 4])],
            # the second prompt rewrites the conversation (not beginning with the first prompt): none
            [_step([1, 2], [5]), _step([3, 5, 7], [6])],
        )
    ]
    with pytest.warns(
        UserWarning, match=r"1 step\(s\) have a prompt that does not begin with the previous step's prompt"
    ):
        batch = build_token_batch(groups, pad_token_id=0, observation_mask=True)
    want = torch.zeros_like(batch.response_mask)
    want[1, 3:6] = 1  # 7 7 8
    want[2, 7:8] = 1  # 4 (the previous response, 6, is the policy's)
    torch.testing.assert_close(batch.obs_mask, want, rtol=0, atol=0)
    assert not (batch.obs_mask * batch.response_mask).any()
    assert build_token_batch(groups[:1][:1], pad_token_id=0).obs_mask is None  # not asked for: none packed


# --------------------------------------------------------------------------- a real update
SEEN: list[dict] = []


@register_loss("test_echo_recording", needs=("obs_mask",))
def _recording_echo(ctx: LossContext):
    SEEN.append(
        {
            "obs_mask": ctx.obs_mask.clone(),
            "logp_curr": ctx.logp_curr.detach().clone(),
            "rollout": ctx.logp_rollout.clone(),
        }
    )
    return echo_loss(ctx)


def _two_turn_groups(roles: tuple[str, ...] = ("solver", "solver")) -> list[TrajectoryGroup]:
    """One group of 3 two-turn trajectories per role over the task alphabet: ``a+b=`` → response,
    the environment's ``=d`` appended, → a second response."""
    g = torch.Generator().manual_seed(3)
    groups = []
    for task, role in enumerate(roles):
        prompt = [int(v) for v in torch.randint(0, 10, (1,), generator=g)] + [10, task, 11]
        trajectories = []
        for k in range(3):
            first = [int(v) for v in torch.randint(0, 10, (2,), generator=g)]
            second_prompt = prompt + first + [11, int(torch.randint(0, 10, (1,), generator=g))]
            second = [int(v) for v in torch.randint(0, 10, (1 + k % 2,), generator=g)]
            steps = [
                Step(prompt_ids=prompt, response_ids=first, logprobs=(-torch.rand(2, generator=g) - 0.1).tolist()),
                Step(
                    prompt_ids=second_prompt,
                    response_ids=second,
                    logprobs=(-torch.rand(len(second), generator=g) - 0.1).tolist(),
                ),
            ]
            trajectories.append(Trajectory(name=role, reward=float(k == task), steps=steps))
        groups.append(TrajectoryGroup(trajectories=trajectories, group_id=f"t{task}:{role}", task_id=f"t{task}"))
    return groups


def _update(*dotlist: str, roles: tuple[str, ...] = ("solver", "solver")) -> tuple[TorchBackend, TrainerState, dict]:
    config = tasks.backend_config("rllm.algorithm.adv_estimator=echo", "backend.seed=2", *dotlist)
    backend = TorchBackend(config, alphabet=tasks.ALPHABET)
    backend.init_rollout_engine()
    plan = AdvantagePlan.of(tasks.AlgorithmConfigFrom(config))
    state = TrainerState(trajectory_groups=_two_turn_groups(roles), total_steps=1, needs=plan.needs, plan=plan)
    state.backend_batch = batch = backend.transform_to_backend_batch(state)
    before = full_forward(backend.model, batch.input_ids, batch.attention_mask)[0]

    async def step():
        await backend.process_backend_batch(state)
        await backend.compute_advantages(state, tasks.AlgorithmConfigFrom(config))
        await backend.update_policy(state)

    SEEN.clear()
    asyncio.run(step())
    return (
        backend,
        state,
        {"logp": before, "weights": {n: p.detach().clone() for n, p in backend.model.named_parameters()}},
    )


def test_an_echo_update_scores_the_observation_tokens_and_trains_them_by_env_loss_coef():
    backend, state, after = _update(
        "rllm.algorithm.loss_fn=test_echo_recording", "rllm.algorithm.loss_params={env_loss_coef: 0.5}"
    )
    batch = state.backend_batch
    assert batch.obs_mask is not None and int(batch.obs_mask.sum()) == 6 * 2  # each second step: "=" and the digit
    (ctx,) = SEEN
    rows = ((ctx["rollout"][:, None, :] == batch.rollout_log_probs[None]).all(-1)).float().argmax(1)
    torch.testing.assert_close(ctx["obs_mask"], batch.obs_mask[rows], rtol=0, atol=0)
    observed = batch.obs_mask[rows] > 0
    # the policy's log-probs at the observation tokens, as a plain forward of each row gives them
    torch.testing.assert_close(ctx["logp_curr"][observed].double(), after["logp"][rows][observed], rtol=0, atol=2e-5)

    # the observation term's weight: env_loss_coef 0 trains as the built-in ppo does, 0.5 otherwise
    _, _, off = _update("rllm.algorithm.loss_params={env_loss_coef: 0.0}")
    _, _, ppo = _update("rllm.algorithm.loss_fn=ppo")
    for name, weight in ppo["weights"].items():
        torch.testing.assert_close(
            off["weights"][name], weight, rtol=0, atol=2e-5
        )  # Adam: float32 rounding of a ~0 gradient
    assert max((after["weights"][n] - w).abs().max().item() for n, w in ppo["weights"].items()) > 1e-4


def test_a_roles_echo_loss_sees_the_observation_tokens_of_its_own_rows_only():
    # solver trains echo (recorded), judge ppo: the judge's rows hold observation tokens too, which are not the solver's
    _, state, _ = _update(
        "rllm.algorithm.loss_fn=ppo",
        "rllm.algorithm.loss_fn_map={solver: test_echo_recording}",
        roles=("solver", "judge"),
    )
    batch = state.backend_batch
    (ctx,) = SEEN
    rows = ((ctx["rollout"][:, None, :] == batch.rollout_log_probs[None]).all(-1)).float().argmax(1)
    judge_rows = torch.tensor(
        [batch.group_roles[int(batch.group_index[int(batch.row_index[r])])] == "judge" for r in rows]
    )
    assert judge_rows.any() and batch.obs_mask[rows][judge_rows].sum() > 0  # the judge's second steps observe too
    assert not ctx["obs_mask"][judge_rows].any()  # ... but not for the solver's loss
    torch.testing.assert_close(ctx["obs_mask"][~judge_rows], batch.obs_mask[rows][~judge_rows], rtol=0, atol=0)
