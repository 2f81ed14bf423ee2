"""The data that trains a multimodal LLM, as pybubble's planner, command line, runtime example and
benchmarks draw it: synthetic token workloads (:mod:`~pybubble.data.workloads`), samples as tiles
(:mod:`~pybubble.data.samples`), an open VLM's mix (:mod:`~pybubble.data.mix`) and a user's data
files (:mod:`~pybubble.data.files`)."""
