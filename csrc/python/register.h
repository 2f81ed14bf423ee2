// One registration function per area of the core; module.cpp calls them all.
#pragma once

#include <pybind11/pybind11.h>

void register_problem(pybind11::module_& m);
void register_scheduler(pybind11::module_& m);
void register_validate(pybind11::module_& m);
void register_synthetic(pybind11::module_& m);
void register_pipeline(pybind11::module_& m);
void register_balance(pybind11::module_& m);
void register_limits(pybind11::module_& m);
void register_replicas(pybind11::module_& m);
