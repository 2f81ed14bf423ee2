"""Oracles for pybubble's own tests and benchmarks, not an API to build on: the scheduler's plain-Python
twin (:mod:`~pybubble.testing.reference`, what the differential tests and the speed ratios compare the
C++ core with) and the exact optimum of a problem (:mod:`~pybubble.testing.exact`, CP-SAT; needs
OR-Tools, a test dependency). Installed with the package so that the tests and ``bench/`` reach them
by name, as ``torch.testing`` serves torch's."""
