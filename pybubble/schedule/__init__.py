"""Scheduling the encoder's tasks into the bubbles: the core's scheduler and the schedule format,
the independent validator, the pure-Python reference, online rescheduling, microbatch balancing."""
