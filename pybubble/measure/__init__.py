"""Measured bubbles: idle time per rank read from the ``torch.profiler`` traces of a real pipeline
run, beside the predicted step (no torch needed)."""
