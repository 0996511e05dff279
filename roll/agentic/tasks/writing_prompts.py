"""Built-in writing prompts (no download) for the writing team: a topic and an angle each."""

from __future__ import annotations

import random

TOPICS = (
    "urban beekeeping", "solar-powered water pumps", "rooftop gardens", "bicycle lanes",
    "community libraries", "tidal energy", "school lunch programs", "coral reef restoration",
    "night trains", "composting at home", "open-source software in schools", "wind farms",
    "public drinking fountains", "seed banks", "car-free city centres", "recycling electronics",
)
ANGLES = (
    "a short proposal for a city council",
    "a one-paragraph research abstract",
    "a note for a neighbourhood newsletter",
)


def writing_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` prompts (topics x angles, cycled in a seeded order; the same for a seed)."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count={count!r}: must be an integer >= 1")
    pairs = [(topic, angle) for topic in TOPICS for angle in ANGLES]
    random.Random(seed).shuffle(pairs)
    return [f"Topic: {topic}. Format: {angle}." for topic, angle in
            (pairs[i % len(pairs)] for i in range(count))]
