"""Episode loop and scheduler: many envs in flight, turns batched continuously across agents.

- ``episode.py``: one episode's env side (env, opponents, prompts, parsing), torch-free: what an
  env worker runs (roll/distributed/ray_env.py);
- ``scheduler.py``: ``RolloutScheduler`` and ``RolloutConfig``, the loop over the engine;
- ``results.py``: ``EpisodeResult``, ``RolloutResult``, ``Turn`` and the batch they become.

This package's top level imports nothing, so that an env worker needs no torch.
"""
