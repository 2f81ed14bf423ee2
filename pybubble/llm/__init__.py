"""The LLM's 3D-parallel step: pipeline action tables, the simulated timeline with its bubbles,
and the step of a config derived once."""
