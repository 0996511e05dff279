"""Configuration of a team of agents: one LoRA adapter, one optimizer per agent.

Every dataclass validates itself; a bad value raises ``ConfigError`` naming the field path
(``agents[1].lora.rank``) and the value, before any model is loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from roll.errors import ConfigError, require_int

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$")
LR_SCHEDULERS = ("constant", "linear", "cosine")
OPTIMIZERS = ("adamw", "sgd")
CRITIC_MODES = ("none", "per_agent", "shared")
CRITIC_INPUTS = ("local", "global")
MAX_AGENTS = 4096
"""More agents than this is a typo, not a team: each is a LoRA adapter (and an optimizer) on
the one base, built before step 1; the bound turns 1e9 into a config error instead of minutes
spent listing agents and a MemoryError."""


@dataclass
class LoRAConfig:
    """One agent's LoRA adapter."""

    rank: int = 8
    """LoRA rank r (> 0)."""
    alpha: float = 16.0
    """LoRA alpha (> 0); the update is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the LoRA input, in [0, 1)."""
    target_modules: list[str] = field(default_factory=lambda: list(ALL_LINEAR))
    """Short names of the linear layers that get the adapter (e.g. q_proj, v_proj)."""

    def validate(self, where: str, model_modules: set[str] | None = None) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank <= 0:
            raise ConfigError(f"{where}.rank", self.rank, "must be an integer > 0")
        if not isinstance(self.alpha, int | float) or self.alpha <= 0:
            raise ConfigError(f"{where}.alpha", self.alpha, "must be > 0")
        if not isinstance(self.dropout, int | float) or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"{where}.dropout", self.dropout, "must be in [0, 1)")
        if not self.target_modules or isinstance(self.target_modules, str):
            raise ConfigError(
                f"{where}.target_modules", self.target_modules, "must be a non-empty list"
            )
        if model_modules is not None:
            unknown = sorted(set(self.target_modules) - model_modules)
            if unknown:
                raise ConfigError(
                    f"{where}.target_modules",
                    unknown,
                    f"not linear layers of this model (it has {sorted(model_modules)})",
                )


@dataclass
class OptimConfig:
    """One agent's optimizer (AdamW or SGD), gradient clipping and learning-rate schedule."""

    name: str = "adamw"
    """'adamw' or 'sgd'. SGD's step shrinks with the gradient, Adam's does not (it divides by
    the gradient's running scale): near a mixed equilibrium, where the mean gradient is small
    and the noise is not, Adam keeps taking full-size steps and the policy cycles
    (benchmarks/tabular_kuhn.py). Not with actor_train.strategy=deepspeed."""
    lr: float = 1e-4
    """Peak learning rate (> 0)."""
    momentum: float = 0.0
    """SGD momentum in [0, 1); only with name=sgd."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (>= 0)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas, each in [0, 1)."""
    eps: float = 1e-8
    """AdamW epsilon (> 0)."""
    max_grad_norm: float = 1.0
    """Clip this agent's gradient norm to this value; 0 disables clipping."""
    lr_scheduler: str = "constant"
    """'constant', 'linear' (decay to 0 at total_steps) or 'cosine' (to 0 at total_steps)."""
    warmup_steps: int = 0
    """Linear warm-up over this many of the agent's own train steps (steps in which it had
    rows; one schedule step per train step, whatever its mini-batches and epochs)."""
    total_steps: int = 0
    """Length of the decay for 'linear'/'cosine', in the agent's own train steps (so
    ``${max_steps}`` decays to 0 at the run's last step)."""
    target_kl: float = 0.0
    """0: off. > 0: the rate follows the policy's movement instead of a fixed schedule: after
    each train step the agent's ``approx_kl`` (the logged one: the k3 estimate of KL(played ||
    current) on each mini-batch before its optimizer step, averaged over the step's mini-batches)
    is held near ``target_kl`` x the schedule's factor (warm-up, decay), the rate ``lr`` x a
    multiplier that is divided by 1.5 after a step above twice the target and multiplied by 1.5
    after one below half of it, within [1/100, 100] (optim.RateFactor; rl_games' adaptive rate,
    the schedule shaping the target). A step's movement in policy space then no longer depends
    on the model and the rank (SmolLM2's Hanabi adapter moved 1e-4 a step at 2e-4 where the
    stand-in network moved 1e-3). It needs two or more optimizer steps a train step
    (trainer.ppo_mini_batch_size or ppo_epochs >= 2): a single step's approx_kl is 0. Not for
    a policy that can turn deterministic: its approx_kl is ~0 whatever the rate, so the rate
    is raised to the bound (tiny Kuhn from 1e-4: one agent collapsed to 'always bet' at 3-10x
    the tuned rate; benchmarks/README.md, "a rate steered by the KL")."""

    def validate(self, where: str) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"{where}.name", self.name, f"must be one of {OPTIMIZERS}")
        if not isinstance(self.momentum, int | float) or not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"{where}.momentum", self.momentum, "must be in [0, 1)")
        if self.momentum and self.name != "sgd":
            raise ConfigError(f"{where}.momentum", self.momentum,
                              f"is SGD's; {where}.name={self.name!r} has no momentum setting")
        if not isinstance(self.lr, int | float) or self.lr <= 0:
            raise ConfigError(f"{where}.lr", self.lr, "must be > 0")
        if not isinstance(self.weight_decay, int | float) or self.weight_decay < 0:
            raise ConfigError(f"{where}.weight_decay", self.weight_decay, "must be >= 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"{where}.betas", self.betas, "must be two values in [0, 1)")
        if self.eps <= 0:
            raise ConfigError(f"{where}.eps", self.eps, "must be > 0")
        if self.max_grad_norm < 0:
            raise ConfigError(f"{where}.max_grad_norm", self.max_grad_norm, "must be >= 0")
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise ConfigError(
                f"{where}.lr_scheduler", self.lr_scheduler, f"must be one of {LR_SCHEDULERS}"
            )
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ConfigError(f"{where}.warmup_steps", self.warmup_steps, "must be an int >= 0")
        if not isinstance(self.target_kl, int | float) or not 0 <= self.target_kl < 1:
            raise ConfigError(f"{where}.target_kl", self.target_kl,
                              "must be in [0, 1) (0: off; a KL per train step, e.g. 1e-3)")
        if self.lr_scheduler != "constant" and self.total_steps <= self.warmup_steps:
            raise ConfigError(
                f"{where}.total_steps",
                self.total_steps,
                f"must exceed warmup_steps={self.warmup_steps} for lr_scheduler "
                f"{self.lr_scheduler!r}",
            )


@dataclass
class AgentConfig:
    """One agent: a name, its adapter and its optimizer. None means the team default."""

    name: str
    """Adapter name; letters, digits, '_' and '-', starting with a letter."""
    lora: LoRAConfig | None = None
    """This agent's LoRA shape; None takes MultiAgentConfig.lora."""
    optim: OptimConfig | None = None
    """This agent's optimizer; None takes MultiAgentConfig.optim."""


@dataclass
class MultiAgentConfig:
    """A team of ``num_agents`` agents sharing one frozen base model."""

    num_agents: int = 2
    """How many agents (adapters) train together (>= 1)."""
    agents: list[AgentConfig] = field(default_factory=list)
    """Per-agent settings. Empty: agents named agent_0 … agent_{N-1} with the defaults.
    Otherwise exactly num_agents entries."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Default LoRA shape for agents that do not set their own."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Default optimizer for agents that do not set their own."""
    shared_adapter: bool = False
    """Parameter sharing: the team is its first agent alone, one adapter that plays every seat
    or role any configured agent is mapped to (the others are not built); compare with one
    adapter per agent by flipping this flag alone."""

    def resolved_agents(self) -> list[AgentConfig]:
        """Agents with the team defaults filled in (call validate() first)."""
        agents = self.agents or [AgentConfig(name=f"agent_{i}") for i in range(self.num_agents)]
        if self.shared_adapter:
            agents = agents[:1]
        return [
            replace(
                agent,
                lora=agent.lora if agent.lora is not None else self.lora,
                optim=agent.optim if agent.optim is not None else self.optim,
            )
            for agent in agents
        ]

    @property
    def agent_names(self) -> list[str]:
        return [agent.name for agent in self.resolved_agents()]

    @property
    def declared_agent_names(self) -> list[str]:
        """Every configured agent's name, also under ``shared_adapter`` (where all of them
        resolve to the first one)."""
        return [a.name for a in self.agents] or [f"agent_{i}" for i in range(self.num_agents)]

    def validate(
        self, model_modules: set[str] | None = None, prefix: str = "team"
    ) -> MultiAgentConfig:
        """Check every field; with ``model_modules`` also check LoRA targets exist. Errors name
        the full key under ``prefix`` (``team.optim.lr``)."""
        if not isinstance(self.num_agents, int) or self.num_agents < 1:
            raise ConfigError(f"{prefix}.num_agents", self.num_agents, "must be an integer >= 1")
        if self.num_agents > MAX_AGENTS:
            raise ConfigError(f"{prefix}.num_agents", self.num_agents,
                              f"must be <= {MAX_AGENTS} (one LoRA adapter per agent on one base)")
        if self.agents and len(self.agents) != self.num_agents:
            named = [getattr(a, "name", a) for a in self.agents]
            raise ConfigError(
                f"{prefix}.agents",
                named,
                f"has {len(self.agents)} entries but num_agents={self.num_agents}: every agent "
                "needs a config (or leave agents empty for defaults)",
            )
        self.lora.validate(f"{prefix}.lora", model_modules)
        self.optim.validate(f"{prefix}.optim")
        seen: set[str] = set()
        for i, agent in enumerate(self.agents):
            where = f"{prefix}.agents[{i}]"
            if not isinstance(agent, AgentConfig):
                raise ConfigError(where, agent, "must be an AgentConfig")
            if not isinstance(agent.name, str) or not _AGENT_NAME.match(agent.name):
                raise ConfigError(
                    f"{where}.name", agent.name, "must match [A-Za-z][A-Za-z0-9_-]{0,63}"
                )
            if _peft_cannot_hold(agent.name):
                raise ConfigError(
                    f"{where}.name",
                    agent.name,
                    "PEFT cannot hold an adapter of that name (it keeps each adapter's layers "
                    "in a torch ModuleDict, which has an attribute of that name); rename it",
                )
            if agent.name in seen:
                raise ConfigError(f"{where}.name", agent.name, "duplicate agent name")
            seen.add(agent.name)
            if agent.lora is not None:
                agent.lora.validate(f"{where}.lora", model_modules)
            if agent.optim is not None:
                agent.optim.validate(f"{where}.optim")
        return self


def _peft_cannot_hold(name: str) -> bool:
    """PEFT keeps each adapter under its name in torch ModuleDict/ParameterDict containers,
    which refuse a key that is already one of their attributes (train, update, keys, to …)."""
    from torch import nn

    return hasattr(nn.ModuleDict(), name) or hasattr(nn.ParameterDict(), name)


@dataclass
class TrainerConfig:
    """How each agent's adapter is updated from its own rows (see trainer.py)."""

    micro_batch_size: int = 8
    """Rows per forward/backward; gradients accumulate over an agent's micro-batches."""
    logprob_micro_batch_size: int | None = None
    """Rows per forward in the no-grad old-log-prob and reference passes (they keep no
    activations, so they afford more rows); None: 4 x micro_batch_size."""
    ppo_epochs: int = 1
    """Passes over each agent's rows per train step."""
    fused: bool = True
    """Pack micro-batches of several agents into one forward/backward of at most
    micro_batch_size rows, each row through its own adapter (fewer forwards when agents have
    few rows each); false: one agent's micro-batch per forward (the reference path)."""
    compile: bool | None = None
    """Run the trainer's forwards (training, old-log-prob, reference; the critics' too unless
    one has LoRA dropout) through compiled decoder layers, each row's own agent's (critic's)
    LoRA picked per row (roll/multi_agent/compiled.py):
    fused kernels on a GPU, after a warm-up of one compile per input signature. Needs LoRA
    dropout 0 and the torch strategy. None (the default): the pipeline turns it on where the
    model is on CUDA and the run can compile (pipeline/builders.py ``trainer_compile``), else
    off; a trainer built directly reads None as off."""
    capture: bool | None = None
    """Replay each training micro-batch's forward, loss and backward from a captured CUDA graph
    (roll/multi_agent/captured.py): one graph per (width, window start, legal tokens) bucket, the
    host's ~4,000 kernel launches a micro-batch gone. Needs ``compile``,
    ``loss_agg_mode='token-mean'`` (the legal-move terms and ``policy_over='moves'`` are
    captured), the torch strategy on one rank and no shared prefix. None (the default): on
    where the compiled trainer runs on CUDA and those hold, else off. true: refused where they
    cannot hold; on the CPU it runs the same padded per-row step without a graph."""
    share_prefix: bool | None = None
    """Run the leading tokens that every row of a forward shares (a game's rules open every
    prompt) once per agent, each row attending to them (prefix.py): the same log-probs and
    gradients up to floating-point order, about half the tokens of a Kuhn or Leduc prompt;
    applies with LoRA dropout 0, not under ZeRO-3 (true is refused there; None leaves it off).
    None (the default): the pipeline turns it on where the model is on the CPU and off on
    CUDA (pipeline/builders.py ``trainer_share_prefix`` says why); a trainer built directly
    reads None as off."""
    compile_backend: str = "inductor"
    """The torch.compile backend of ``compile`` ('aot_eager' traces the same graphs without
    generating kernels: a quick check when a compiled run misbehaves)."""
    ppo_mini_batch_size: int | None = None
    """At most this many rows of one agent per optimizer step: each pass shuffles the agent's
    rows (its own generator) and cuts them into ceil(rows / this) mini-batches of nearly equal
    size (10 rows at 4: 4, 3, 3), one optimizer step each. None: one optimizer step per pass
    over all of the agent's rows."""
    clip_low: float = 0.2
    """PPO lower clip: ratio >= 1 - clip_low."""
    clip_high: float = 0.2
    """PPO upper clip: ratio <= 1 + clip_high (clip-higher when > clip_low)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages; None disables it."""
    kl_coef: float = 0.0
    """Weight of the KL-to-reference loss term (0 disables it and the reference pass)."""
    kl_estimator: str = "k3"
    """Estimator of KL(policy || reference) per token used as the loss: 'k3' ((r - 1) - log r,
    GRPO's) or 'k2' (0.5 (log r)^2). 'k1' is refused: as a loss its expected gradient is 0."""
    entropy_coef: float = 0.0
    """Weight of the token-level entropy bonus (subtracted from the loss)."""
    action_entropy_coef: float = 0.0
    """Weight of the entropy bonus on the distribution over LEGAL MOVES (constrained decoding
    only; roll/algorithms/choices.py): subtracted from the loss, per decision (row)."""
    bonus_decay_steps: int = 0
    """0: the entropy bonuses (``entropy_coef``, ``action_entropy_coef``) keep their weight.
    N > 0: each decays linearly with the agent's own train steps, ``coef * (1 - s / N)`` at its
    (s+1)-th step, to 0 from step N + 1 on (as a ``linear`` rate with ``total_steps`` N;
    ``${max_steps}`` ends the bonus with the run): explore early, sharpen the policy late."""
    magnet_coef: float = 0.0
    """Weight of KL(policy || magnet) over legal moves (constrained decoding only), per
    decision: magnetic mirror descent's pull toward ``magnet``."""
    magnet: str = "uniform"
    """'uniform' (every legal move alike) or 'snapshot' (the agent itself as it was at the
    last refresh, every ``magnet_refresh`` steps)."""
    magnet_refresh: int = 50
    """Train steps between refreshes of a 'snapshot' magnet (>= 1)."""
    magnet_kl: str = "forward"
    """Which KL ``magnet_coef`` weighs: 'forward', KL(policy || magnet) (magnetic mirror
    descent's; toward the uniform magnet its gradient is the entropy bonus's and vanishes near a
    deterministic policy), or 'reverse', KL(magnet || policy), whose gradient (policy - magnet
    at each branching point) pulls a nearly deterministic policy back at a fixed rate
    (roll/algorithms/choices.py)."""
    policy_over: str = "tokens"
    """What the policy loss's log-probs and ratios are of. 'tokens': every response token
    under the model's full next-token distribution. 'moves' (constrained decoding only): the
    policy constrained decoding PLAYS: at each branching point the model's distribution
    renormalised over the legal tokens, forced tokens excluded (probability 1, no gradient),
    each decision (row) weighted once, like the legal-move terms
    (roll/algorithms/choices.py). 'tokens' also pushes on the forced tokens of an answer and
    divides a decision's gradient by the tokens of its rows."""
    loss_agg_mode: str = "token-mean"
    """'token-mean' (over all of the agent's response tokens in the step) or
    'seq-mean-token-mean' (mean per row, then over rows)."""
    old_logprob_pass: str = "auto"
    """'auto': the no-grad old-log-prob pass runs only for the rows of agents that take more
    than one optimizer step in the step (several mini-batches or epochs) or have LoRA dropout;
    an agent that takes one reads its loss under the very weights of the old policy, so its
    training forward's own log-probs, detached, are the old ones (ratio exactly 1, as TRL does
    with one iteration) and its rows skip the pass (plan.py ``old_pass_agents``). 'always':
    every row gets the pass (its ratios then differ from 1 by floating-point noise only)."""

    def validate(self) -> TrainerConfig:
        if not isinstance(self.micro_batch_size, int) or self.micro_batch_size < 1:
            raise ConfigError("trainer.micro_batch_size", self.micro_batch_size, "must be >= 1")
        if not isinstance(self.ppo_epochs, int) or self.ppo_epochs < 1:
            raise ConfigError("trainer.ppo_epochs", self.ppo_epochs, "must be >= 1")
        forward_rows = self.logprob_micro_batch_size
        if forward_rows is not None and (
            not isinstance(forward_rows, int) or isinstance(forward_rows, bool) or forward_rows < 1
        ):
            raise ConfigError(
                "trainer.logprob_micro_batch_size", forward_rows, "must be an integer >= 1 or null"
            )
        mini = self.ppo_mini_batch_size
        if mini is not None and (not isinstance(mini, int) or isinstance(mini, bool) or mini < 1):
            raise ConfigError(
                "trainer.ppo_mini_batch_size", mini, "must be an integer >= 1 or null"
            )
        if self.capture not in (None, True, False):
            raise ConfigError("trainer.capture", self.capture, "must be true, false or null")
        if self.capture:
            if self.compile is False:
                raise ConfigError("trainer.capture", True, "needs trainer.compile (it is false)")
            reason = self.capture_refusal()
            if reason:
                raise ConfigError("trainer.capture", True, f"cannot capture with {reason}")
        for name in ("clip_low", "clip_high"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0 and not (name == "clip_high" and value >= 1.0):
                raise ConfigError(f"trainer.{name}", value, "must be > 0 (clip_low < 1)")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ConfigError("trainer.dual_clip", self.dual_clip, "must be > 1 or null")
        if self.kl_coef < 0:
            raise ConfigError("trainer.kl_coef", self.kl_coef, "must be >= 0")
        if self.kl_estimator == "k1":
            raise ConfigError(
                "trainer.kl_estimator", "k1",
                "k1 (log pi - log ref) cannot be a loss: its gradient is grad log pi, whose "
                "expectation under the policy's own samples is 0, so it pulls nothing toward "
                "the reference; use 'k3' (default) or 'k2'",
            )
        if self.kl_estimator not in ("k2", "k3"):
            raise ConfigError("trainer.kl_estimator", self.kl_estimator, "must be 'k3' or 'k2'")
        if self.entropy_coef < 0:
            raise ConfigError("trainer.entropy_coef", self.entropy_coef, "must be >= 0")
        for name in ("action_entropy_coef", "magnet_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"trainer.{name}", value, "must be a number >= 0")
        if (isinstance(self.bonus_decay_steps, bool) or not isinstance(self.bonus_decay_steps, int)
                or self.bonus_decay_steps < 0):
            raise ConfigError("trainer.bonus_decay_steps", self.bonus_decay_steps,
                              "must be an integer >= 0 (0: the bonuses do not decay)")
        if self.bonus_decay_steps and not (self.entropy_coef or self.action_entropy_coef):
            raise ConfigError("trainer.bonus_decay_steps", self.bonus_decay_steps,
                              "decays the entropy bonuses, and trainer.entropy_coef and "
                              "trainer.action_entropy_coef are both 0")
        if self.magnet not in ("uniform", "snapshot"):
            raise ConfigError("trainer.magnet", self.magnet, "must be 'uniform' or 'snapshot'")
        require_int("trainer.magnet_refresh", self.magnet_refresh)
        if self.magnet_kl not in ("forward", "reverse"):
            raise ConfigError("trainer.magnet_kl", self.magnet_kl,
                              "must be 'forward' or 'reverse'")
        if self.policy_over not in ("tokens", "moves"):
            raise ConfigError("trainer.policy_over", self.policy_over,
                              "must be 'tokens' or 'moves'")
        if self.old_logprob_pass not in ("auto", "always"):
            raise ConfigError("trainer.old_logprob_pass", self.old_logprob_pass,
                              "must be 'auto' or 'always'")
        if self.loss_agg_mode not in ("token-mean", "seq-mean-token-mean"):
            raise ConfigError(
                "trainer.loss_agg_mode",
                self.loss_agg_mode,
                "must be 'token-mean' or 'seq-mean-token-mean'",
            )
        return self

    def capture_refusal(self) -> str | None:
        """Why this loss cannot be captured per row (``capture``; None: it can)."""
        if self.loss_agg_mode != "token-mean":
            return f"trainer.loss_agg_mode={self.loss_agg_mode!r} (only 'token-mean' is per row)"
        return None

    @property
    def forward_rows(self) -> int:
        """Rows per forward of the no-grad log-prob passes."""
        return self.logprob_micro_batch_size or 4 * self.micro_batch_size


@dataclass
class CriticConfig:
    """Value models as adapters on the shared base (roll/multi_agent/critics.py): each is its
    own LoRA adapter + a scalar value head, trained on the clipped value loss after the agents'
    update. Needed by advantage.estimator gae, ippo, mappo, happo and vdn; refused with the
    others."""

    mode: str = "none"
    """'none'; 'per_agent': one critic per trained agent (``critic_<agent>``), each fitting its
    own agent's rows (IPPO); 'shared': one centralised critic (``critic``) fitting every
    agent's rows (MAPPO)."""
    input: str = "local"
    """What a critic reads before each response: 'local', the acting agent's own prompt;
    'global', that prompt plus every seat's observation (the state as the whole table knows
    it, hidden cards included: roll/agentic/env/base.py ``global_view``), the centralised
    critic of MAPPO. The agents' prompts are the same either way."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Every critic's LoRA shape."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Every critic's optimizer (its own AdamW, clipping and schedule)."""
    value_clip: float | None = 0.2
    """A value moves at most this far from its value at rollout time to gain on the loss;
    null: plain squared error."""
    micro_batch_size: int | None = None
    """Rows of one critic per forward/backward; gradients accumulate over its micro-batches.
    null: the trainer's ``trainer.micro_batch_size``. (The critics' no-grad value pass runs in
    forwards of the trainer's ``logprob_micro_batch_size`` rows, as the log-prob passes do.)"""

    def validate(self, model_modules: set[str] | None = None) -> CriticConfig:
        """Each field on its own (whether the estimator needs critics is the pipeline's
        check); the LoRA shape and optimizer only where critics exist."""
        if self.mode not in CRITIC_MODES:
            raise ConfigError("critic.mode", self.mode, f"must be one of {CRITIC_MODES}")
        if self.input not in CRITIC_INPUTS:
            raise ConfigError("critic.input", self.input, f"must be one of {CRITIC_INPUTS}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ConfigError("critic.value_clip", self.value_clip, "must be > 0 or null")
        if self.micro_batch_size is not None and (
            not isinstance(self.micro_batch_size, int) or isinstance(self.micro_batch_size, bool)
            or self.micro_batch_size < 1
        ):
            raise ConfigError("critic.micro_batch_size", self.micro_batch_size,
                              "must be an integer >= 1 or null (the trainer's)")
        if self.mode == "none":
            if self.input != "local":
                raise ConfigError("critic.input", self.input,
                                  "there are no critics to read it (critic.mode='none')")
            return self
        self.lora.validate("critic.lora", model_modules)
        self.optim.validate("critic.optim")
        if self.optim.target_kl:
            raise ConfigError("critic.optim.target_kl", self.optim.target_kl,
                              "steers a policy's rate by its KL; a critic has no policy (0)")
        return self
