"""When does each row of a decoding batch finish, and why.

EOS and max_new_tokens are checked on the device (``RowFinish``), so a batch without stop
strings or constraints never waits for the host between steps and the GPU can run ahead of
Python. Stop strings and allowed completions need the tokens on the host; rows that use them
are followed by ``HostChecks``, which costs one device→host copy per step for the batch.

Priority when several apply at the same step: EOS, then a stop string, then a completed allowed
sequence, then max_new_tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from roll.inference.base import FinishReason, SamplingParams, hits_stop
from roll.inference.constrained import CompletionTrie, ConstraintState

RUNNING, EOS, LENGTH, STOP = 0, 1, 2, 3
REASONS: dict[int, FinishReason] = {EOS: "eos", LENGTH: "length", STOP: "stop"}


class RowFinish:
    """Device-side record of the generated tokens and of each row's end.

    Args:
        params: sampling settings per row.
        active: False for filler rows (finished before they start).
        max_new: decoding steps at most (columns of the token buffer).
        eos_ids: token ids that end a row (unless its ``ignore_eos``).
    """

    def __init__(self, params: list[SamplingParams], active: list[bool], max_new: int,
                 eos_ids: set[int], device) -> None:
        rows = len(params)
        self.eos = torch.tensor(sorted(eos_ids), device=device)
        self.ignore_eos = torch.tensor([p.ignore_eos for p in params], device=device)
        self.limit = torch.tensor([p.max_new_tokens for p in params], device=device)
        self.finished = ~torch.tensor(active, device=device)  # (B,)
        self.length = torch.zeros(rows, dtype=torch.long, device=device)  # (B,) tokens kept
        self.reason = torch.zeros(rows, dtype=torch.long, device=device)  # (B,) RUNNING/EOS/…
        self.tokens = torch.zeros(rows, max_new, dtype=torch.long, device=device)  # (B, max_new)

    def update(self, step: int, tokens: Tensor) -> None:
        """Record this step's tokens (B,) and finish rows on EOS or at their token limit."""
        self.tokens[:, step] = tokens
        live = ~self.finished
        self.length += live
        is_eos = live & ~self.ignore_eos & torch.isin(tokens, self.eos)
        at_limit = live & ~is_eos & (self.length >= self.limit)
        self.reason = torch.where(is_eos, EOS, torch.where(at_limit, LENGTH, self.reason))
        self.finished |= is_eos | at_limit

    def stop(self, rows: list[int]) -> None:
        """Finish these rows with reason 'stop' (their last token is kept)."""
        index = torch.tensor(rows, device=self.finished.device)
        self.finished[index] = True
        self.reason[index] = STOP

    def all_finished(self) -> bool:
        return bool(self.finished.all())  # one device→host sync


class HostChecks:
    """Stop strings and allowed completions of the rows that have them.

    Args:
        params: sampling settings per row.
        tries: allowed-completion trie per row (None: unconstrained).
        eos_ids: token ids that end a row.
        decode: token ids → text (special tokens skipped).
    """

    def __init__(self, params: list[SamplingParams], tries: list[CompletionTrie | None],
                 eos_ids: set[int], decode: Callable[[list[int]], str]) -> None:
        self.params = params
        self.constraints = ConstraintState(tries)
        self.rows = [r for r, p in enumerate(params) if p.stop or tries[r] is not None]
        self.eos_ids = eos_ids
        self.decode = decode
        self.finished = [r not in self.rows for r in range(len(params))]
        self.tokens: dict[int, list[int]] = {r: [] for r in self.rows}
        self.stop_matched: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self.rows)

    def masked(self, logits: Tensor) -> Tensor | None:
        """Logits (B, V) as float32 restricted to each live constrained row's allowed next
        tokens; None where no row is constrained."""
        if not self.constraints:
            return None
        return self.constraints.mask_logits(logits.float(), self.finished)

    def step(self, tokens: list[int]) -> list[int]:
        """Follow this step's tokens; return the rows that end now by a stop string or a
        completed allowed sequence (EOS and length are the device's business)."""
        complete = set(self.constraints.advance(tokens, self.finished))
        stopped = []
        for row in self.rows:
            if self.finished[row]:
                continue
            token, params = tokens[row], self.params[row]
            self.tokens[row].append(token)
            if token in self.eos_ids and not params.ignore_eos:
                self.finished[row] = True
            elif params.stop and self._hits_stop(row):
                self.finished[row] = True
                self.stop_matched.add(row)
                stopped.append(row)
            elif row in complete:
                self.finished[row] = True
                stopped.append(row)
            elif len(self.tokens[row]) >= params.max_new_tokens:
                self.finished[row] = True
        return stopped

    def _hits_stop(self, row: int) -> bool:
        return hits_stop(self.tokens[row], self.params[row].stop, self.decode)
