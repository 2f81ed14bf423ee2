"""Runnable examples (``python -m pybubble.examples.mllm``)."""
