"""The idle worker, the CPU's side stream: order, errors, priority, the interpreter's switch
interval, and the filler's tasks on it settled before the main thread runs one."""

import os
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from pybubble.runtime import BubbleFiller, FillTask, PipelineWaits, IdleWorker  # noqa: E402


@pytest.fixture
def worker():
    w = IdleWorker()
    yield w
    w.close()


def test_runs_in_launch_order_on_its_own_thread_and_drains(worker):
    seen, threads = [], set()
    for i in range(50):
        worker.launch(lambda i=i: (seen.append(i), threads.add(threading.get_ident())), what=i)
    worker.drain()
    assert seen == list(range(50)) and not worker.busy
    assert threads == {worker._thread.ident} != {threading.get_ident()}


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_runs_at_idle_priority_on_linux(worker):
    assert worker.policy == "SCHED_IDLE"
    policy = []
    worker.launch(lambda: policy.append(os.sched_getscheduler(0)))
    worker.drain()
    assert policy == [os.SCHED_IDLE]


def test_switch_interval_while_busy_then_restored(worker):
    before = sys.getswitchinterval()
    gate = threading.Event()
    seen = []
    worker.launch(lambda: (gate.wait(), seen.append(sys.getswitchinterval())))
    assert sys.getswitchinterval() == pytest.approx(worker.switch_interval_s)
    gate.set()
    worker.drain()
    assert seen == [pytest.approx(worker.switch_interval_s)]
    assert sys.getswitchinterval() == before


def test_current_names_the_running_task_and_cpu_time_counts(worker):
    gate, started = threading.Event(), threading.Event()
    cpu = worker.cpu_s()

    def spin():
        started.set()
        t = time.perf_counter()
        while time.perf_counter() - t < 0.05:
            pass
        gate.wait()

    worker.launch(spin, what="piece")
    started.wait()
    assert worker.current == "piece" and worker.busy
    gate.set()
    worker.drain()
    assert worker.current is None
    if hasattr(time, "pthread_getcpuclockid"):
        assert worker.cpu_s() - cpu > 0.01


def test_running_at_names_the_task_over_an_instant_after_it_ended(worker):
    # A consumer that resumed while a task ran may ask only after the task ended (it lost the GIL
    # to the worker again): running_at still names that task, current no longer does.
    gates = [threading.Event(), threading.Event()]
    started = [threading.Event(), threading.Event()]

    def task(i):
        started[i].set()
        gates[i].wait()

    before = time.perf_counter()
    worker.launch(lambda: task(0), what="first")
    worker.launch(lambda: task(1), what="second")
    try:
        started[0].wait()
        during = time.perf_counter()
        assert worker.running_at(during) == "first" and worker.running_at(before) is None
        gates[0].set()
        started[1].wait()  # the first ended and the second runs now
        assert worker.current == "second"
        assert worker.running_at(during) == "first"  # ran over `during`; the one running now began after it
        assert worker.running_at(time.perf_counter()) == "second"
    finally:
        for gate in gates:
            gate.set()
    worker.drain()
    assert worker.current is None and worker.running_at(during) is None  # `last` is the second now
    assert worker.running_at(time.perf_counter()) is None


def test_a_failed_task_skips_the_rest_and_is_raised_once(worker):
    seen = []
    worker.launch(lambda: seen.append(1))
    worker.launch(lambda: 1 / 0)
    worker.launch(lambda: seen.append(3))  # after the failure: skipped, not run out of order
    with pytest.raises(RuntimeError, match="an encoder task on the idle worker failed: ZeroDivisionError"):
        worker.drain()
    assert seen == [1]
    worker.launch(lambda: seen.append(4))  # reported once: the worker goes on
    worker.drain()
    assert seen == [1, 4]


def test_filler_settles_the_worker_before_a_task_of_its_own(worker):
    log = []

    def task(name, sleep=0.0):
        def run():
            time.sleep(sleep)
            log.append(name)
        return FillTask(name=name, duration_s=0.01, planned_start_s=0.0, run=run, chain=0)

    tasks = [task("a", 0.05), task("b", 0.05), task("c")]
    filler = BubbleFiller.with_gaps(tasks, [0.0, 0.0], [("F", 0)], horizon_s=1.0)
    for t in tasks[:2]:
        filler.executor.queue(t, worker)
    assert [t.done for t in tasks] == [True, True, False] and filler.executor.queued_s() > 0.0
    filler.drain()  # runs c on this thread, after a and b
    assert log == ["a", "b", "c"] and all(t.finished for t in tasks) and filler.executor.queued_s() == 0.0
    assert tasks[0].took_s >= 0.0 and filler.remaining == 0


def test_filler_picks_for_the_worker_only_what_may_leave_the_main_thread():
    talk = FillTask(name="send", duration_s=0.001, planned_start_s=0.0, run=lambda: None, host_only=True, chain=0)
    local = FillTask(name="piece", duration_s=0.001, planned_start_s=0.001, run=lambda: None, chain=1)
    filler = BubbleFiller.with_gaps([talk, local], [0.0, 0.0], [("F", 0)], horizon_s=1.0)
    assert filler.pick(1.0, worker=True)[0] is local
    assert filler.pick(1.0)[0] is talk


def test_held_worker_finishes_its_task_and_starts_no_other(worker):
    log, inside, go = [], threading.Event(), threading.Event()

    def task():
        inside.set()
        go.wait()
        log.append(1)

    worker.launch(task)
    worker.launch(lambda: log.append("next"))
    inside.wait()
    worker.hold()
    go.set()
    time.sleep(0.2)
    assert log == [1] and worker.busy  # the running task went on; the next did not start
    worker.drain()  # lifts the hold while it waits, and puts it back
    assert log == [1, "next"]
    gate = []
    worker.launch(lambda: gate.append(1))
    time.sleep(0.1)
    assert gate == [] and worker.busy  # still held
    worker.allow()
    worker.drain()
    assert gate == [1]


def test_wait_until_returns_when_its_task_is_done_and_the_queue_goes_on(worker):
    done, release = threading.Event(), threading.Event()
    worker.launch(done.set)
    worker.launch(release.wait)
    worker.wait_until(done.is_set)
    assert done.is_set() and worker.busy  # the second task is still running
    release.set()
    worker.drain()
    assert not worker.busy


def test_force_launches_what_the_llm_needs_onto_the_worker_and_waits_for_it_only(worker):
    log, release = [], threading.Event()

    def task(name, needed_by=None, chain=0, block=False):
        def run():
            if block:
                release.wait()
            log.append(name)
        return FillTask(name=name, duration_s=0.01, planned_start_s=0.0, run=run, needed_by=needed_by, chain=chain)

    f0, f1, b0 = task("f0", 0), task("f1", 1, chain=1), task("b0", block=True, chain=2)
    filler = BubbleFiller.with_gaps([f0, f1, b0], [0.0, 0.0], [("F", 0)], horizon_s=1.0)
    filler.executor.queue(f0, worker)
    filler.executor.queue(b0, worker)  # after f0, blocks until released
    filler.force(0)  # f0 is finished: returns though b0 is not
    assert log == ["f0"] and not f1.done
    release.set()
    filler.force(1)  # f1 goes onto the worker behind b0, and this thread waits for it
    assert log == ["f0", "b0", "f1"] and f1.finished and filler.stats.forced == 1
