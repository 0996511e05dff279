"""Inductor compiles in this process, not in its pool of compile workers.

Why: with its worker pool (the default when a process sees several cores), torch 2.11's
Inductor quiesces the pool after a minute without compiles and starts it again on the next
one; that cycle can hang for good (pytorch/pytorch issues 176968 and 186136, a fix still open in
2026-05). A run then stops silently at the first recompile after an idle minute: on an H100,
four learning runs side by side each stopped at step 3–9, for 20 minutes, with the hf engine's
compiled decode on, and ran on with it off (benchmarks/README.md, "A silent stall"). One compile
thread skips the pool entirely; compiles take longer the first time, and nothing else changes.
A user who sets ``TORCHINDUCTOR_COMPILE_THREADS`` keeps their setting.
"""

from __future__ import annotations

import os


def compile_in_process() -> bool:
    """Make Inductor compile in this process (one compile thread) unless the user chose the
    number of compile threads; True when this call set it."""
    if "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
        return False
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    return True
