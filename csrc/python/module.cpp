#include "register.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "pybubble's C++ core: pipeline simulation, problem checking, bubble scheduling, validation.";
  register_problem(m);
  register_scheduler(m);
  register_replicas(m);
  register_validate(m);
  register_synthetic(m);
  register_pipeline(m);
  register_balance(m);
  register_limits(m);
}
