"""The host's side of continuous decoding: what each decode lane is running, when its request
ends and what it returns, and the steps the host has launched but not read yet."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from roll.errors import NonFiniteLossError
from roll.inference.base import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    cut_at_stop,
    hits_stop,
)
from roll.inference.constrained import CompletionTrie
from roll.utils.transfer import upload

if TYPE_CHECKING:
    from roll.inference.hf.engine import HFEngine


@dataclass
class Lane:
    """Host-side state of the request a lane is running."""

    key: int
    request: GenerationRequest
    trie: CompletionTrie | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    node: int = 0
    """Trie node (constrained requests)."""
    stop_matched: bool = False
    in_flight: int = 0
    """Tokens sampled on the device that the host has not read yet."""
    finished: bool = False

    def finish_reason(self, token: int, eos_ids: set[int],
                      decode: Callable[[list[int]], str]) -> FinishReason | None:
        """Why the request ends at ``token``, the last of ``tokens`` (None: it goes on); moves
        the trie along. Priority: EOS, stop string, completed allowed sequence,
        max_new_tokens (as the lock-step path, finish.py)."""
        sampling = self.request.sampling
        if token in eos_ids and not sampling.ignore_eos:
            return "eos"
        if sampling.stop and hits_stop(self.tokens, sampling.stop, decode):
            self.stop_matched = True
            return "stop"
        if self.trie is not None:
            try:
                self.node = self.trie.advance(self.node, token)
            except ValueError:  # masked sampling picks a forbidden token only from NaN/inf
                logprob = self.logprobs[-1] if self.logprobs else math.nan
                if math.isfinite(logprob):
                    raise
                raise NonFiniteLossError(
                    f"adapter {self.request.adapter!r} decodes non-finite logits (token "
                    f"{token}, log-prob {logprob}): its weights are not finite, the last "
                    "update diverged (a learning rate too high?)") from None
            if self.trie.is_complete(self.node):
                return "stop"
        if len(self.tokens) >= sampling.max_new_tokens:
            return "length"
        return None

    def output(self, reason: FinishReason, engine: HFEngine) -> GenerationOutput:
        """The finished request's output: text cut after its stop string, the adapter version
        it was generated with."""
        text = engine.decode_text(self.tokens)
        if self.stop_matched:
            text = cut_at_stop(text, self.request.sampling.stop)
        slot = self.request.adapter
        return GenerationOutput(
            token_ids=list(self.tokens),
            logprobs=list(self.logprobs),
            text=text,
            finish_reason=reason,
            adapter=slot,
            adapter_version=engine.adapter_version(slot) if slot is not None else None,
        )


@dataclass
class Step:
    """A sampling step (a prefill's first tokens or a decode step) the host has not read yet."""

    lanes: list[int]
    states: list[Lane]
    host: Tensor
    """(2, n) float64: tokens and log-probs, copied from the device without waiting."""
    done: torch.cuda.Event | None
    """Recorded after the copy (CUDA); None on CPU, where the copy is already done."""


def constrain(logits: Tensor, states: list[Lane]) -> Tensor | None:
    """Logits (n, V) as float32 with every token a constrained lane may not emit next at -inf;
    None where no lane is constrained."""
    rows, allowed = [], []
    for row, state in enumerate(states):
        if state.trie is not None:
            options = state.trie.allowed(state.node)
            rows += [row] * len(options)
            allowed += options
    if not rows:
        return None
    logits = logits.float()
    bias = torch.zeros_like(logits)
    # index_fill_ / index_put_ with a device value: ``bias[index] = scalar`` copies the scalar
    # from the host and waits for the device (twice per decode step; --sync_step found them)
    bias.index_fill_(0, upload(sorted(set(rows)), torch.long, logits.device), float("-inf"))
    bias.index_put_((upload(rows, torch.long, logits.device),
                     upload(allowed, torch.long, logits.device)), bias.new_zeros(()))
    return logits + bias
