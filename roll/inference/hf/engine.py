"""The embedded generation engine: plain PyTorch + transformers, fused multi-LoRA.

One decoding step is ONE forward of the shared base model for the whole mixed batch: the model
runs with its own adapters off (``adapters_off``: the trainer's base carries PEFT's LoRA layers)
and ``FusedLoRA`` adds every row's adapter delta from stacked factors (see fused_lora.py). The
engine never copies the base weights; it keeps its own copy of each slot's LoRA factors, so the
trainer can go on training while the engine serves a given version, and frozen snapshots
("alice@step10") can be served beside live agents.

Loop: left-pad the prompts, prefill once into a KV cache, then decode token by token. Rows that
finish (EOS, stop string, allowed completion done, max_new_tokens) stop contributing tokens but
stay in the batch until every row is done (no compaction, so a row's numerics never depend on
when others finish).

On CUDA, ``compile=True`` decodes with a static KV cache and a ``torch.compile``d step that
the engine captures as a CUDA graph of its own and replays (``CapturedStep``). Shapes are
bucketed (rows to a power of two, cache length to a multiple of ``CACHE_LEN_MULTIPLE``) so
that a new batch rarely means a new compilation; the first call per bucket pays the warm-up.
``static_cache=True`` alone runs the same static path uncompiled.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch import Tensor, nn

from roll.inference.base import (
    Follow,
    GenerationOutput,
    GenerationRequest,
    Later,
    SamplingParams,
    cut_at_stop,
)
from roll.inference.constrained import CompletionTrie
from roll.inference.hf.continuous import ContinuousDecoder, decode_lanes
from roll.inference.hf.cuda_graph import CapturedStep, cache_counters, compile_step
from roll.inference.hf.finish import REASONS, HostChecks, RowFinish
from roll.inference.hf.fused_lora import KERNELS, FusedLoRA, resolve_kernels
from roll.inference.hf.fused_projections import FusedProjections
from roll.inference.hf.ring import ATTENTION_KERNELS, additive_mask, decode_attention
from roll.inference.hf.sampling import BatchSampler, Picker, compiled_picker, pick_tokens
from roll.utils.stages import stage

LORA_KERNELS = ("auto", *KERNELS)
CACHE_LEN_MULTIPLE = 256
"""Static caches are sized prompt + new tokens rounded up to this (fewer compilations)."""
MIN_STATIC_ROWS = 8
"""Static batches are padded to a power of two rows, at least this many (fewer compilations)."""
SYNC_EVERY = 8
"""Without stop strings or constraints, the host checks 'all rows finished?' every this many
steps only, so the device runs ahead of Python in between."""


class HFEngine:
    """Mixed-adapter generation on the trainer's own base model.

    Args:
        model: a transformers causal LM: the trainer's base (its weights are shared, never
            copied; PEFT's LoRA layers may be injected in it) or a plain model. It serves the
            base model and the slots loaded into the engine.
        tokenizer: its tokenizer (EOS ids, padding, decoding of ``text``).
        adapters_off: a context-manager factory under which the model's own LoRA layers add
            nothing (the trainer's ``reference``), entered around every generation; default:
            nothing to turn off.
        device: where generation runs; must be the model's device (None: the model's).
        max_batch_size: larger calls are split into batches of at most this many rows.
        seed: seeds requests that bring none (reproducible per engine and call order).
        static_cache: use a preallocated KV cache (the path ``compile`` needs).
        compile: ``torch.compile`` the decoding step with CUDA graphs (implies static_cache).
        cuda_graphs: on CUDA, ``serve`` (continuous batching) replays its decode step as one
            captured CUDA graph (continuous.py).
        slot_capacity, rank_capacity: initial fused-stack sizes (e.g. the trainer's agents and
            their largest rank; default 1); both grow when a larger slot is loaded.
        lora_dtype: dtype of the stacked LoRA factors and products (default: base weights').
        lora_kernels: how the fused LoRA deltas run (``FusedLoRA``): ``"torch"`` (stacked
            products), ``"triton"`` (tiled kernels, CUDA), ``"triton_streams"`` (the same
            beside the base GEMMs on a second stream), or ``"auto"``: triton_streams on CUDA
            when Triton is importable, torch otherwise.
        fuse_projections: q/k/v and gate/up as one product each (fused_projections.py: the
            base's weights moved into one buffer per family, never copied).
    """

    continuous = True
    """``serve`` batches continuously (continuous.py)."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        adapters_off: Callable[[], AbstractContextManager] = nullcontext,
        device: str | torch.device | None = None,
        max_batch_size: int = 256,
        seed: int = 0,
        static_cache: bool = False,
        compile: bool = False,
        slot_capacity: int | None = None,
        rank_capacity: int | None = None,
        lora_dtype: torch.dtype | None = None,
        cuda_graphs: bool = True,
        lora_kernels: str = "auto",
        share_prefix: bool = False,
        attention_kernel: str = "sdpa",
        prefill_graphs: bool = False,
        fuse_projections: bool = False,
    ) -> None:
        if lora_kernels not in LORA_KERNELS:
            raise ValueError(f"lora_kernels={lora_kernels!r}: must be one of {list(LORA_KERNELS)}")
        if attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention_kernel={attention_kernel!r}: must be one of "
                             f"{list(ATTENTION_KERNELS)}")
        self.attention_kernel = attention_kernel
        """The decode steps' attention (ring.py ATTENTION_KERNELS; 'triton' reads only the
        cache blocks a row sees: CUDA, or Triton's interpreter in tests)."""
        if _is_peft_wrapper(model):
            raise TypeError(
                "HFEngine takes a transformers model (the trainer's base, with adapters_off), "
                "not a PeftModel (its active adapter would add to every row)"
            )
        self._adapters_off = adapters_off
        """Turns the model's own LoRA layers off (the trainer's context, which leaves every
        agent trainable afterwards; PEFT's own would leave only the active one trainable)."""
        self.model: nn.Module = model
        """The transformers model that runs (the trainer's PEFT-injected base, or a plain one)."""
        weight = self.model.get_input_embeddings().weight
        asked = torch.device(device) if device is not None else weight.device
        # 'cuda' names the current CUDA device: it matches a model on 'cuda:0' (when current).
        if asked.type == weight.device.type and asked.index is None:
            asked = weight.device
        self.device = asked
        if self.device != weight.device:
            raise ValueError(
                f"device={str(self.device)!r} but the model is on {weight.device}: the engine "
                f"shares the model's base weights and never copies them; move the model instead"
            )
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size!r}: must be an int >= 1")
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.static_cache = static_cache or compile
        self.compile = compile
        self.pick: Picker = pick_tokens
        """How rows pick their next token (sampling.py). Where the decode step is compiled on
        CUDA: by vocabulary blocks in two Triton kernels (picker_kernel.py; rows that filter
        top-k/top-p take ``pick_tokens`` compiled): the eager form's passes over the vocabulary
        cost ~15% of a step, the compiled form's ~4%."""
        if compile and self.device.type == "cuda":
            from roll.inference.hf.picker_kernel import blocked_picker  # Triton: CUDA only

            self.pick = blocked_picker(compiled_picker())
        self.config = self.model.config.get_text_config()
        self.vocab_size = int(self.config.vocab_size)
        self.eos_ids = _eos_ids(tokenizer, self.model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (
            min(self.eos_ids))
        self._rng = random.Random(seed)
        self.fused = FusedLoRA(
            self.model,
            dtype=lora_dtype or weight.dtype,
            device=self.device,
            slot_capacity=slot_capacity or 1,
            rank_capacity=rank_capacity or 1,
            static_addresses=compile,
            kernels=resolve_kernels(lora_kernels, self.device),
        )
        self.projections = FusedProjections(self.model if fuse_projections else None)
        self._takes_cache_position = "cache_position" in inspect.signature(
            self.model.forward
        ).parameters
        self._static_caches: dict[tuple[int, int], object] = {}
        self._compiled_step = None
        self._decode_graph: tuple[tuple, CapturedStep] | None = None
        self.decode_captures = 0
        """CUDA graphs captured by the compiled lock-step decode so far (one at a time: a new
        batch bucket, cache length or LoRA layout captures again)."""
        self.forward_calls = 0
        """Model forwards run so far (prefill + decode steps), for tests and metrics."""
        self.cuda_graphs = cuda_graphs
        self.share_prefix = share_prefix
        """Continuous batching: the leading tokens that an admission's prompts share are
        prefilled once per adapter (hf/prefill.py)."""
        self.prefill_graphs = prefill_graphs
        """Continuous batching: admissions' prefills padded to (rows, width) buckets, replayed
        as one CUDA graph per bucket where the decode step is one (hf/prefill_graphs.py)."""
        self._decoder: ContinuousDecoder | None = None
        """The continuous decoder of the last ``serve`` (kept: its ring and graph are reused
        while lanes and capacity stay the same)."""
        self.graph_captures = 0
        """CUDA graph captures of the continuous decoder so far (constant after warm-up)."""
        self.last_serve: dict[str, int] = {}
        """Figures of the last ``serve`` call: lanes, capacity, served, prefills, decode_steps,
        captures, ring growths, shared_tokens (prompt tokens a shared head saved) and more."""

    # ------------------------------------------------------------------ adapter slots
    def load_adapter(
        self, slot: str, tensors: dict[str, Tensor], lora_config, version: int
    ) -> None:
        """Create or replace a slot with PEFT-format LoRA tensors at this version."""
        self.fused.load(slot, tensors, lora_config, version)

    def remove_adapter(self, slot: str) -> None:
        self.fused.remove(slot)

    def adapter_version(self, slot: str) -> int | None:
        """Version a slot serves, None if it is not loaded (so ``!= wanted`` means: load it)."""
        return self.fused.slots[slot].version if slot in self.fused.slots else None

    @property
    def slots(self) -> list[str]:
        return sorted(self.fused.slots)

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        """Generate for every request (any mix of slots); outputs come in request order."""
        tries: list[CompletionTrie | None] = []
        for index, request in enumerate(requests):
            self.check_request(request, f"requests[{index}]")
            completions = request.allowed_completions
            tries.append(CompletionTrie.of(completions, self.vocab_size) if completions else None)
        seeds = [r.sampling.seed if r.sampling.seed is not None else self.next_seed()
                 for r in requests]
        outputs: list[GenerationOutput] = []
        for start in range(0, len(requests), self.max_batch_size):
            end = start + self.max_batch_size
            outputs += self._generate_batch(requests[start:end], seeds[start:end], tries[start:end])
        return outputs

    def _generate_batch(
        self, requests: list[GenerationRequest], seeds: list[int], tries: list
    ) -> list[GenerationOutput]:
        real = len(requests)
        rows = _row_bucket(real) if self.static_cache else real
        filler = rows - real  # static shapes: pad the batch with 1-token greedy base rows
        prompts = [r.prompt_ids for r in requests] + [[self.pad_id]] * filler
        params = [r.sampling for r in requests] + [SamplingParams(temperature=0.0)] * filler
        prompt_width = max(len(p) for p in prompts)
        max_new = max(p.max_new_tokens for p in params[:real])
        total = prompt_width + max_new
        if self.static_cache:
            total = -(-total // CACHE_LEN_MULTIPLE) * CACHE_LEN_MULTIPLE

        input_ids, attention_mask = self._left_pad(prompts, prompt_width, total)
        prompt_lens = attention_mask.sum(-1, keepdim=True)  # (B, 1)
        position_ids = (attention_mask[:, :prompt_width].cumsum(-1) - 1).clamp(min=0)  # (B, P)

        self.fused.set_rows([r.adapter for r in requests] + [None] * filler)
        sampler = BatchSampler.build(params, seeds + [0] * filler, self.vocab_size, self.device)
        finish = RowFinish(params, [True] * real + [False] * filler, max_new, self.eos_ids,
                           self.device)
        host = HostChecks(params, tries + [None] * filler, self.eos_ids, self.decode_text)
        logprobs = torch.zeros(rows, max_new, dtype=torch.float32, device=self.device)

        with self._generation_mode():
            mask = attention_mask if self.static_cache else attention_mask[:, :prompt_width]
            positions = torch.arange(prompt_width, device=self.device)
            self.forward_calls += 1
            logits, cache = self._run(
                input_ids, mask, position_ids, self._new_cache(rows, total), positions
            )
            for step in range(max_new):
                # (B,) each; log-probs at each row's temperature (1 for greedy rows)
                tokens, logprobs[:, step] = sampler.select(logits, host.masked(logits),
                                                           self.pick)
                finish.update(step, tokens)
                if host:
                    stopped = host.step(tokens.tolist())
                    if stopped:
                        finish.stop(stopped)
                if step + 1 == max_new:
                    break
                if (host or (step + 1) % SYNC_EVERY == 0) and finish.all_finished():
                    break
                column = prompt_width + step  # where this step's token sits in the cache
                attention_mask[:, column] = 1
                mask = attention_mask if self.static_cache else attention_mask[:, : column + 1]
                logits = self._decode(
                    tokens[:, None], mask, prompt_lens + step, cache, positions[-1:] + step + 1
                )
        return self._outputs(requests, finish, host, logprobs)

    def serve(self, first: list[GenerationRequest], follow: Follow,
              context_len: int | None = None, later: Later | None = None) -> int:
        """Continuous batching (continuous.py): generate for ``first`` and for every request
        ``follow(key, output)`` returns as outputs finish, on at most ``max_batch_size`` lanes
        over a ring KV cache that starts a quarter above the longest prompt + max_new_tokens
        of ``first`` and grows as requests need; a request needing more than ``context_len``
        tokens is refused. ``later``: follow-ups that come after ``follow`` returned (base.Later),
        taken between decode steps. Returns how many requests were served."""
        if not first:
            return 0  # nothing started, so nothing of ``later`` can be outstanding
        longest = max(len(r.prompt_ids) + r.sampling.max_new_tokens for r in first)
        lanes = decode_lanes(len(first), self.max_batch_size,
                             None if self._decoder is None else self._decoder.lanes,
                             keep_captured=self._decoder is not None and self._decoder.graphs)
        decoder = self._decoder
        if decoder is None or decoder.lanes != lanes:
            self._decoder = None  # free the old ring first
            # Decode attention reads every ring column each step, so start tight (a quarter
            # more than the longest request so far) and let the ring grow when needed.
            decoder = self._decoder = ContinuousDecoder(self, lanes, longest + longest // 4 + 1,
                                                        self.cuda_graphs)
        else:
            decoder.reset()
        with self._generation_mode():
            served = decoder.serve(first, follow, limit=context_len, later=later)
        self.forward_calls += decoder.prefills + decoder.head_prefills + decoder.decode_steps
        self.graph_captures = decoder.captures
        self.last_serve = {"lanes": lanes, "served": served, **decoder.figures()}
        return served

    def sleep(self) -> None:
        """Nothing to free: the engine holds the trainer's own base weights."""

    def wake_up(self) -> None:
        """Nothing to take back (see ``sleep``)."""

    def check_request(self, request: GenerationRequest, where: str) -> None:
        """Refuse what this engine cannot serve, naming ``where`` (e.g. 'requests[3]')."""
        if not isinstance(request, GenerationRequest):
            raise TypeError(f"{where} is a {type(request).__name__}, not a GenerationRequest")
        if request.adapter is not None and request.adapter not in self.fused.slots:
            raise KeyError(f"{where}.adapter={request.adapter!r} is not a loaded slot; slots "
                           f"are {self.slots}")
        if max(request.prompt_ids) >= self.vocab_size:
            raise ValueError(f"{where}.prompt_ids has a token id >= the vocabulary size "
                             f"{self.vocab_size}")

    def next_seed(self) -> int:
        """A seed for a request that brings none (reproducible per engine and call order)."""
        return self._rng.randrange(2**63)

    def forward_last(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                     cache) -> Tensor:
        """Logits (B, V) of the last position, with a ready 4D additive ``attention_mask``
        (B, 1, T, keys) and a cache object of continuous.py (call inside generation mode)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, past_key_values=cache, use_cache=True,
                          logits_to_keep=1).logits[:, -1]

    def _left_pad(self, prompts: list[list[int]], width: int, total: int):
        """input_ids (B, width) left-padded, so every prompt ends at column width - 1, and the
        attention mask (B, total) over the whole cache (generated columns still 0)."""
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros(len(prompts), total, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt):width] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def _outputs(self, requests: list[GenerationRequest], finish: RowFinish, host: HostChecks,
                 logprobs: Tensor) -> list[GenerationOutput]:
        """One device→host copy of the tokens, log-probs and finish reasons, then per-row
        outputs (filler rows dropped)."""
        lengths, reasons = finish.length.tolist(), finish.reason.tolist()
        tokens, logprobs = finish.tokens.cpu(), logprobs.cpu()
        outputs = []
        for row, request in enumerate(requests):
            token_ids = tokens[row, : lengths[row]].tolist()
            text = self.decode_text(token_ids)
            if row in host.stop_matched:
                text = cut_at_stop(text, request.sampling.stop)
            slot = request.adapter
            outputs.append(GenerationOutput(
                token_ids=token_ids,
                logprobs=logprobs[row, : lengths[row]].tolist(),
                text=text,
                finish_reason=REASONS.get(reasons[row], "length"),
                adapter=slot,
                adapter_version=self.fused.version(slot) if slot is not None else None,
            ))
        return outputs

    def decode_text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    # ------------------------------------------------------------------ model calls
    @contextmanager
    def _generation_mode(self) -> Iterator[None]:
        """Eval mode, no grad, the model's own adapters off, the fused deltas on."""
        was_training = self.model.training
        self.model.eval()
        try:
            with (torch.no_grad(), self._adapters_off(), self.projections.active(),
                  self.fused.active()):  # fused after projections: it sees their forwards
                yield
        finally:
            self.model.train(was_training)

    def _new_cache(self, rows: int, total: int):
        if not self.static_cache:
            return None  # the model creates a DynamicCache on the first call
        from transformers import StaticCache

        key = (rows, total)
        if key not in self._static_caches:
            # Keep one static cache at a time: each holds (layers, B, kv heads, total, head dim).
            self._static_caches = {key: StaticCache(config=self.model.config, max_cache_len=total)}
        cache = self._static_caches[key]
        cache.reset()
        return cache

    def _run(self, input_ids, attention_mask, position_ids, cache, cache_position):
        """One forward: logits (B, V) of the last position, and the (extended) cache.

        input_ids/position_ids (B, T); attention_mask (B, cached + T), or (B, cache length)
        for a static cache; cache_position (T,) the cache columns the T new tokens go to.
        """
        kwargs = {"cache_position": cache_position} if self._takes_cache_position else {}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **kwargs,
        )
        return out.logits[:, -1], out.past_key_values

    def _decode(self, input_ids, attention_mask, position_ids, cache, cache_position) -> Tensor:
        """One decoding step (B, 1) → logits (B, V); compiled when ``compile`` is on.

        Attention is grouped-query over the cache (``ring_decode_attention``, as in continuous
        decoding): transformers' sdpa path would copy every cached key and value once per
        query head first. ``attention_mask`` (B, keys) 0/1 becomes the additive (B, 1, 1, keys)
        mask it needs (one new token sees every key its row holds: no causal part).

        On CUDA the compiled step is captured as a CUDA graph of our own (``CapturedStep``;
        again when the shape, cache or LoRA layout changes) and replayed: a step then costs
        four input copies and one graph launch on the host, no guard checks (torch.compile's
        own CUDA graphs spent 1.9 ms of host time per step with no adapter and 3–4 ms with
        four, at batch 64)."""
        self.forward_calls += 1
        dtype = self.model.get_input_embeddings().weight.dtype
        mask = additive_mask(attention_mask.bool()[:, None, None, :], dtype)
        inputs = (input_ids, mask, position_ids, cache_position)
        with decode_attention(self.model, self.attention_kernel):
            if not self.compile:
                return self._run(input_ids, mask, position_ids, cache, cache_position)[0]
            if self._compiled_step is None:
                self._compiled_step = compile_step(self._static_step)
            if self.device.type != "cuda":
                return self._compiled_step(input_ids, mask, position_ids, cache, cache_position)
            key = (tuple(input_ids.shape), tuple(mask.shape), id(cache), self.fused.layout_key)
            if self._decode_graph is None or self._decode_graph[0] != key:
                # One graph at a time, like the static cache it writes: a new shape, cache or
                # LoRA layout frees the old graph before capturing the new one.
                self._decode_graph = None
                with stage(f"hf engine: compiling and capturing the decode step (batch "
                           f"{input_ids.shape[0]}, cache {mask.shape[-1]})"):
                    self._decode_graph = (key, CapturedStep(
                        lambda *args: self._compiled_step(*args[:3], cache, args[3]), inputs,
                        cache_counters(cache)))
                self.decode_captures += 1
            graph = self._decode_graph[1]
            return graph.replay(inputs).clone()  # the next replay overwrites its output

    def _static_step(self, input_ids, attention_mask, position_ids, cache, cache_position):
        """The function torch.compile sees: one step on the static cache."""
        if not self.fused.layout_key:  # read so that torch.compile guards on the LoRA layout
            raise AssertionError("empty layout key")
        return self._run(input_ids, attention_mask, position_ids, cache, cache_position)[0]


def _is_peft_wrapper(model: nn.Module) -> bool:
    """A ``PeftModel`` or PEFT tuner (``LoraModel``) around a model, rather than a transformers
    model (which may carry PEFT's LoRA layers, and then a ``peft_config`` of its own)."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTuner

    return isinstance(model, PeftModel | BaseTuner)


def _row_bucket(n: int) -> int:
    """Rows of a static batch: the next power of two, at least MIN_STATIC_ROWS."""
    return max(MIN_STATIC_ROWS, 1 << max(0, n - 1).bit_length())


def _eos_ids(tokenizer, model: nn.Module) -> set[int]:
    """EOS ids from the tokenizer and the model's generation config (int or list)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids.update(int(i) for i in (configured if isinstance(configured, list) else [configured]))
    if not ids:
        raise ValueError("neither the tokenizer nor the model's generation config names an EOS")
    return ids
