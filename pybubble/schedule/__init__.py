"""Scheduling the encoder's tasks into the bubbles: the core's scheduler and the schedule format,
the independent validator, online rescheduling, microbatch balancing (the scheduler's pure-Python twin
and the exact optimum are test oracles: :mod:`pybubble.testing`)."""
