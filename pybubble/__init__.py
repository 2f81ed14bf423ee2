"""pybubble: fill the bubbles of a 3D-parallel LLM training step with the modality encoder's work."""

from . import presets
from .balance import balance_microbatches
from .config import load_config
from .decompose import Kernel, decompose_layer
from .online import OnlineScheduler, replay
from .problem import Problem, load_problem
from .report import PlanReport, plan
from .scheduler import Schedule, load_schedule, schedule
from .timeline import Timeline, simulate_pipeline
from .validator import validate

__all__ = [
    "Kernel",
    "OnlineScheduler",
    "PlanReport",
    "Problem",
    "Schedule",
    "Timeline",
    "balance_microbatches",
    "decompose_layer",
    "load_config",
    "load_problem",
    "load_schedule",
    "plan",
    "presets",
    "replay",
    "schedule",
    "simulate_pipeline",
    "validate",
]
__version__ = "0.1.0"
