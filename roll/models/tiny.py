"""A tiny offline Qwen3-architecture model for tests and the CPU default job.

No weights can be downloaded here, so we build one: a Qwen3 config with random weights and a
byte-level BPE tokenizer trained in about a second with the `tokenizers` library, saved with
``save_pretrained`` so that every loader (ours, PEFT, vLLM) reads it like any hub model.
head_dim is at least 32 because vLLM's CPU attention rejects 16.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from roll.models.cache import atomic_folder, build_lock, cache_root

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# Tags models use in their answers: one token each, as in Qwen3's vocabulary.
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Text the tokenizer learns merges from: words of game prompts and plain English, so that
# prompts tokenise into fewer, word-like pieces. Any byte sequence still encodes (byte-level).
_CORPUS_LINES = [
    "You are player 0 in a game of Tic-Tac-Toe. The board is shown below.",
    "Legal moves: x(0,0) x(0,1) x(1,1) o(2,2). Answer with one legal move.",
    "Put your final answer inside <answer> and </answer>. Think inside <think> </think>.",
    "Kuhn poker: each player antes one chip. Actions: Pass Bet. Card: Jack Queen King.",
    "Leduc poker: the deck has six cards. Raise Call Fold Check. Round one, round two.",
    "Connect Four: drop a piece in a column. Columns 0 1 2 3 4 5 6. Four in a row wins.",
    "Hanabi: play cards in order of rank for each color. Hints: reveal color, reveal rank.",
    "Life tokens, information tokens, fireworks, discard pile, deck size, your hand.",
    "Play card 0. Discard card 1. Reveal player +1 color R. Reveal player +1 rank 2.",
    "The generator writes a solution; the critic checks it; the refiner fixes mistakes.",
    "What is 12 + 30? The answer is 42. Compute the sum, the product and the difference.",
    "player agent seat turn reward win lose draw score board row column cell empty",
    "one two three four five six seven eight nine ten zero yes no true false",
]


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; the cache is reused only when the spec matches."""

    vocab_size: int = 1024
    """Tokenizer vocabulary size (BPE merges + 256 bytes + special tokens)."""
    hidden_size: int = 64
    """Width of the residual stream."""
    intermediate_size: int = 128
    """Width of the MLP."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 2
    """Query heads."""
    num_key_value_heads: int = 1
    """Key/value heads (grouped-query attention)."""
    head_dim: int = 32
    """Per-head width; >= 32 for vLLM's CPU attention."""
    max_position_embeddings: int = 4096
    """Longest context in tokens."""
    seed: int = 0
    """Seed for the random weights."""
    embedding_std: float | None = None
    """Standard deviation of the (tied) token embeddings; None keeps the initializer's 0.02.
    LoRA trains neither them nor the final norm, so they bound how far apart two answer
    tokens' logits can get: at 0.02 no legal move of a Kuhn answer can get a probability
    outside [0.12, 0.88], too narrow for the game's equilibrium; the ``tiny-wide`` alias
    draws them at 0.1 (benchmarks/README.md, "The step size in policy space")."""
    embedding_rows: int | None = None
    """Rows of the (tied) embedding and LM head; None: one per token of the tokenizer. Real
    models pad theirs (Qwen3: 151,936 rows for 151,669 tokens); a shape whose vocabulary is
    narrower than its hidden size also breaks vLLM 0.26's LoRA warm-up on a GPU."""
    format_version: int = 2
    """Bumped when the builder changes what it writes."""


def default_cache_dir() -> Path:
    """Where the tiny model lives unless told otherwise: $ROLL_CACHE or ~/.cache/roll."""
    return cache_root() / "tiny-qwen3"


WIDE_EMBEDDING_STD = 0.1
"""Embedding scale of the ``tiny-wide`` alias."""


def build_tiny_wide_model() -> Path:
    """The tiny model with embeddings of std 0.1 (``model.path=tiny-wide``): the same shape,
    but LoRA can push a legal move's probability close to 0 or 1, which equilibrium play in
    the poker games needs (the CPU model of the nash recipes)."""
    return build_tiny_model(cache_root() / "tiny-qwen3-wide",
                            TinyModelSpec(embedding_std=WIDE_EMBEDDING_STD))


def _train_tokenizer(vocab_size: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS_LINES * 4, trainer=trainer)
    # Like Qwen3's <think>: one token each, but not "special", so decoding with
    # skip_special_tokens keeps them and answers stay parseable.
    tokenizer.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def _is_complete(path: Path, spec: TinyModelSpec) -> bool:
    marker = path / "roll_tiny_spec.json"
    if not marker.is_file():
        return False
    return json.loads(marker.read_text()) == _record(spec)


def _record(spec: TinyModelSpec) -> dict:
    """What the marker holds: the spec, without ``embedding_rows`` when it is the default
    (so folders built before the field existed stay valid)."""
    record = asdict(spec)
    if record["embedding_rows"] is None:
        del record["embedding_rows"]
    return record


def build_tiny_model(
    path: str | os.PathLike | None = None, spec: TinyModelSpec | None = None
) -> Path:
    """Build (or reuse) a tiny Qwen3 model + tokenizer folder and return its path.

    The folder is written to a temporary sibling and renamed into place, so a crash never
    leaves a half-written model that a later call would take as complete.
    """
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    spec = spec or TinyModelSpec()
    path = Path(path) if path is not None else default_cache_dir()
    if _is_complete(path, spec):
        return path
    with build_lock(path):
        if _is_complete(path, spec):  # another process built it meanwhile
            return path
        tokenizer = _train_tokenizer(spec.vocab_size)
        config = Qwen3Config(
            vocab_size=spec.embedding_rows or len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            head_dim=spec.head_dim,
            max_position_embeddings=spec.max_position_embeddings,
            tie_word_embeddings=True,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            if spec.embedding_std is not None:
                with torch.no_grad():
                    model.get_input_embeddings().weight.normal_(0.0, spec.embedding_std)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id

        with atomic_folder(path) as staging:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / "roll_tiny_spec.json").write_text(json.dumps(_record(spec), indent=2))
    return path
