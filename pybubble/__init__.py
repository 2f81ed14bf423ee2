"""pybubble: fill the bubbles of a 3D-parallel LLM training step with the modality encoder's work.

The package follows the data flow, one folder per stage, each importing only from the ones before
it: ``config`` (YAML -> checked dataclasses, presets, documents, checks) -> ``costs`` (kernels, cost
model, calibration, memory) -> ``llm`` (action tables, the simulated step and its bubbles) ->
``problem`` (lanes, windows, encoder tasks) -> ``schedule`` (scheduler, validator, online,
balancing) -> ``data`` (workloads, the open-VLM mix, data files) -> ``viz`` (traces, Gantt charts)
-> ``measure`` (profiler traces) -> ``planner`` (search, layouts, report, dynamic data, modality
model) -> ``testing`` (the tests' oracles) -> ``runtime`` (torch hooks; needs torch). The names below are the
public API.
"""

from ._moved import install as _install_moved_modules
from ._native import require_core

_install_moved_modules()
require_core()

from .config import presets  # noqa: E402  (after the check: every module below needs the core)
from .config.schema import Config, load_config  # noqa: E402
from .costs.kernels import Kernel, decompose_layer  # noqa: E402
from .llm.step import LLMStep  # noqa: E402
from .llm.tables import Action  # noqa: E402
from .llm.timeline import Timeline, Windows, simulate_pipeline  # noqa: E402
from .planner.report import PlanReport, plan  # noqa: E402
from .problem.arrays import ProblemArrays, Tasks  # noqa: E402
from .problem.problem import Problem, load_problem  # noqa: E402
from .schedule.balance import balance_microbatches  # noqa: E402
from .schedule.online import OnlineScheduler, replay  # noqa: E402
from .schedule.scheduler import Schedule, load_schedule, schedule_problem  # noqa: E402
from .schedule.validator import validate  # noqa: E402
from .viz.gantt import save_gantt  # noqa: E402
from .viz.chrome_trace import save_trace  # noqa: E402

__all__ = [
    "Action",
    "Config",
    "Kernel",
    "LLMStep",
    "OnlineScheduler",
    "PlanReport",
    "Problem",
    "ProblemArrays",
    "Schedule",
    "Tasks",
    "Timeline",
    "Windows",
    "balance_microbatches",
    "decompose_layer",
    "load_config",
    "load_problem",
    "load_schedule",
    "plan",
    "presets",
    "replay",
    "save_gantt",
    "save_trace",
    "schedule_problem",
    "simulate_pipeline",
    "validate",
]
__version__ = "0.1.0"
