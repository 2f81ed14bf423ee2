"""The runtime's planning, without torch: from the costs measured in the running steps
(:mod:`~pybubble.placement.measured`) to each step's placement of the encoder's pieces over the
pipeline's ranks and its predicted time (:mod:`~pybubble.placement.step_placement`), the step of data-parallel
replicas that wait for each other (:mod:`~pybubble.placement.marks`), one rank's part as data
(:mod:`~pybubble.placement.plan`), and what each step saw (:mod:`~pybubble.placement.records`).
:mod:`pybubble.runtime` runs it on torch; these modules import no torch, so plans, records and
reports are read and made where torch is not installed."""
