// The largest input the core accepts, in one place. Each limit keeps what passes well inside the
// memory of a 24 GB machine (a problem, table or simulated step at its limits needs at most about
// 3 GB in the core) and every sum of times finite. The core checks them with errors naming the
// field; the bindings check array lengths before copying; Python reads them as _core.LIMITS.
#pragma once

#include <cstdint>

namespace pybubble {

/// Every count limit, once: X(constant, name in _core.LIMITS, value, what it bounds).
#define PYBUBBLE_COUNT_LIMITS(X)                                                                         \
  X(kMaxTasks, "tasks", 5'000'000, "tasks in a problem (about 250 B each in the core and the scheduler)") \
  X(kMaxPredecessors, "predecessors", 20'000'000, "entries of all the tasks' after lists (24 B each)")     \
  X(kMaxWindows, "windows", 10'000'000, "free windows of one resource over all lanes (about 56 B each)")   \
  X(kMaxLanes, "lanes", 100'000, "lanes of a problem")                                                    \
  X(kMaxMicrobatches, "microbatches", 1'000'000, "microbatches of a problem, a table or a generated step") \
  X(kMaxActions, "actions", 4'000'000, "actions of a table (about 150 B each with their bubbles)")         \
  X(kMaxTpGaps, "tp_gaps", 20'000'000, "TP collectives of a simulated step: ops x tp_count (about 55 B each)") \
  X(kMaxStages, "stages", 1'000'000, "pipeline ranks of a table or a generated step")                      \
  X(kMaxChunks, "chunks", 10'000, "model chunks per pipeline rank")                                       \
  X(kMaxSamples, "samples", 1'000'000, "samples to balance into microbatches")                            \
  X(kMaxReplicas, "replicas", 1'000'000, "data-parallel replicas balanced or rescheduled at once")           \
  X(kMaxReplicaTasks, "replica_tasks", 100'000'000, "replicas x tasks of one rescheduling of many replicas (8 B each)")

#define PYBUBBLE_DECLARE_LIMIT(constant, name, value, what) constexpr int64_t constant = value;
PYBUBBLE_COUNT_LIMITS(PYBUBBLE_DECLARE_LIMIT)
#undef PYBUBBLE_DECLARE_LIMIT

/// The largest time or duration (us, about 11.6 days) in any input: horizons, windows, deadlines,
/// task durations and the simulator's costs. With the count limits every sum of times stays below
/// 1e19 us, finite and far from overflow.
constexpr double kMaxTime = 1e12;

}  // namespace pybubble
