"""An engine on a thread of its own, fed by many callers: ``EngineService``.

Why: a generate actor receives Ray Data batches one call at a time, and an engine
that decoded one batch per call would drain between batches (its last rows decode
alone while the next batch waits). The service keeps ONE engine running on a
background thread; each call submits its requests and waits for their results, while
requests of other calls (the actor takes several batches at once) join the same
decode batch as slots free up. Only the job's last requests form a tail.

One thread for every torch call: a forward pass is ~2,000 OpenMP parallel regions, and
libgomp keeps a team of worker threads for each thread that ever started one. Once two
threads have teams (the model loaded and warmed up on the caller's thread, the steps run
on the service's) there are more OpenMP threads than CPUs on a 2-core machine, and libgomp
then lets idle workers spin only ~100 times before sleeping, so every region wakes its
worker through the kernel: a prefill on a second thread was ~15% slower, with thousands of
context switches where one thread had none (measured: jobs/results/code-choices.md,
"stages/decoding/service.py"). So the service can build its
engine itself: ``EngineService(build)`` calls ``build()`` on its own thread (model load,
warm-up, kernel plans), and that thread then runs every step.

Contract: ``EngineService(engine)`` starts the thread; ``EngineService(build)``, with
``build`` a function returning an Engine, starts it and calls ``build()`` there first,
returning once it has (its exception, if it raises, is raised by the constructor and the
thread ends); either way ``service.engine`` is the engine. ``generate(requests)`` (from
any thread) submits the requests, blocks until each has finished, and returns one
``Finished`` per request, in order; keys only need to be unique within the call.
``close()`` stops the thread after the work in hand; ``stop()`` (an interrupt) stops it
after the step in hand, abandoning the rest: a waiting call still returns, the requests
that finished before the stop with their results and the abandoned ones with an
``EngineInterrupted`` error (the caller writes the first and drops the second: a rerun
does them). If the engine itself raises (a
bug or a broken device, not a failing request: those finish with their error), every
waiting caller gets a ``Finished`` with that error, the service stops, and later
calls raise ``EngineStopped``, so the actor's rows become error rows and Ray's retry
policy decides what happens to the actor.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace

import torch

from stages.decoding.engine import Engine
from stages.decoding.request import Finished, Request


class EngineStopped(RuntimeError):
    """The service's engine stopped after an internal error (see the module contract)."""


class EngineInterrupted(EngineStopped):
    """The error of a request ``stop()`` abandoned (an interrupt): it has no result, and is
    no failure of its own (see the module contract)."""


class EngineService:
    """One engine stepping on a background thread (see the module docstring)."""

    def __init__(self, engine: Engine | Callable[[], Engine], name: str = "longdoc-engine") -> None:
        self.engine: Engine  # set here, or by build() on the thread before __init__ returns
        self._build: Callable[[], Engine] | None = None
        if isinstance(engine, Engine):
            self.engine = engine
        else:
            self._build = engine
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self._cond = threading.Condition()
        self._inbox: list[tuple[Request, Future]] = []
        self._futures: dict[object, Future] = {}
        self._ids = itertools.count()
        self._closed = False
        self._stopping = False  # stop(): end after the step in hand (an interrupt)
        self._error: BaseException | None = None
        # torch's intra-op thread count as the creating thread set it: a new thread starts
        # with OpenMP's default from OMP_NUM_THREADS (Ray sets it for its workers), so a
        # 2-thread actor would run its matmuls on one thread, and its prefill slower (measured:
        # jobs/results/code-choices.md, "stages/decoding/service.py EngineService.__init__").
        self._torch_threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._built.wait()
        if self._build_error is not None:
            self._thread.join()
            raise self._build_error

    def generate(self, requests: Sequence[Request]) -> list[Finished]:
        """Submit ``requests``, wait for all of them; their Finished, in order, keys as given."""
        call = next(self._ids)
        futures: list[Future] = []
        with self._cond:
            if self._error is not None or self._closed:
                raise EngineStopped(f"the engine stopped: {self._error!r}" if self._error else "the service is closed")
            for i, r in enumerate(requests):
                fut: Future = Future()
                self._inbox.append((replace(r, key=(call, i)), fut))
                futures.append(fut)
            self._cond.notify()
        out = []
        for r, fut in zip(requests, futures, strict=True):
            done: Finished = fut.result()
            out.append(Finished(r.key, done.result, done.error))
        return out

    def close(self, timeout: float | None = None) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def stop(self, timeout: float | None = None) -> None:
        """End the thread after the step in hand (a build in progress finishes first);
        unfinished requests are abandoned (``EngineInterrupted``, module contract). Waits up
        to ``timeout`` seconds for the thread: a process may then exit without a torch
        call running on it (one that did aborted the process at exit)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        torch.set_num_threads(self._torch_threads)  # per thread for OpenMP (see __init__)
        try:
            if self._build is not None:
                self.engine = self._build()
        except BaseException as e:  # noqa: BLE001 - the constructor raises it
            self._build_error = e
            return
        finally:
            self._build = None
            self._built.set()
        self._loop()

    def _loop(self) -> None:
        engine = self.engine
        try:
            while True:
                with self._cond:
                    while not self._inbox and engine.idle() and not self._closed and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        raise EngineInterrupted("the run was interrupted")
                    if self._closed and not self._inbox and engine.idle():
                        return
                    for request, fut in self._inbox:
                        self._futures[request.key] = fut
                        engine.submit(request)
                    self._inbox.clear()
                for f in engine.step():
                    self._futures.pop(f.key).set_result(f)
        except BaseException as e:  # noqa: BLE001 - every waiter must hear of it
            with self._cond:
                self._error = e
                pending = list(self._futures.values()) + [fut for _, fut in self._inbox]
                self._futures.clear()
                self._inbox.clear()
            for fut in pending:
                if not fut.done():
                    fut.set_result(Finished(None, None, e))
