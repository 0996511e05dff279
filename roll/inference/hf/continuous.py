"""Continuous batching for the hf engine: rows join and leave a running decode batch.

A fixed number of decode *lanes* runs one token per step each. When a lane's request finishes
(EOS, stop string, allowed completion done, max_new_tokens) its output goes to the caller's
``follow`` callback at once, and whatever requests that callback returns (e.g. the episode's
next turn, any agent) are prefilled into free lanes before the next step. No row waits for the
slowest row of a round; finished rows stop costing compute.

The KV cache is a RING of ``capacity`` columns per lane (``RingCache``). Every decode step
writes column ``c`` of every lane and then moves to ``c + 1`` (mod capacity). A lane that joins
before step ``c`` gets its prompt's keys/values written to columns ``c - L … c - 1`` (mod
capacity) from a separate prefill forward. Which columns a lane may attend to is a per-lane
mask, passed to the model as a ready 4D additive mask; rotary position ids are per lane too.
Attention does not care where a key sits, only whether it is masked (keys carry their rotary
phase from the moment they were computed), so ring storage is exact. A lane's span (prompt +
generated) must stay below the capacity, so the ring never overwrites a live key: a request
that needs more makes the ring grow (unrolled into a ring half as large again). Decode attention
is grouped-query over the ring without copying keys per query head (``ring_decode_attention``).

Decode shapes never change (lanes × 1 token, lanes × capacity cache), so on CUDA the decode
forward is captured once as a CUDA graph (``graphs``) and replayed every step; it is captured
again only when the fused-LoRA layout changes (a new slot that grows the stacks). An admission's
prefill stops every lane while it runs; on CUDA it replays the CUDA graph of its (rows, width)
bucket (prefill_graphs.py: an eager prefill of a few Hanabi prompts cost an H200 ~100 ms of
launches, the replay 12 ms), elsewhere it runs eagerly.

The host never waits for a step before launching the next: each step's tokens are copied to
pinned memory without waiting and read after the next step is launched, so the host's work
(finishing requests, the caller's ``follow``, admissions) overlaps the device's. A request that
ends at a token the host cannot foresee (EOS, a stop string) thus runs one decode step more,
for nothing; lanes with constrained answers are read before each step (their trie decides
what they may sample), and then the callers' follow-ups of the requests that ended wait until
the next step is launched, so that they overlap it (the admissions they bring come after).

Sampling and log-probs follow the lock-step path exactly (same per-row seeded Gumbel noise by
the row's own token index, log-probs at the row's temperature, constraint masks on sampling
only), so a request's tokens do not depend on when it joined or what ran beside it.

This module is the device side and the loop; ``lanes.py`` holds the host's record of each
lane's request (when it ends, its output) and of the steps launched but not read yet.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from roll.inference.base import Follow, GenerationOutput, GenerationRequest, Later
from roll.inference.constrained import CompletionTrie
from roll.inference.hf.cuda_graph import CapturedStep, compile_step
from roll.inference.hf.lanes import Lane, Step, constrain
from roll.inference.hf.prefill import prefill
from roll.inference.hf.prefill_graphs import PrefillGraphs
from roll.inference.hf.ring import (
    RingCache,
    additive_mask,
    aligned_columns,
    decode_attention,
)
from roll.inference.hf.sampling import (
    _VOCAB_SALT,
    mix32,
    seed_key,
)
from roll.utils.stages import profiled, stage
from roll.utils.transfer import upload

if TYPE_CHECKING:
    from roll.inference.hf.engine import HFEngine


def decode_lanes(requests: int, max_lanes: int, current: int | None,
                 keep_captured: bool = False) -> int:
    """How many decode lanes a ``serve`` of ``requests`` first requests runs on.

    A new lane count is a new decode shape: on CUDA a new compile and CUDA-graph capture (50 s
    for the Qwen3-0.6B shape on an H200, seen when a Hanabi step that began with part of its
    episodes played ahead asked for 24 lanes after 32). So the current decoder's lanes are kept
    while they hold every first request and at most half of them start idle; a new count is a
    power of two (at most ``max_lanes``), so the shapes a run meets are few. With
    ``keep_captured`` (the decode step replays a CUDA graph) the current lanes are kept
    whenever they hold every first request: an idle lane of a replayed graph costs next to
    nothing, a smaller shape a compile in the middle of a step (session 62: a Hanabi step whose
    episodes were mostly played ahead dropped from 32 to 16 lanes and spent 56 s of its 57-s
    rollout compiling). Extra lanes take follow-up requests as they come; each request samples
    from its own seed, so which lane serves it does not change what it gets."""
    needed = min(requests, max_lanes)
    if current is not None and needed <= current and (keep_captured or current < 2 * needed):
        return current
    return min(max_lanes, 1 << (needed - 1).bit_length())


HOST_PARTS = ("admit", "launch", "wait", "finish", "follow")
"""Where a ``serve``'s host time goes: admissions (prefill launched, lanes set up), decode
steps launched, waiting for a step's tokens, reading them (finish checks, outputs), and the
caller's ``follow`` (env steps, next prompts). A host-bound loop shows little ``wait``."""


class ContinuousDecoder:
    """Serves requests (and the requests their outputs lead to) on ``lanes`` decode rows."""

    def __init__(self, engine: HFEngine, lanes: int, capacity: int, graphs: bool = False
                 ) -> None:
        self.engine = engine
        self.lanes = lanes
        self.capacity = capacity = aligned_columns(capacity)
        self.limit: int | None = None
        """Longest prompt + max_new_tokens a request may need (``serve``'s context_len)."""
        model, device = engine.model, engine.device
        config = engine.config
        heads = config.num_key_value_heads
        head_dim = (getattr(config, "head_dim", None)
                    or config.hidden_size // config.num_attention_heads)
        dtype = model.get_input_embeddings().weight.dtype
        self.ring = RingCache(config.num_hidden_layers, lanes, heads, capacity, head_dim, dtype,
                              device)
        self.dtype, self.device = dtype, device
        self.visible = torch.zeros(lanes, capacity, dtype=torch.bool, device=device)
        self.position = torch.zeros(lanes, dtype=torch.long, device=device)
        self.last_token = torch.full((lanes,), engine.pad_id, dtype=torch.long, device=device)
        self.steps = torch.zeros(lanes, dtype=torch.long, device=device)
        """Tokens generated so far per lane: the index of the next one (its noise stream)."""
        self.temperature = torch.ones(lanes, device=device)
        self.greedy = torch.ones(lanes, dtype=torch.bool, device=device)
        self.top_k = torch.zeros(lanes, dtype=torch.long, device=device)
        self.top_p = torch.ones(lanes, device=device)
        self.row_keys = torch.zeros(lanes, dtype=torch.long, device=device)
        self.vocab_keys = mix32(torch.arange(engine.vocab_size, device=device) + _VOCAB_SALT)
        self.mask = torch.zeros(lanes, 1, 1, capacity, dtype=dtype, device=device)
        """The decode step's additive attention mask (a static buffer, refilled each step)."""
        self.graphs = graphs and device.type == "cuda"
        self.prefill_graphs = (PrefillGraphs(engine, dtype, capture=self.graphs)
                               if engine.prefill_graphs else None)
        """Admissions' prefills by (rows, width) bucket, replayed as CUDA graphs where the
        decode step is (prefill_graphs.py); None: every prefill eager at its own shape."""
        self.graph: CapturedStep | None = None
        self.graph_layout: int | None = None
        self._step: Callable[..., Tensor] | None = None
        self.captures = 0
        self.capture_failures = 0
        self.grows = 0
        self.running: list[Lane | None] = [None] * lanes
        self.rows_stale = True
        """Whether the fused LoRA's per-row slots must be set again before the next step."""
        self.column = 0
        self.decode_steps = 0
        self.prefills = 0
        self.shared_tokens = self.head_prefills = 0
        """Prompt tokens whose prefill a shared head saved, and the heads' forwards (prefill.py)."""
        self.host_s = dict.fromkeys(HOST_PARTS, 0.0)
        """Where this ``serve``'s host time went (HOST_PARTS), seconds."""

    def reset(self) -> None:
        """Forget every lane (a new ``serve``); buffers and the captured graphs are kept."""
        self.running = [None] * self.lanes
        self.visible.zero_()
        self.rows_stale = True
        self.decode_steps = self.prefills = self.shared_tokens = self.head_prefills = 0
        self.host_s = dict.fromkeys(HOST_PARTS, 0.0)
        if self.prefill_graphs is not None:
            self.prefill_graphs.new_serve()

    def figures(self) -> dict[str, float]:
        """The last ``serve``'s figures (the engine's ``last_serve``): ring capacity, prefills,
        decode steps, decode graph captures so far, ring growths, shared_tokens (prompt tokens
        a shared head saved), the serve's prefill replays and captures and the seconds those
        captures took (part of ``admit_s``), and where its host time went (HOST_PARTS)."""
        graphs = self.prefill_graphs
        return {"capacity": self.capacity, "prefills": self.prefills,
                "decode_steps": self.decode_steps, "graph_captures": self.captures,
                "grows": self.grows, "graph_failures": self.capture_failures,
                "shared_tokens": self.shared_tokens,
                **({"prefill_replays": graphs.replays, "prefill_captures": graphs.captures,
                    "prefill_capture_failures": graphs.capture_failures,
                    "prefill_capture_s": round(graphs.capture_s, 4)} if graphs else {}),
                **{f"{part}_s": round(seconds, 4) for part, seconds in self.host_s.items()}}

    # ------------------------------------------------------------------ the loop
    def serve(self, first: list[GenerationRequest], follow: Follow,
              limit: int | None = None, later: Later | None = None) -> int:
        """Run until no request is left; returns how many requests were served. The ring
        grows as requests need (up to ``limit`` tokens of prompt + max_new_tokens each).
        ``later``'s ready follow-ups are taken before every step, and waited for only when
        nothing is left to decode."""
        self.limit = limit
        queue: deque[tuple[int, GenerationRequest]] = deque()
        submitted = 0

        def submit(requests: list[GenerationRequest]) -> None:
            nonlocal submitted
            for request in requests:
                self.engine.check_request(request, f"requests[{submitted}]")
                need = len(request.prompt_ids) + request.sampling.max_new_tokens
                if self.limit is not None and need > self.limit:
                    raise ValueError(
                        f"requests[{submitted}]: prompt ({len(request.prompt_ids)}) + "
                        f"max_new_tokens ({request.sampling.max_new_tokens}) = {need} tokens "
                        f"exceed context_len={self.limit}"
                    )
                if need >= self.capacity:
                    self._grow(need + 1)
                queue.append((submitted, request))
                submitted += 1

        submit(first)
        # The host reads a step's tokens after launching the next step, so that its work
        # (finishing requests, the caller's follow, admitting new ones) overlaps the device's.
        # A lane whose request ended at the step read late runs one more step for nothing.
        pending: list[Step] = []
        while True:
            busy = bool(queue or pending or any(lane is not None for lane in self.running))
            if later is not None and later.outstanding():
                submit(later.ready(wait=not busy))
                busy = busy or bool(queue)
            if not busy:
                if later is None or not later.outstanding():
                    break
                continue
            free = [i for i, lane in enumerate(self.running) if lane is None]
            if queue and free:
                admitted = [(lane, *queue.popleft()) for lane in free[: len(queue)]]
                start = perf_counter()
                for part in self._bucketed(admitted):
                    with profiled("roll.admit"):
                        pending.append(self._admit(part))
                self.host_s["admit"] += perf_counter() - start
            needed = self._decoding()
            # Constrained lanes sample from their trie node: their tokens must be read first.
            # The callers' follow-ups (env steps, next prompts) wait until the next step is
            # launched, so that they overlap it instead of leaving the device idle.
            if pending and (not needed or any(lane.trie is not None for lane in needed)):
                ended = [done for step in pending for done in self._finish(step)]
                pending = self._launch(self._decoding())
                submit(self._follow(ended, follow))
                continue
            launched = self._launch(needed)
            for step in pending:
                submit(self._follow(self._finish(step), follow))
            pending = launched
        return submitted

    def _decoding(self) -> list[Lane]:
        """The running lanes that need another decode step (not finished, tokens still to
        come beyond those in flight)."""
        return [lane for lane in self.running if lane is not None and not lane.finished
                and len(lane.tokens) + lane.in_flight < lane.request.sampling.max_new_tokens]

    def _grow(self, need: int) -> None:
        """A ring of at least ``need`` columns (x 1.5 at least): the old ring is unrolled so that
        the last written column ends at the old capacity and the new columns follow; lanes in
        flight keep their keys. The decode graph is captured again for the new shape."""
        if self.device.type == "cuda":  # a step in flight still writes the old ring
            torch.cuda.current_stream().synchronize()
        old = self.capacity
        capacity = aligned_columns(max(need, old + old // 2))
        order = (torch.arange(old, device=self.device) + self.column) % old  # oldest first
        self.ring.unroll(capacity, order)
        visible = self.visible.new_zeros(self.lanes, capacity)
        visible[:, :old] = self.visible.index_select(1, order)
        self.visible = visible
        self.mask = self.mask.new_zeros(self.lanes, 1, 1, capacity)
        self.capacity, self.column = capacity, old
        self.graph = None
        self.grows += 1

    # ------------------------------------------------------------------ admission
    def _bucketed(self, admitted: list[tuple[int, int, GenerationRequest]]
                  ) -> list[list[tuple[int, int, GenerationRequest]]]:
        """``admitted`` cut into prefills that each fit a prefill graph's bucket, in order
        (the lanes and requests as they were). Why: turns that end at one decode step come back
        together, and an admission larger than a bucket ran eagerly, ~80-115 ms of host time
        each for the Qwen3-0.6B shape, 98 of a Hanabi rollout's 155 prefills (H100,
        benchmarks/README.md, "The learning recipe's Hanabi rollout under cProfile"); a replay
        is a few ms. Without prefill graphs, or where one prompt is wider than a bucket:
        whole."""
        graphs = self.prefill_graphs
        if graphs is None:
            return [admitted]
        rows = (graphs.rows_per_bucket([request.prompt_ids for _, _, request in admitted])
                or len(admitted))
        return [admitted[i:i + rows] for i in range(0, len(admitted), rows)]

    def _admit(self, admitted: list[tuple[int, int, GenerationRequest]]) -> Step:
        """Prefill these requests into their lanes, sample each one's first token."""
        engine = self.engine
        prompts = [request.prompt_ids for _, _, request in admitted]
        self.rows_stale = True
        self.prefills += 1
        adapters = [request.adapter for _, _, request in admitted]
        logits, capture, shared, width = prefill(  # (rows, V); keys/values (rows, H, width, D)
            engine, prompts, adapters, engine.share_prefix, self.dtype, self.prefill_graphs)
        self.shared_tokens += shared * (len(prompts) - len(set(adapters)))
        self.head_prefills += bool(shared)
        lane_list = [lane for lane, _, _ in admitted]
        lanes = upload(lane_list, torch.long, self.device)
        # Every prompt token's (lane, ring column) and (prefill row, capture column), flattened
        # (P,): the shared head's tokens sit at their own index, a row's own tokens end at width.
        lengths = [len(request.prompt_ids) for _, _, request in admitted]
        repeats = torch.tensor(lengths)
        lane_of = torch.repeat_interleave(torch.tensor(lane_list), repeats)
        row_of = torch.repeat_interleave(torch.arange(len(prompts)), repeats)
        back = torch.cat([torch.arange(length, 0, -1) for length in lengths])  # tokens before
        index = repeats.repeat_interleave(repeats) - back  # the token's index in its prompt
        position_of = torch.where(index < shared, index, width - back)
        lane_of, row_of, back, position_of = (upload(t, torch.long, self.device)
                                              for t in (lane_of, row_of, back, position_of))
        column_of = (self.column - back) % self.capacity  # before the current column
        self.ring.write(capture, lane_of, column_of, row_of, position_of)
        # not ``visible[index] = scalar``: that copies the scalar from the host and waits
        self.visible.index_fill_(0, lanes, False)
        self.visible.index_put_((lane_of, column_of), self.visible.new_ones(()))
        params = [request.sampling for _, _, request in admitted]
        seeds = [sampling.seed if sampling.seed is not None else engine.next_seed()
                 for sampling in params]
        for lane, key, request in admitted:
            completions = request.allowed_completions
            trie = CompletionTrie.of(completions, engine.vocab_size) if completions else None
            self.running[lane] = Lane(key, request, trie)
        # one host → device copy per buffer for all admitted lanes
        for buffer, values in (
                (self.temperature, [1.0 if s.greedy else s.temperature for s in params]),
                (self.greedy, [s.greedy for s in params]),
                (self.top_k, [s.top_k for s in params]),
                (self.top_p, [s.top_p for s in params]),
                (self.row_keys, [seed_key(seed) for seed in seeds]),
                (self.position, lengths)):
            buffer[lanes] = upload(values, buffer.dtype, self.device)
        self.steps.index_fill_(0, lanes, 0)
        return self._sample(lane_list, lanes, logits)

    # ------------------------------------------------------------------ decoding
    def _decode_step(self) -> Step:
        """One token for every running lane (launched; read by ``_finish``)."""
        engine = self.engine
        lane_list = [i for i, lane in enumerate(self.running) if lane is not None]
        active = upload([lane is not None for lane in self.running], torch.bool, self.device)
        self.visible[:, self.column] = active
        self.ring.column.fill_(self.column)
        if self.rows_stale or engine.fused.row_mask.shape[-1] != engine.fused.columns:
            engine.fused.set_rows([None if lane is None else lane.request.adapter
                                   for lane in self.running])
            self.rows_stale = False
        self.decode_steps += 1
        self.mask.copy_(additive_mask(self.visible[:, None, None, :], self.dtype))
        logits = self._decode_forward()  # (lanes, V)
        self.column = (self.column + 1) % self.capacity
        self.position += 1
        lanes = upload(lane_list, torch.long, self.device)
        return self._sample(lane_list, lanes,
                            logits if len(lane_list) == self.lanes else logits[lanes])

    def _decode_forward(self) -> Tensor:
        """One decode forward of every lane from the static buffers; on CUDA (``graphs``) a
        captured CUDA graph replayed, captured again only if the fused-LoRA layout changed."""
        engine = self.engine

        if self._step is None:
            # compile: one fused step (captured below on CUDA); compiled again after a growth
            self._step = (compile_step(self._forward_step) if engine.compile
                          else self._forward_step)

        def forward() -> Tensor:
            with decode_attention(engine.model, engine.attention_kernel):
                return self._step(self.last_token[:, None], self.mask, self.position[:, None])

        if not self.graphs:
            return forward()
        if self.graph is None or self.graph_layout != engine.fused.layout_key:
            try:
                self._capture(forward)
            except RuntimeError as error:  # said loudly, counted, and decoding goes on eagerly
                print(f"continuous decoding: CUDA graph capture failed, decoding eagerly: "
                      f"{error}", flush=True)
                self.graphs = False
                self.capture_failures += 1
                return forward()
        return self.graph.replay()

    def _forward_step(self, tokens: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        """The decode forward (what ``torch.compile`` sees): tokens (lanes, 1) → logits
        (lanes, V) over the ring."""
        if not self.engine.fused.layout_key:  # read so that a compiled step guards on it
            raise AssertionError("empty layout key")
        return self.engine.forward_last(tokens, mask, positions, self.ring)

    def _capture(self, forward: Callable[[], Tensor]) -> None:
        """Capture the step; the warm-ups and the capture write this step's ring column with
        this step's inputs, as the replay does."""
        what = "compiling and capturing" if self.engine.compile else "capturing"
        # The first compile of a shape takes 30-70 s on a GPU: said, so it is not taken for a hang.
        with stage(f"hf engine: {what} the decode step ({self.lanes} lanes, capture "
                   f"{self.captures + 1})"):
            self.graph = CapturedStep(forward)
        self.graph_layout = self.engine.fused.layout_key
        self.captures += 1

    def _sample(self, lane_list: list[int], lanes: Tensor, logits: Tensor) -> Step:
        """Choose the next token of these lanes (``lanes``: ``lane_list`` on the device; logits
        (n, V)) on the device and start copying it to the host; ``_finish`` reads it."""
        states = [self.running[lane] for lane in lane_list]
        # What to run is decided from the requests on the host: no device read before the one
        # below (each read waits for the whole step).
        params = [state.request.sampling for state in states]
        sampled = None if all(p.greedy for p in params) else ~self.greedy[lanes]
        filters = any(not p.greedy and (p.top_k > 0 or p.top_p < 1.0) for p in params)
        tokens, logprobs = self.engine.pick(
            logits, self.temperature[lanes][:, None], sampled, self.row_keys[lanes],
            self.steps[lanes], self.vocab_keys, constrain(logits, states),
            self.top_k[lanes] if filters else None, self.top_p[lanes] if filters else None)
        self.last_token[lanes] = tokens
        self.steps[lanes] += 1
        for state in states:
            state.in_flight += 1
        # tokens and log-probs in one device → host copy (token ids are exact in float64)
        pair = torch.stack([tokens.double(), logprobs.double()])  # (2, n)
        if pair.device.type != "cuda":
            return Step(lane_list, states, pair, None)
        host = torch.empty(pair.shape, dtype=pair.dtype, pin_memory=True)
        host.copy_(pair, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Step(lane_list, states, host, done)

    def _launch(self, needed: list[Lane]) -> list[Step]:
        """The next decode step, launched if any lane ``needed`` it (``_decoding``)."""
        if not needed:
            return []
        start = perf_counter()
        with profiled("roll.decode_step"):
            step = self._decode_step()
        self.host_s["launch"] += perf_counter() - start
        return [step]

    def _follow(self, ended: list[tuple[int, GenerationOutput]],
                follow: Follow) -> list[GenerationRequest]:
        """``follow`` each ended request's output (from ``_finish``); the requests they
        return."""
        start = perf_counter()
        new: list[GenerationRequest] = []
        for key, output in ended:
            with profiled("roll.follow"):  # the caller: env step, next prompt
                new += follow(key, output)
        self.host_s["follow"] += perf_counter() - start
        return new

    def _finish(self, step: Step) -> list[tuple[int, GenerationOutput]]:
        """Read a step's tokens (waiting for it), record them and finish lanes that are done;
        the ended requests' (key, output), for ``_follow``."""
        start = perf_counter()
        if step.done is not None:
            with profiled("roll.wait"):  # the host idle until the device is done
                step.done.synchronize()
        waited = perf_counter()
        self.host_s["wait"] += waited - start
        engine = self.engine
        ended: list[tuple[int, GenerationOutput]] = []
        for lane, state, token, logprob in zip(step.lanes, step.states,
                                               step.host[0].long().tolist(),
                                               step.host[1].tolist(), strict=True):
            state.in_flight -= 1
            if state.finished:  # the step after its last token, run before that was read
                continue
            state.tokens.append(token)
            state.logprobs.append(logprob)
            reason = state.finish_reason(token, engine.eos_ids, engine.decode_text)
            if reason is None:
                continue
            state.finished = True
            self.running[lane] = None
            self.visible[lane] = False
            self.rows_stale = True
            ended.append((state.key, state.output(reason, engine)))
        self.host_s["finish"] += perf_counter() - waited
        return ended
