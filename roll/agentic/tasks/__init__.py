"""Team tasks: roles that take turns on a shared history and share a reward (base.py has the
protocol). Tasks: ``math_team`` (generator → critic → refiner), ``writing_team`` (two writers,
one joint reward: MAGRPO), ``debate`` and ``majority_vote``; by name in ``registry``. Datasets
and the seeded item order in ``datasets``; math answers checked in ``math_check``."""
