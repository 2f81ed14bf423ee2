#include "pybubble/replicas.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <stdexcept>
#include <thread>

#include "pybubble/checks.h"
#include "pybubble/message.h"
#include "pybubble/twins.h"

namespace pybubble {

Schedule ReplicaSchedules::schedule(int64_t k) const {
  if (k < 0 || k >= replicas) {
    throw std::invalid_argument("replica: " + format_number(k) + " is not in [0, " + format_number(replicas) + ")");
  }
  Schedule s;
  const double* row = start.data() + static_cast<size_t>(k) * static_cast<size_t>(tasks);
  s.start.resize(static_cast<size_t>(tasks) * static_cast<size_t>(copies));
  for (size_t t = 0; t < s.start.size(); ++t) s.start[t] = row[t / static_cast<size_t>(copies)];
  const auto a = assignment.begin() + static_cast<int64_t>(k) * microbatches;
  s.assignment.assign(a, a + microbatches);
  s.step_time = step_time[static_cast<size_t>(k)];
  s.shift_front = shift_front[static_cast<size_t>(k)];
  s.shift_back = shift_back[static_cast<size_t>(k)];
  return s;
}

ReplicaScheduler::ReplicaScheduler(const Problem& problem, int32_t threads, Policy policy, bool fixed_assignment)
    : problem_(problem), threads_(threads), policy_(policy), fixed_(fixed_assignment), target_(&problem) {
  if (threads < 1) throw std::invalid_argument("threads: " + format_number(threads) + " is not >= 1");
  copies_ = twin_copies(problem);
  if (copies_ > 1) {
    folded_ = std::make_unique<Problem>(fold_copies(problem, copies_));
    target_ = folded_.get();
  }
  const Problem& p = *target_;
  longest_.assign(static_cast<size_t>(p.num_microbatches()), 0.0);
  for (int32_t t = 0; t < p.num_tasks(); ++t) {
    double& top = longest_[static_cast<size_t>(p.microbatch(t))];
    top = std::max(top, p.duration(t));
    if (t == 0 || p.microbatch(t) != p.microbatch(t - 1)) spans_.push_back({t, t, p.microbatch(t)});
    ++spans_.back().end;
  }
  for (int32_t i = 0; i < threads; ++i) {
    schedulers_.push_back(std::make_unique<Scheduler>(p));
    durations_.emplace_back(static_cast<size_t>(p.num_tasks()));
  }
}

ReplicaScheduler::~ReplicaScheduler() = default;

void ReplicaScheduler::run_part(int32_t part, const double* scale, ReplicaSchedules& out) {
  const Problem& p = *target_;
  const int32_t n = p.num_tasks(), m = p.num_microbatches();
  const double* base = p.fields().duration.data();
  std::vector<double>& d = durations_[static_cast<size_t>(part)];
  Scheduler& sched = *schedulers_[static_cast<size_t>(part)];
  for (int64_t k = part; k < out.replicas; k += threads_) {
    const auto t0 = std::chrono::steady_clock::now();
    const double* row = scale + k * m;
    for (const Span& span : spans_) {
      const double f = row[span.microbatch];
      for (int32_t t = span.begin; t < span.end; ++t) d[static_cast<size_t>(t)] = base[t] * f;
    }
    // The durations are checked through `scale` (run); the starts go straight into the row.
    sched.place(policy_, d.data(), fixed_, out.start.data() + k * n);
    const Schedule& s = sched.out_;
    std::copy(s.assignment.begin(), s.assignment.end(), out.assignment.begin() + k * m);
    out.step_time[static_cast<size_t>(k)] = s.step_time;
    out.shift_front[static_cast<size_t>(k)] = s.shift_front;
    out.shift_back[static_cast<size_t>(k)] = s.shift_back;
    out.seconds[static_cast<size_t>(k)] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

void ReplicaScheduler::run(const double* scale, int64_t replicas, ReplicaSchedules& out) {
  const Problem& p = *target_;
  const int32_t m = p.num_microbatches();
  if (replicas < 0) throw std::invalid_argument("scale: " + format_number(replicas) + " rows");
  check_count(replicas * std::max<int64_t>(p.num_tasks(), 1), kMaxReplicaTasks, "replica_tasks",
              "scale: its rows x the problem's tasks (" + format_number(p.num_tasks()) + ")");
  for (int64_t k = 0; k < replicas; ++k) {
    for (int32_t j = 0; j < m; ++j) {
      const double v = scale[k * m + j];
      const auto where = [&] { return "scale[" + format_number(k) + ", " + format_number(j) + "]"; };
      if (!std::isfinite(v) || v < 0.0) throw std::invalid_argument(where() + ": " + format_number(v) + " is not a finite number >= 0");
      if (longest_[static_cast<size_t>(j)] * v > kMaxTime) {
        throw std::invalid_argument(where() + ": " + format_number(v) + " makes a task of encoder microbatch " +
                                    format_number(j) + " last " + format_number(longest_[static_cast<size_t>(j)] * v) +
                                    " us, which " + kAboveMaxTime);
      }
    }
  }
  out.replicas = replicas;
  out.copies = copies_;
  out.tasks = p.num_tasks();
  out.microbatches = m;
  out.start.resize(static_cast<size_t>(replicas) * static_cast<size_t>(p.num_tasks()));
  out.assignment.resize(static_cast<size_t>(replicas) * static_cast<size_t>(m));
  for (auto* v : {&out.step_time, &out.shift_front, &out.shift_back, &out.seconds}) v->resize(static_cast<size_t>(replicas));

  // Thread 0 is the calling thread (it alone polls for cancellation); an error in one part stops
  // none of the others, and the first part's error is thrown once all have ended.
  const int32_t parts = static_cast<int32_t>(std::min<int64_t>(threads_, std::max<int64_t>(replicas, 1)));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(parts));
  std::vector<std::thread> workers;
  for (int32_t part = 1; part < parts; ++part) {
    workers.emplace_back([this, part, scale, &out, &errors] {
      try {
        run_part(part, scale, out);
      } catch (...) {
        errors[static_cast<size_t>(part)] = std::current_exception();
      }
    });
  }
  try {
    run_part(0, scale, out);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (std::thread& w : workers) w.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace pybubble
