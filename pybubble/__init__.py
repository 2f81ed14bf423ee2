"""pybubble: fill the bubbles of a 3D-parallel LLM training step with the modality encoder's work."""

from . import presets
from .decompose import Kernel, decompose_layer
from .problem import Problem, load_problem
from .scheduler import Schedule, load_schedule, schedule
from .validator import validate

__all__ = [
    "Kernel",
    "Problem",
    "Schedule",
    "decompose_layer",
    "load_problem",
    "load_schedule",
    "presets",
    "schedule",
    "validate",
]
__version__ = "0.1.0"
