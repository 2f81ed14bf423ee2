// The validator: checks a schedule against its problem, independently of the scheduler.
#pragma once

#include <string>
#include <vector>

#include "pybubble/problem.h"
#include "pybubble/scheduler.h"

namespace pybubble {

/// Slack allowed in every time comparison (us): one picosecond, far below any kernel and far
/// above the rounding of times up to 1e9 us...
constexpr double kTimeTolerance = 1e-6;
/// ...plus this share of the problem's horizon and total task duration (the furthest from 0 that a
/// schedule without idle gaps reaches), for its rounding. Taken from the problem, never from the
/// schedule under test.
constexpr double kRelativeTolerance = 1e-12;

/// Checks `s` against `p` by the rules of pybubble.schedule/1 and returns every violation as a
/// readable sentence; an empty list means the schedule is valid. Throws std::invalid_argument when
/// the schedule's arrays do not match the problem's sizes (a malformed schedule, not an invalid one).
std::vector<std::string> validate(const Problem& p, const Schedule& s);

}  // namespace pybubble
