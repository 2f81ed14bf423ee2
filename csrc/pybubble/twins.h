// Twin lanes: a problem whose lanes come in groups that are exact copies of each other: the same
// free windows, the same kernels, each kernel depending only on its own copy's (encoder pipelines
// that share every microbatch evenly with their stages on the same LLM ranks: the Optimus plan's 8
// per LLM stage). The scheduler places every copy alike, so one copy's problem, scheduled once,
// gives the schedule of all of them.
#pragma once

#include <cstdint>

#include "pybubble/problem.h"

namespace pybubble {

/// Whether `problem` is `copies` copies of one problem, task by task: task t is copy t % copies
/// of task t / copies of that problem, where for every group of `copies` consecutive ids
/// (r = copies * g, the group's first):
///   - every task of the group has r's microbatch, phase, resource and duration;
///   - task r + i's k-th predecessor is r's k-th predecessor plus i, which is a group's first;
///   - task r + i's lane is the i-th lane of the twins of r's lane, one list of `copies`
///     different lanes per lane of a group's first (the same in every group, no lane in two
///     lists or twice in one), each with exactly the free windows (compute and link) of r's lane.
/// Then the scheduler (Scheduler::run, any policy and assignment, any durations that keep each
/// group's durations equal, such as a scale per microbatch) gives every task of a group the start
/// of the group's first: each step of it handles a group's tasks one after the other, each on its
/// own lane with the same inputs. copies 1 always holds; `copies` < 1 is std::invalid_argument.
bool has_copies(const Problem& problem, int32_t copies);

/// The largest `copies` for which has_copies holds (1 when there is no twin: then no fold).
int32_t twin_copies(const Problem& problem);

/// The problem of one copy when has_copies(problem, copies): task g is task copies * g with its
/// predecessors divided by `copies`, its lane the index of its lane among the lanes of the
/// groups' first tasks (in increasing order), each with that lane's windows; the same horizon and
/// microbatch deadlines. Throws std::invalid_argument when has_copies does not hold.
ProblemInput fold_copies(const Problem& problem, int32_t copies);

/// `problem` made `copies` times over, the inverse of fold_copies: lane l becomes lanes
/// copies * l + i (i < copies), each with l's windows; task t becomes tasks copies * t + i, on
/// lane copies * lane(t) + i, each depending on its own copy's. `copies` >= 1 and the counts within
/// the limits (limits.h), else std::invalid_argument.
ProblemInput with_copies(const ProblemInput& problem, int32_t copies);

}  // namespace pybubble
