"""Team tasks (issue 12, in progress): roles that take turns on a shared history and share a
reward. So far: answer checking for math (``math_check``) and built-in offline problem sets
(``problems``); the task protocol and the team examples come next."""
