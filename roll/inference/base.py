"""The interface every generation engine implements (hf now, vLLM later).

An engine serves named adapter *slots*. A slot holds one LoRA adapter at one version: an
agent's current weights ("alice") or a frozen snapshot ("alice@step10", for an opponent pool).
Every request names its slot (or None for the bare base model), so one call can mix agents.

Log-probs. ``GenerationOutput.logprobs[i]`` is ``log softmax(z / T)[token_i]`` where ``z`` are the
raw logits of the slot's model at the step that produced token i and ``T`` the request's sampling
temperature (1 for a greedy request): no top-k/top-p, no constraint mask. That is exactly what
the trainer recomputes with a plain forward over prompt + response at the sampling temperature
(sampling temperature is part of the policy), so it can serve as ``old_logprobs`` in PPO/GRPO
ratios. (Sampling itself uses the tempered, filtered, masked distribution.) One exception, in
vllm_engine.py: vLLM has no tempered-but-unfiltered mode, so a vLLM engine is built either for
temperature 1 or for tempered log-probs that include its filters (see ``tempered_logprobs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from torch import Tensor

FinishReason = Literal["eos", "length", "stop"]

_STOP_WINDOW_EXTRA = 8
"""Stop strings are searched in the text of the last (longest stop + this) tokens."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_ids(ids) -> bool:
    """Every id an int >= 0 (bools refused). Plain ints, the usual case, are checked at C
    speed: a step's requests hold ~10^5 prompt tokens, and a Python test per token was
    ~2% of the tiny CPU recipe's step."""
    if set(map(type, ids)) <= {int}:
        return min(ids) >= 0
    return all(_is_int(t) and t >= 0 for t in ids)


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. Invalid values raise ``ValueError`` naming the field."""

    temperature: float = 1.0
    """Softmax temperature (>= 0); 0 means greedy (argmax, top_k/top_p ignored)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with total probability >= top_p,
    in (0, 1]; 1 disables it. Applied after temperature and top_k."""
    top_k: int = 0
    """Keep only the k most likely tokens (>= 0); 0 disables it."""
    max_new_tokens: int = 256
    """Most tokens to generate (>= 1), the EOS token included."""
    stop: list[str] = field(default_factory=list)
    """Stop strings. Generation ends once the decoded text of the generated tokens contains one;
    ``token_ids`` keep every sampled token, ``text`` ends right after the stop string."""
    seed: int | None = None
    """Seed of this request's sampling noise (>= 0). Same seed + same prompt + same adapter
    weights → same tokens, whatever else is in the batch. None: the engine draws one."""
    ignore_eos: bool = False
    """Keep generating after EOS tokens (benchmarks); finish_reason is then never 'eos'."""

    def __post_init__(self) -> None:
        where = "SamplingParams"
        temperature = self.temperature
        if not isinstance(temperature, int | float) or isinstance(temperature, bool):
            raise ValueError(f"{where}.temperature={temperature!r}: must be a number >= 0")
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"{where}.temperature={temperature!r}: must be a finite number >= 0")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"{where}.top_p={self.top_p!r}: must be in (0, 1]")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"{where}.top_k={self.top_k!r}: must be an int >= 0 (0 = off)")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"{where}.max_new_tokens={self.max_new_tokens!r}: must be an int >= 1")
        if isinstance(self.stop, str) or not isinstance(self.stop, list | tuple):
            raise ValueError(f"{where}.stop={self.stop!r}: must be a list of strings")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"{where}.stop={self.stop!r}: every stop string must be non-empty")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise ValueError(f"{where}.seed={self.seed!r}: must be None or an int >= 0")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"{where}.ignore_eos={self.ignore_eos!r}: must be a bool")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue with one adapter slot."""

    prompt_ids: list[int]
    """Token ids of the prompt (chat template already applied), non-empty."""
    adapter: str | None = None
    """Name of the adapter slot to use; None = the base model with no adapter."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Decoding settings of this request."""
    allowed_completions: list[list[int]] | None = None
    """Constrained decoding: the output must be exactly one of these token sequences (e.g. the
    encodings of '<answer>MOVE</answer>' + EOS for each legal MOVE). None: unconstrained.
    No sequence may be a strict prefix of another (end them with EOS to make that so)."""

    def __post_init__(self) -> None:
        where = "GenerationRequest"
        ids = self.prompt_ids
        if not isinstance(ids, list | tuple) or not ids:
            raise ValueError(f"{where}.prompt_ids: must be a non-empty list of token ids")
        if not _token_ids(ids):
            raise ValueError(f"{where}.prompt_ids: every token id must be an int >= 0")
        if self.adapter is not None and (not isinstance(self.adapter, str) or not self.adapter):
            raise ValueError(f"{where}.adapter={self.adapter!r}: must be None or a slot name")
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError(f"{where}.sampling={self.sampling!r}: must be a SamplingParams")
        allowed = self.allowed_completions
        if allowed is not None:
            if not isinstance(allowed, list | tuple) or not allowed:
                raise ValueError(f"{where}.allowed_completions: must be None or a non-empty list")
            for seq in allowed:
                if not isinstance(seq, list | tuple) or not seq:
                    raise ValueError(
                        f"{where}.allowed_completions: {seq!r} must be a non-empty token list"
                    )
                if not _token_ids(seq):
                    raise ValueError(
                        f"{where}.allowed_completions: {seq!r} has a token that is not an int >= 0"
                    )


@dataclass
class GenerationOutput:
    """What came back for one request (outputs are in request order)."""

    token_ids: list[int]
    """Generated tokens, the EOS token included when one ended the generation."""
    logprobs: list[float]
    """Per generated token: its log-prob under the slot's model at the sampling temperature,
    unfiltered (see the module docstring) — the ``old_logprobs`` of RL."""
    text: str
    """``token_ids`` decoded with special tokens skipped; for finish_reason 'stop' by a stop
    string it ends right after the first stop string."""
    finish_reason: FinishReason
    """'eos' (an EOS token was generated), 'length' (max_new_tokens reached) or 'stop' (a stop
    string appeared, or an allowed completion without EOS was completed)."""
    adapter: str | None = None
    """The slot that generated it (None: base model)."""
    adapter_version: int | None = None
    """Version of that slot's weights at generation time (None for the base model)."""


Follow = Callable[[int, GenerationOutput], list[GenerationRequest]]
"""Called with (request key, its output) as each request finishes; returns new requests. Keys
number the requests in the order they were made: ``first`` 0..n-1, then every request a
``Follow`` call returns, in the order returned."""


class Later(Protocol):
    """Follow-up requests that arrive after ``follow`` returned: the caller's own work for a
    finished request (e.g. an env step on an env worker) runs while the engine goes on
    decoding. An engine's ``serve`` takes the requests ``ready`` gives whenever it can, keeps
    serving while any are ``outstanding``, and waits for them only when it has nothing else
    to do. Their keys continue the count in the order they are taken."""

    def outstanding(self) -> int:
        """Follow-ups still to come (0: all taken)."""
        ...

    def ready(self, wait: bool) -> list[GenerationRequest]:
        """The follow-up requests available now; ``wait``: block until at least one piece of
        outstanding work is done (it may bring no request)."""
        ...


@runtime_checkable
class InferenceEngine(Protocol):
    """A generation engine holding adapter slots over one base model."""

    continuous: bool
    """Whether ``serve`` batches continuously (a follow-up joins the running batch at once);
    False: it plays rounds (``serve_rounds``)."""
    last_serve: dict[str, int]
    """Figures of the last ``serve`` call (e.g. lanes, decode_steps, served); empty where the
    engine keeps none."""

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        """Generate for every request (any mix of slots) and return outputs in request order."""
        ...

    def serve(self, first: list[GenerationRequest], follow: Follow,
              context_len: int | None = None, later: Later | None = None) -> int:
        """Generate for ``first`` and for every request ``follow`` (and ``later``) returns,
        until none is left; returns how many requests were served (see ``serve`` below)."""
        ...

    def load_adapter(
        self, slot: str, tensors: dict[str, Tensor], lora_config, version: int
    ) -> None:
        """Put adapter weights (PEFT state-dict keys, as ``export_adapter`` gives them) with
        their peft ``LoraConfig`` into a slot, creating or replacing it, at this version."""
        ...

    def remove_adapter(self, slot: str) -> None:
        """Forget a slot (KeyError if unknown)."""
        ...

    def adapter_version(self, slot: str) -> int | None:
        """Version of the weights a slot serves; None if no such slot is loaded."""
        ...

    def sleep(self) -> None:
        """Free what the engine can (vLLM with sleep mode: its KV cache) until ``wake_up``;
        a no-op for an engine that cannot sleep."""
        ...

    def wake_up(self) -> None:
        """Take back what ``sleep`` freed; a no-op for an engine that cannot sleep."""
        ...


def load_adapter_folder(
    engine: InferenceEngine, slot: str, directory: str | Path, version: int
) -> None:
    """Load a standard PEFT adapter folder (e.g. a frozen snapshot on disk) into a slot."""
    from peft import LoraConfig
    from safetensors.torch import load_file

    directory = Path(directory)
    weights = directory / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"no adapter_model.safetensors in {directory} (slot {slot!r})")
    engine.load_adapter(slot, load_file(str(weights)), LoraConfig.from_pretrained(str(directory)),
                        version)


def serve(engine: InferenceEngine, first: list[GenerationRequest], follow: Follow,
          context_len: int | None = None, continuous: bool = True,
          later: Later | None = None) -> int:
    """Generate for ``first`` and for every request ``follow`` (or ``later``) returns, until
    none is left; returns how many requests were served.

    A continuous engine (the hf engine, vLLM) runs its own ``serve``, so a new request joins
    the running batch as soon as it exists; any other engine plays rounds (``serve_rounds``).
    ``context_len`` bounds prompt + max_new_tokens of any request (continuous engines size
    their cache by it). ``continuous=False`` plays rounds on any engine.
    """
    if continuous and engine.continuous:
        return engine.serve(first, follow, context_len=context_len, later=later)
    return serve_rounds(engine, first, follow, later)


def serve_rounds(engine: InferenceEngine, first: list[GenerationRequest], follow: Follow,
                 later: Later | None = None) -> int:
    """``serve`` in lock-step rounds: one ``generate`` call per round, follow-ups in the next
    round (with those of ``later`` ready by then, or waited for when the round would be
    empty). Returns how many requests were served."""
    served, queue = 0, list(first)
    while queue or (later is not None and later.outstanding()):
        following: list[GenerationRequest] = []
        if queue:
            outputs = engine.generate(queue)
            for key, output in enumerate(outputs, start=served):
                following += follow(key, output)
            served += len(queue)
        if later is not None:
            following += later.ready(wait=not following)
        queue = following
    return served


class RoundsEngine:
    """Base of an engine that is not continuous (the Ray engine group, test doubles): ``serve``
    plays rounds, ``last_serve`` stays empty, ``sleep``/``wake_up`` do nothing (override them
    where the engine can sleep). Subclasses bring ``generate`` and the adapter slots."""

    continuous = False

    @property
    def last_serve(self) -> dict[str, int]:
        return {}

    def serve(self, first: list[GenerationRequest], follow: Follow,
              context_len: int | None = None, later: Later | None = None) -> int:
        return serve_rounds(self, first, follow, later)

    def sleep(self) -> None:
        """Nothing to free."""

    def wake_up(self) -> None:
        """Nothing to take back."""


def hits_stop(tokens: list[int], stops: list[str], decode: Callable[[list[int]], str]) -> bool:
    """Whether a stop string appears in the text of the row's last tokens (enough of them to
    hold the longest stop string)."""
    window = max(len(s) for s in stops) + _STOP_WINDOW_EXTRA
    tail = decode(tokens[-window:])
    return any(stop in tail for stop in stops)


def cut_at_stop(text: str, stops: list[str]) -> str:
    """Text up to and including the first stop string in it."""
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return text[: min(ends)] if ends else text
