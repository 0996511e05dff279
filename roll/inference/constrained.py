"""Constrained decoding: a row may only emit one of its allowed token sequences.

Each constrained request gets a prefix tree (trie) of its allowed completions. At every step the
row's logits are masked to the children of its current trie node; once it reaches the end of a
sequence the row is finished. Masking changes what is *sampled*, not the reported log-probs
(those stay the model's own, see ``roll.inference.base``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from roll.utils.memo import memoized

_TRIES: dict = {}
"""(completions, vocab size) -> its CompletionTrie (``CompletionTrie.of``)."""
_TRIES_KEPT = 4096
"""Tries kept before the memo starts again."""


class CompletionTrie:
    """Prefix tree of allowed token sequences; node 0 is the root.

    No sequence may be a strict prefix of another: after it the row could either stop or go
    on, and there is no token to say 'stop' — end each sequence with EOS to make them distinct.
    """

    def __init__(self, completions: list[list[int]], vocab_size: int | None = None) -> None:
        if not completions:
            raise ValueError("allowed_completions must hold at least one sequence")
        self.children: list[dict[int, int]] = [{}]
        self.is_end: list[bool] = [False]
        for seq in completions:
            if not seq:
                raise ValueError("allowed_completions: an empty sequence cannot be generated")
            node = 0
            for token in seq:
                if vocab_size is not None and not 0 <= token < vocab_size:
                    raise ValueError(
                        f"allowed_completions: token {token} of {list(seq)} is outside the "
                        f"vocabulary (size {vocab_size})"
                    )
                nxt = self.children[node].get(token)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][token] = nxt
                    self.children.append({})
                    self.is_end.append(False)
                node = nxt
            self.is_end[node] = True
        for node, end in enumerate(self.is_end):
            if end and self.children[node]:
                raise ValueError(
                    f"allowed_completions: {self.path_to(node)} is a strict prefix of another "
                    f"allowed sequence; end every sequence with EOS"
                )

    @classmethod
    def of(cls, completions: list[list[int]], vocab_size: int | None = None) -> CompletionTrie:
        """The trie of these completions, built once per distinct set and then shared (a
        trie is never changed after it is built; a game asks for the same few sets of legal
        answers turn after turn)."""
        return memoized(_TRIES, (tuple(map(tuple, completions)), vocab_size),
                        lambda: cls(completions, vocab_size), _TRIES_KEPT)

    def path_to(self, target: int) -> list[int]:
        """Token sequence leading from the root to a node (for error messages)."""
        stack: list[tuple[int, list[int]]] = [(0, [])]
        while stack:
            node, path = stack.pop()
            if node == target:
                return path
            stack.extend((child, path + [tok]) for tok, child in self.children[node].items())
        raise KeyError(target)

    def allowed(self, node: int) -> list[int]:
        """Tokens that may follow at this node."""
        return list(self.children[node])

    def advance(self, node: int, token: int) -> int:
        """The node after emitting ``token`` (which must be allowed)."""
        try:
            return self.children[node][token]
        except KeyError:
            raise ValueError(f"token {token} is not allowed here ({self.allowed(node)}): masked "
                             "sampling picks an allowed token unless the logits are not finite "
                             "(NaN/inf: an adapter whose weights diverged)") from None

    def is_complete(self, node: int) -> bool:
        """Whether an allowed sequence ends at this node (nothing may follow it)."""
        return self.is_end[node]

    def leaves(self, node: int) -> int:
        """How many allowed sequences pass through this node."""
        if self.is_end[node]:
            return 1
        return sum(self.leaves(child) for child in self.children[node].values())

    def branch_points(self, path: list[int]) -> list[tuple[int, list[int], list[int]]]:
        """The choices made along an allowed sequence: for each offset ``t`` of ``path`` whose
        node has two or more children, ``(t, child tokens, allowed sequences below each
        child)``. Where a node has one child, constrained decoding has no choice (its
        renormalised probability is 1), so the distribution over the allowed sequences is the
        product of the choices' renormalised next-token distributions. A ``path`` that leaves
        the tree (an engine that drops the final EOS) yields the choices up to there."""
        points, node = [], 0
        for t, token in enumerate(path):
            if token not in self.children[node]:
                break
            if len(self.children[node]) > 1:
                tokens = list(self.children[node])
                points.append((t, tokens,
                               [self.leaves(self.children[node][c]) for c in tokens]))
            node = self.children[node][token]
        return points


class ConstraintState:
    """Trie positions of the constrained rows of one batch.

    Args:
        tries: one entry per batch row, None for unconstrained rows.
    """

    def __init__(self, tries: list[CompletionTrie | None]) -> None:
        self.tries = tries
        self.rows = [row for row, trie in enumerate(tries) if trie is not None]
        self.nodes = {row: 0 for row in self.rows}

    def __bool__(self) -> bool:
        return bool(self.rows)

    def mask_logits(self, logits: Tensor, finished: list[bool]) -> Tensor:
        """Logits (B, V) with every token a live constrained row may not emit set to -inf."""
        live = [row for row in self.rows if not finished[row]]
        if not live:
            return logits
        row_index, token_index = [], []
        for local, row in enumerate(live):
            allowed = self.tries[row].allowed(self.nodes[row])
            row_index += [local] * len(allowed)
            token_index += allowed
        device = logits.device
        bias = torch.full((len(live), logits.shape[-1]), float("-inf"), device=device)  # (L, V)
        bias[torch.tensor(row_index, device=device), torch.tensor(token_index, device=device)] = 0
        rows = torch.tensor(live, device=device)  # (L,)
        logits = logits.clone()
        logits[rows] += bias
        return logits

    def advance(self, tokens: list[int], finished: list[bool]) -> list[int]:
        """Move live constrained rows past their new token; return the rows now complete."""
        complete = []
        for row in self.rows:
            if finished[row]:
                continue
            self.nodes[row] = self.tries[row].advance(self.nodes[row], tokens[row])
            if self.tries[row].is_complete(self.nodes[row]):
                complete.append(row)
        return complete
