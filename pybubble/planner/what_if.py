"""What pybubble would gain on a measured step, before adopting it: the op factors fitted to the
trace (:func:`pybubble.measure.fit.fit_step`) make the cost model reproduce the measured ops, sends
and bubbles; the config planned on that model gives the step of the trace's own layout (checked
against the measured one) and pybubble's step, with the share of the encoder's compute it hides in
those bubbles. Times are microseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..config.schema import Config
from ..llm.step import cost_model
from ..measure.bubbles import measure
from ..measure.fit import Fit, fit_step, read_step
from .report import PlanReport, plan


@dataclass(kw_only=True, slots=True)
class WhatIf:
    """A measured step beside the plans of its config at the fitted op factors."""

    fit: Fit
    """The op factors fitted to the trace."""
    report: PlanReport
    """The config planned with them."""
    measured_step: float
    """The measured pipeline step: from the first op's, encoder piece's or data-parallel collective's
    start to the last one's end over all ranks."""
    measured_idle: float | None
    """Idle time measured in the trace, summed over ranks (:func:`pybubble.measure.bubbles.measure`;
    None for the simulator's traces)."""
    layout: str
    """The trace's own layout: ``megatron`` when its encoder ran inside stage 0's ops (or was not
    annotated), else ``pybubble`` (its pieces outside the ops: pybubble's runtime)."""

    @property
    def predicted_step(self) -> float:
        """The step of the trace's own layout at the fitted factors."""
        r = self.report
        return r.baselines["megatron"].step_time if self.layout == "megatron" else r.step_time

    @property
    def pybubble_step(self) -> float:
        """pybubble's step at the fitted factors."""
        return self.report.step_time

    @property
    def hidden_fraction(self) -> float:
        """Share of the config's encoder compute pybubble puts into the bubbles (0 when its plan is a
        Megatron-LM layout)."""
        return self.report.hidden_fraction or 0.0


def what_if(source: str | os.PathLike[str], config: Config, *, workers: int = 2) -> WhatIf:
    """The what-if of `config`'s encoder on the step measured in `source` (a trace folder or file;
    see the module docstring). ValueError when the trace does not match the config."""
    ranks = read_step(source)
    fit = fit_step(config, ranks)
    costs = cost_model(config)
    costs.op_factors = dict(fit.factors)
    report = plan(config, workers=workers, costs=costs)
    spread = any(r.encoder for r in ranks.values()) and not any(r.encoder_in_ops for r in ranks.values())
    idle = None if any(r.simulated for r in ranks.values()) else sum(r.idle for r in measure(source))
    return WhatIf(fit=fit, report=report, measured_idle=idle, layout="pybubble" if spread else "megatron",
                  measured_step=max(r.end for r in ranks.values()) - min(r.start for r in ranks.values()))


__all__ = ["WhatIf", "what_if"]
