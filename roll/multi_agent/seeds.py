"""Each agent's random streams, as functions of (run seed, agent name, the agent's own step)
only: an agent draws the same numbers (adapter init, dropout masks, mini-batch shuffles) alone
or in any team (DESIGN.md invariant 1)."""

from __future__ import annotations

import hashlib
import zlib


def adapter_init_seed(seed: int, agent_name: str) -> int:
    """Seed of one agent's adapter init: depends on the run seed and the agent's name only,
    so agent 'b' starts from the same weights alone or in any team."""
    return (seed * 1_000_003 + zlib.crc32(agent_name.encode())) % (2**31)


def agent_stream_seed(seed: int, agent_name: str, optimizer_step: int, stream: str) -> int:
    """Seed of one of an agent's random streams ('dropout', 'shuffle') at one of its optimizer
    steps: a function of (run seed, agent name, the agent's own step) only, so the agent draws
    the same numbers alone or in any team."""
    digest = hashlib.sha256(f"{seed}/{agent_name}/{optimizer_step}/{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
