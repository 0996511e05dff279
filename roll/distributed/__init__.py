"""Where the roles run: in this process (``local``) or as Ray actors (``ray``).

- ``roles.py``: the train role as the pipeline sees it (``TrainGroup``, ``TrainSpec``,
  ``LocalTrainGroup``) and how adapters travel to the engines (``push_adapters``).
- ``ray_train.py``: data-parallel train ranks, with the torch strategy (gradient all-reduce,
  per-agent AdamW on every rank) or DeepSpeed ZeRO-2/3 (``deepspeed_strategy.py``).
- ``ray_infer.py``: engine actors; ``ray_env.py``: env workers; ``ray_actors.py``: what they share.

The pipeline's builders (roll/pipeline/builders.py) pick the backend from ``cluster.backend``.
Ray and DeepSpeed are imported only where used. This package's top level imports nothing: an
env worker (``ray_env.py``) loads its module without torch or the learning side.
"""
