"""pybubble: fill the bubbles of a 3D-parallel LLM training step with the modality encoder's work."""

from .balance import balance_microbatches
from .online import OnlineScheduler
from .problem import Problem, load_problem
from .scheduler import Schedule, load_schedule, schedule
from .timeline import Timeline, simulate_pipeline
from .validator import validate

__all__ = [
    "OnlineScheduler",
    "balance_microbatches",
    "Problem",
    "Schedule",
    "Timeline",
    "load_problem",
    "load_schedule",
    "schedule",
    "simulate_pipeline",
    "validate",
]
__version__ = "0.1.0"
