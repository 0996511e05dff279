"""Agentic RL: environments (``env/``) and the episode loop that drives them (``rollout/``)."""
