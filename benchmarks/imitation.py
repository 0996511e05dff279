"""Supervised learning of a move table through an agent's adapter: the pieces the imitation
benchmarks share (``tictactoe_imitation.py``, ``hanabi_imitation.py``).

An imitation run asks whether the adapter can hold a policy at all, with the reward taken out:
its loss is minus the log-probability that constrained decoding gives the target move after the
prompt the rollout shows (the same probability the rollout samples from and the exact scorers
read), so a fit here is a fit of the policy the RL recipes train.
"""

from __future__ import annotations

import torch


def imitation_pipeline(example: str, config_name: str, model: str, seed: int, out, run: str,
                       overrides):
    """The pipeline of ``examples/<example>/<config_name>.yaml`` an imitation run trains through:
    ``model`` (a path or alias; "tiny" on CPU) on CUDA when there is one and it is not the tiny
    model, eager forwards, writing only a jsonl log under ``out/<run>``, then ``overrides``."""
    from pathlib import Path

    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    device = "cuda" if torch.cuda.is_available() and model != "tiny" else "cpu"
    root = Path(__file__).resolve().parents[1]
    cfg = load_config(str(root / "examples" / example), config_name, [
        f"model.path={model}", f"model.device={device}", "trainer.compile=false",
        f"seed={seed}", "tracking.backends=[jsonl]", f"output_dir={Path(out) / run}",
        *overrides])
    return AgenticPipeline(cfg)


def answer_row(pipeline, env, seat: int, action: int) -> tuple[list[int], int, list]:
    """The decision of ``seat`` in ``env``'s present state, as the rollout shows it, with the
    answer of OpenSpiel action ``action`` as its target: (prompt + target answer token ids,
    prompt length, the target's choices under constrained decoding:
    ``CompletionTrie.branch_points``)."""
    from roll.agentic.env.actions import answer_token_ids
    from roll.inference.constrained import CompletionTrie
    from roll.models.loading import prompt_ids

    cfg = pipeline.cfg
    prompt = pipeline.render(env, seat)
    ids = prompt_ids(pipeline.tokenizer, prompt.text, None, cfg.model.enable_thinking)
    answers = answer_token_ids(pipeline.tokenizer, env.legal_actions(seat))
    target = answers[env.legal_action_ids(seat).index(action)]
    return ids + target, len(ids), CompletionTrie.of(answers).branch_points(target)


def supervised_step(model, rows, agent_index: int, pad: int, device) -> torch.Tensor:
    """The mean over ``rows`` of minus the log-probability constrained decoding gives each
    target answer (at temperature 1): the sum, over the answer's branching points, of the
    target token's log-softmax among the tokens allowed there, through agent
    ``agent_index``'s adapter; gradients on its tensors."""
    width = max(len(ids) for ids, _, _ in rows)
    most = max((len(tokens) for _, _, points in rows for _, tokens, _ in points), default=1)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (B, T)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    scored = torch.zeros(len(rows), width, dtype=torch.bool)  # the answer's tokens
    choices = torch.full((len(rows), width, most), -1, dtype=torch.long)  # (B, T, C)
    picked = torch.zeros(len(rows), width, dtype=torch.long)  # the target's index in C
    for r, (ids, prompt_len, points) in enumerate(rows):
        input_ids[r, :len(ids)] = torch.tensor(ids)
        attention[r, :len(ids)] = 1
        scored[r, prompt_len:len(ids)] = True
        for offset, tokens, _ in points:
            choices[r, prompt_len + offset, :len(tokens)] = torch.tensor(tokens)
            picked[r, prompt_len + offset] = tokens.index(ids[prompt_len + offset])
    agent_id = torch.full((len(rows),), agent_index, dtype=torch.long)
    *_, logits = model(input_ids.to(device), attention.to(device), agent_id.to(device),
                       positions=scored.to(device), choices=choices.to(device))  # (B, T, C)
    allowed = choices.to(device) >= 0
    log_choice = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    target = log_choice.gather(-1, picked.to(device).unsqueeze(-1)).squeeze(-1)  # (B, T)
    branching = allowed.any(-1)
    return -torch.where(branching, target, torch.zeros_like(target)).sum(dim=1).mean()


def fit_epoch(model, rows, order, batch: int, agent: str, pad: int, optimizer,
              updates: int) -> tuple[int, float]:
    """One epoch of ``supervised_step`` over ``rows`` in ``order``, ``batch`` rows an update
    of ``agent``'s adapter (gradients clipped to norm 1, as the recipes' max_grad_norm);
    returns the updates done so far and the epoch's mean loss."""
    from roll.multi_agent.optim import clip_gradients

    params, agent_index, losses = model.agent_parameters(agent), model.agent_index(agent), []
    for first in range(0, len(order), batch):
        part = [rows[i] for i in order[first:first + batch]]
        with model.training_forward({agent: updates}):
            loss = supervised_step(model, part, agent_index, pad, model.tensor_device)
            loss.backward()
        clip_gradients(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        updates += 1
        losses.append(float(loss.detach()))
    return updates, sum(losses) / len(losses)
