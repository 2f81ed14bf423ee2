"""The bubble-filling problem (``pybubble.problem/1``): lanes with free windows, the LLM
microbatches' dependency points and the encoder's kernel tasks; its typed arrays, the encoder's
plan and tasks, and generated problems."""
