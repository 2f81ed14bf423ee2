"""pybubble's own test and benchmark tools, not an API to build on: the scheduler's plain-Python twin
(:mod:`~pybubble.testing.reference`, what the differential tests and the speed ratios compare the C++
core with), the exact optimum of a problem (:mod:`~pybubble.testing.exact`, CP-SAT; needs OR-Tools, a
test dependency) and the test trainer (:mod:`pybubble.testing.mllm`: a small multimodal LLM trained
with the runtime in each mode, which the tests and ``bench/`` launch). Installed with the package so
that the tests and ``bench/`` reach them by name, as ``torch.testing`` serves torch's."""
