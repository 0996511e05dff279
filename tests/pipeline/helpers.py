"""Checks shared by the pipeline tests in one process and on Ray ranks."""

from __future__ import annotations

import torch


def moved_iff_gradient(pipeline, start: dict, metrics: dict) -> dict[str, bool]:
    """After ``pipeline.run()``: which agents that had rows moved from their ``start`` adapters
    (``{agent: export_adapter(agent)}`` taken before the run); asserts that some agent trained
    and that an agent moved iff its gradient was non-zero."""
    trained = [name for name in pipeline.agent_names if f"{name}/num_rows" in metrics]
    assert trained
    moved = {name: any(not torch.equal(tensor, start[name][key])
                       for key, tensor in pipeline.model.export_adapter(name).items())
             for name in trained}
    for name in trained:
        assert moved[name] == (metrics[f"{name}/grad_norm"] > 0), name
    return moved
