"""Where the trainer runs: in this process (``local``) or as data-parallel Ray actors (``ray``).

The pipeline drives one small interface, ``TrainGroup`` (train_group.py), whichever backend
holds the ranks; ``build_train_group`` picks the backend from ``cluster.backend``. Ray ranks
train with the torch strategy (gradient all-reduce, per-agent AdamW on every rank) or the
DeepSpeed ZeRO-2 one (deepspeed_strategy.py). Ray and DeepSpeed are imported only where used.
"""

from roll.distributed.roles import LocalTrainGroup, TrainGroup, TrainSpec
from roll.errors import RoleFailed

__all__ = ["LocalTrainGroup", "RoleFailed", "TrainGroup", "TrainSpec"]
