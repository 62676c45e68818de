"""The `salus` policy: lanes (lanes.py) with the safety condition, jobs' P and E from their calls
(detector.py), and iteration-boundary scheduling (schedulers.py). A job is a session.

- **Admission.** A job that declares its sizes (declared.py) asks for a lane when its session
  starts, and its first call is held until it gets one, so it allocates nothing before. A job
  that declares nothing asks at its first launch (what it allocated to set itself up counts):
  its sizes are then all it has held with E = 0, the detector's once it is recognized. Waiting
  jobs are offered lanes in the scheduler's admission order after every event and tick.
- **Set-up.** An admitted job holds no turn until it asks to launch or to allocate beyond its
  P: its set-up (a process's CUDA and library start, loading its modules, copying its model
  in) runs beside the others' iterations, so a one-at-a-time scheduler does not leave the GPU
  idle for it (on the H100 a PyTorch job's set-up took seconds, all of them in FIFO's and
  SRTF's single turn).
- **Last iteration.** A job that has run its declared iteration count gives its turn up at
  that boundary, so the next job starts while it reads back, frees and exits, once the
  detector has settled (its pieces alike, or a step of several pieces folded into one
  iteration: before, its count is of pieces). Past its declared count (an iteration seen in
  pieces, or a count declared too low) it gives its turn up at each learned count (the
  declared one doubled) and is not held at its other boundaries: its next launch or scratch
  waits for its turn instead, so its exit never waits for another job's iterations.
- **Boundaries.** A job in an iteration always runs (nothing of it is held). At a boundary (a
  free that returns it to its persistent level; of a step that does so several times, only
  the one that ends the step, detector.py) its lane is updated to the new measurement (if
  that no longer fits, it leaves its lane and waits for admission again, never for ever: see
  below) and the scheduler picks who runs next; if not this job, its next call, whatever it
  is (the scratch allocation of its next iteration, usually), is held (Controls.hold_session:
  a deferred reply, never a kill) until the scheduler picks it. A daemon without holds (or a
  launch made anyway) is held at the launch instead (WAIT).
- **Growth.** Every allocation of an admitted job is asked for first (allocation_requested):
  if what the job would then hold is more than its P and its lane count, its sizes grow (its
  lane with them) when the safety condition allows, and otherwise the allocation is refused as
  a GPU of capacity C would refuse it (cudaErrorMemoryAllocation, as a job outgrowing its lane
  fails in Salus). So the condition holds at every moment by construction, including when a
  job is measured larger than it declared. Memory a daemon would charge without asking is
  counted when made (forced) and stops admissions while over C (every path of pilotd's asks).
- **Between iterations** all a job holds counts as its P (Job.sizes): a boundary is a return
  to its level within a tolerance, and what it still holds there must not count as the
  scratch its lane now lends to the next job.
- **Outside the lanes.** What a job without a lane holds (an undeclared job's set-up before its
  first launch, a job that left its lane at a boundary) is counted too (Lanes.hold_outside),
  so no admission can count on memory someone still holds.
- **No wait that cannot end** (liveness, docs/POLICIES.md): a job whose P + E alone passes
  C is refused (its next allocation or launch fails, as on a GPU of capacity C) instead of
  waiting for a lane for ever; FIFO's arrival order does not block a later job that holds
  memory outside the lanes; and when the jobs waiting for a lane hold memory outside and none
  fits beside the others while nothing else can change the count, the youngest holder is
  refused, and its failure frees what it holds.
- **Declarations are floors.** A declared job is counted at least its declared P and E, also
  once recognized: until the detector has folded a step that frees in several places
  (PyTorch) into one iteration, it measures the pieces, and too little.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..api import RUN, AllocationView, Decision, LaunchView, Policy, SessionView, Watch
from ..settings import Bytes
from ..tracking import size_text
from . import declared as declarations
from .detector import IterationDetector
from .lanes import GROW_CHOICES, Lanes
from .schedulers import (
    ONE_AT_A_TIME,
    SCHEDULERS,
    JobState,
    admission_order,
    learned_count,
    remaining_s,
    runnable,
    strict_order,
)

HOST_KINDS = ("pinned", "staging")  # host memory (staging: pinned copy buffers): not counted

log = logging.getLogger("pilot.policy.salus")


@dataclass(frozen=True, slots=True)
class SalusSettings:
    scheduler: str = "pack"  # fifo, srtf, pack or fair
    capacity: Bytes = 0  # C for the lanes (at most the GPU's capacity); 0: the GPU's capacity
    grow: str = "smallest"  # which lane Algorithm 1 grows: "smallest" (the paper) or "closest"
    learn: int = 2  # boundaries before a job's P and E are trusted
    declared: bool = True  # read PILOT_SALUS_* from a job's environment
    # SRTF: seconds taken off a job's estimated remaining time per second it has waited for its
    # turn (0: pure SRTF, where a long job can wait for ever behind a stream of short ones)
    aging: float = 0.1

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}")
        if self.grow not in GROW_CHOICES:
            raise ValueError(f"grow must be one of {', '.join(GROW_CHOICES)}")
        if self.capacity < 0:
            raise ValueError("capacity must be 0 or more")
        if self.learn < 1:
            raise ValueError("learn must be 1 or more")
        if not self.aging >= 0:  # NaN too
            raise ValueError("aging must be 0 or more")


# Turns measured before a job's iteration time is the median of its turns (Job.iteration_s).
WARM_TURNS = 3


@dataclass(slots=True)
class Job:
    session: SessionView
    arrival: int
    detector: IterationDetector
    declared: declarations.Declared
    wants_lane: bool = False  # it asked for a lane (declared: at its start; else at a launch)
    # it needs its turn on the GPU: it asked to launch, or to allocate beyond its P (set-up
    # before that runs beside the others' iterations: it holds no turn)
    wants_turn: bool = False
    running: bool = False  # in an iteration: never held
    started: float = 0.0  # when its current iteration began
    service: float = 0.0  # seconds of iterations run
    # FAIR's virtual service: the service, but a job joining a lane starts from the least of
    # its lane-mates' (so a newcomer shares from its arrival instead of catching up on what
    # the others ran before it came)
    vservice: float = 0.0
    # seconds of its recent iterations, each from its turn to its boundary: not the time
    # between boundaries, which includes waits for its turn (a preempted job would look long
    # to SRTF for as long as it was held); not the first one either, which also loads the
    # job's modules and starts its libraries (a PyTorch job's first step can take as long as
    # a hundred later ones)
    turns: deque[float] = field(default_factory=lambda: deque(maxlen=8))
    iterations_ran: int = 0
    held: str = ""  # why it waits, "" if it does not
    gated: bool = False  # its calls are held (Controls.hold_session)
    waits_for: int = 0  # bytes of an allocation held until they fit (it has no lane)
    refused: str = ""  # why it never gets a lane (P + E past C): its allocations and launches fail
    waited: float = 0.0  # seconds it wanted its turn and did not have it (SRTF's aging), ...
    waiting_since: float | None = None  # ... plus now less this, while it waits
    # the session's launches the detector was told of, per GPU (AllocationView.launches is the
    # count of the session's part on the event's GPU)
    launches: dict[int, int] = field(default_factory=dict)
    # (detector version, detector peak, P, E) of the sizes last counted for it in its lane while
    # it ran: see counted_still
    counted: tuple[int, int, int, int] | None = None
    # per GPU: (allocations, frees, live) of its part as of the last memory event heard
    # (AllocationView's counts): what came between was quiet (Salus._quiet)
    heard: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    # per GPU: the quiet band last set for its part there (Controls.quiet_memory)
    bands: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def iteration_s(self) -> float | None:
        """Its iteration time in its turns after the first: the lower median of the recent ones
        (one slow iteration, a neighbour's or a page-in's, does not move it); None before (SRTF
        then takes its declared time, else the other jobs' pace). A framework's warm-up lasts
        more than one iteration (a PyTorch job's second step took 186 ms on the H200, its next
        ones 8-10 ms), and a job is measured only in its turns: an estimate too high is never
        corrected while the job is held for it. So while it has fewer than WARM_TURNS turns,
        it is its fastest turn or its declared time, whichever is less (a job that ran is
        re-measured at once; one estimated too low costs its neighbours a few iterations)."""
        t = sorted(self.turns)
        if not t:
            return None
        if len(t) < WARM_TURNS:
            return min(t[0], self.declared.iteration_s or t[0])
        return t[(len(t) - 1) // 2]

    def launched_since(self, gpu: int, total: int) -> None:
        """The session's part on `gpu` had made `total` launches at a memory event
        (AllocationView.launches, counted by pilotd, its fast path's included): the detector
        hears of those it was not told of (launch_started tells it of the ones the policy
        sees)."""
        told = self.launches.get(gpu, 0)
        if total > told:
            self.detector.launched(None, total - told)
            self.launches[gpu] = total

    def counted_still(self, persistent: int, ephemeral: int, extra: int = 0) -> bool:
        """Whether sizes(extra) is (persistent, ephemeral), the sizes its lane counts, without
        computing it (an allocation's hot path: a PyTorch step makes dozens). True only while it
        runs, the detector's P, E and peak are as when those sizes were counted, and `extra`
        bytes more stay within them: sizes() then depends on nothing else."""
        det = self.detector
        return (self.running and self.counted == (det.version, det.peak, persistent, ephemeral)
                and det.live + extra - persistent <= ephemeral)

    def wants(self, now: float) -> None:
        """It asks for its turn (a launch, or scratch beyond its P)."""
        self.wants_turn = True
        if not self.running and self.waiting_since is None:
            self.waiting_since = now

    def waited_s(self, now: float) -> float:
        return self.waited + (now - self.waiting_since if self.waiting_since is not None else 0.0)

    def ran(self, seconds: float) -> None:
        """An iteration ended after `seconds` in its turn."""
        self.service += seconds
        self.vservice += seconds
        self.iterations_ran += 1
        if self.iterations_ran > 1:
            self.turns.append(seconds)

    def sizes(self, extra: int = 0, between: bool | None = None) -> tuple[int, int]:
        """P and E to count: the detector's once it recognized the job, else its declaration
        (P grown to what it has held beyond its declared E) or, undeclared, all it has held
        with E = 0; never less than declared; with `extra` bytes more allocated, what it would
        hold above P counts as scratch (its lane grows). `between` iterations (default: when
        it does not run) all it holds counts as P."""
        d, det = self.declared, self.detector
        live = det.live + extra
        peak = max(det.peak, live)
        declared = d.persistent is not None or d.ephemeral is not None
        if det.recognized:
            p, e = det.persistent, det.ephemeral
        elif declared:
            e = d.ephemeral or 0
            p = max(d.persistent or 0, peak - e)
        else:
            return peak, 0
        if declared:
            p, e = max(p, d.persistent or 0), max(e, d.ephemeral or 0)
        if not self.running if between is None else between:
            # Between iterations all it holds is persistent: its lane's scratch is another
            # job's now. A boundary is a return to the level within a tolerance (up to 1 MiB or
            # 2%), and a declared floor may be below what it holds: counted as scratch, such
            # leftovers went past C beside the next job's iteration (the sim's trace, SRTF).
            p = max(p, live)
        return p, max(e, live - p)


class Salus(Policy):
    name = "salus"
    summary = "Salus: jobs in GPU lanes within sum(P)+sum(L) <= C, switched at iteration boundaries"
    decides_launches = True
    Settings = SalusSettings

    def __init__(self, settings: Any = None) -> None:
        super().__init__(settings)
        self.jobs: dict[int, Job] = {}
        self.lanes: dict[int, Lanes] = {}  # gpu -> its lanes
        self._arrivals = itertools.count(1)
        self.last_turn: dict[int, int] = {}  # gpu -> the session that got its turn last
        self.clock = time.monotonic  # tests replace it
        self.read_declared = declarations.read  # pid -> Declared; tests replace it

    # ---- sessions and memory ----
    def session_started(self, s: SessionView) -> None:
        d = self.read_declared(s.pid) if self.settings.declared else declarations.NONE
        job = self.jobs[s.id] = Job(s, next(self._arrivals), IterationDetector(self.settings.learn), d)
        self._trace(job, "started")
        if d.persistent is not None or d.ephemeral is not None:
            # Declared: it asks for its lane now, before it allocates anything, and sets
            # itself up (within its P) once admitted, without waiting for its turn.
            job.wants_lane = True
            self._reschedule(s.gpu)
            if s.id not in self._lanes(job) and not job.refused:
                job.gated = True
                self.controls.hold_session(s.id, f"salus: {self._note_held(job)}")

    def session_ended(self, s: SessionView) -> None:
        job = self.jobs.pop(s.id, None)
        if job is not None:
            self._trace(job, "ended")
            self._lanes(job).remove(s.id)
            self._reschedule(s.gpu)

    def allocation_requested(self, a: AllocationView) -> Decision:
        """An admitted job may hold more than its P and lane count only if the lanes can grow
        within C; otherwise the allocation is refused (waiting, a job in its iteration could
        deadlock with another). A job without a lane (an undeclared job setting itself up)
        waits until the allocation fits beside what is counted, while an admitted job can still
        end and free memory; when none can, it is refused."""
        job = self.jobs.get(a.session)
        if job is None or a.kind in HOST_KINDS:
            return RUN
        if job.refused:
            return self._refusal(job, job.refused)
        lanes = self._lanes(job)
        m = lanes.members.get(a.session)
        if m is None:
            if lanes.used + a.size <= lanes.capacity:
                job.waits_for = 0
                return RUN
            why = (f"salus: {size_text(a.size)} more does not fit beside what the lanes count "
                   f"({size_text(lanes.used)} of {size_text(lanes.capacity)})")
            if not self._can_make_room(job):
                job.waits_for = 0
                return self._refusal(job, why)
            if not job.waits_for:
                self.controls.report("hold", job.session.tenant)
            job.waits_for = a.size
            return Decision.wait(why)
        if not job.running and job.detector.live + a.size > m.persistent:
            # beyond its P: its iteration's scratch, in its lane, at its turn
            if not job.wants_turn:
                self._trace(job, "asks")
            job.wants(self.clock())
            self._reschedule(job.session.gpu)
            if not job.running:
                job.gated = True
                return Decision.wait(f"salus: {self._note_held(job)}")
        if job.counted_still(m.persistent, m.ephemeral, a.size):
            return RUN  # within what its lane counts already
        p, e = job.sizes(a.size)
        if (p <= m.persistent and e <= m.ephemeral) or lanes.fits(a.session, p, e):
            return RUN
        return self._refusal(
            job, f"salus: {size_text(a.size)} more would make the job P {size_text(p)}, "
            f"E {size_text(e)}, past C ({size_text(lanes.used)} of {size_text(lanes.capacity)} counted)")

    def allocated(self, a: AllocationView) -> None:
        job = self.jobs.get(a.session)
        if job is None or a.kind in HOST_KINDS:
            return
        self._catch_up(job, a, freed=False)
        self._allocated(job, a)
        self._quiet(job, a.gpu)

    def _allocated(self, job: Job, a: AllocationView) -> None:
        job.launched_since(a.gpu, a.launches)
        job.detector.allocated(a.size, self.clock())
        lanes = self._lanes(job)
        m = lanes.members.get(a.session)
        if m is None:
            lanes.hold_outside(a.session, job.detector.live)
            return
        if job.counted_still(m.persistent, m.ephemeral):
            return  # its lane counts it as it is
        p, e = job.sizes()
        lanes.update(a.session, p, e, force=True)  # it holds it already
        det = job.detector
        job.counted = (det.version, det.peak, p, e) if job.running else None
        if lanes.used > lanes.capacity:
            log.warning("salus: session %d holds more than it was admitted with: %s counted of C %s "
                        "(memory charged without asking the policy); nothing is admitted until "
                        "back within", a.session, size_text(lanes.used), size_text(lanes.capacity))

    def freed(self, a: AllocationView) -> None:
        """A boundary ends the job's iteration: its lane is updated, the scheduler picks who runs
        next, and if that is not this job its next call is held."""
        job = self.jobs.get(a.session)
        if job is None or a.kind in HOST_KINDS:
            return
        self._catch_up(job, a, freed=True)
        self._freed(job, a)
        self._quiet(job, a.gpu)

    def _freed(self, job: Job, a: AllocationView) -> None:
        now = self.clock()
        det = job.detector
        job.launched_since(a.gpu, a.launches)
        pieces = det.candidates
        boundary = det.freed(a.size, now)
        if det.candidates != pieces and log.isEnabledFor(logging.DEBUG):
            self._trace_piece(job)
        lanes = self._lanes(job)
        if a.session not in lanes:
            lanes.hold_outside(a.session, job.detector.live)
        if boundary is None:
            if not job.running and a.session in lanes:
                lanes.update(a.session, *job.sizes())  # what it holds between iterations, less
            return
        if job.running and a.session in lanes and not lanes.fits(a.session, *job.sizes(between=True)):
            # It still holds more than its P counts (a return to its level within the
            # tolerance) and that does not fit beside the scratch its lane would lend the next
            # job: no switch point, its iteration goes on to its next boundary.
            self._trace(job, "kept")
            return
        self._trace(job, "boundary")
        if job.running:
            job.ran(now - job.started)
            job.running = False
            if job.wants_turn:  # it waits for its next turn from here (unless it is picked again)
                job.waiting_since = now
        if a.session in lanes:
            lanes.update(a.session, *job.sizes())  # False: it left its lane, admitted again
        declared = job.declared.iterations
        if declared is not None and det.settled and \
                boundary.iteration == learned_count(boundary.iteration - 1, declared):
            # Its last iteration, as far as pilot can tell: it gives its turn up now, not at its
            # session's end (its read-back, frees and exit need no turn; a launch or scratch
            # would ask again). At the declared count, and at each learned one after it (the
            # declared count doubled: SRTF's estimate, schedulers.remaining_s) for a job seen
            # with more boundaries than it declared (an iteration that frees in several places,
            # PyTorch's, is cut into pieces): held there instead, its exit would wait for
            # another job's boundary. Not at every later boundary: that made such a job wait
            # for another's boundary before each piece. Only where the detector has settled
            # (its pieces alike, or folded into iterations): a PyTorch step is several pieces
            # until the detector has seen three steps, and a job of 20 steps reached "20" in
            # its second one.
            job.wants_turn = False
            job.waiting_since = None
            self._trace(job, "last")
            self._reschedule(a.gpu)
            return
        self._reschedule(a.gpu)
        if declared is not None and boundary.iteration > declared:
            # Past its declared count pilot cannot tell its end from a piece: not held here, or
            # its exit (read-back, frees) would wait for another job's iterations. If it has
            # lost the turn, its next launch or scratch waits for it instead (WAIT).
            return
        self._hold_unless_running(job)

    def tick(self, now: float) -> None:
        for gpu in self.lanes:
            self._gpu_lanes(gpu)  # its capacity, as of now
            if any(j.held or j.gated or j.waits_for for j in self.jobs.values() if j.session.gpu == gpu):
                self._reschedule(gpu)

    # ---- launches ----
    def launch_requested(self, l: LaunchView) -> Decision:  # noqa: E741
        """Launches within an iteration run; the first one of a job that is not running (its
        first launch, or after a boundary where the daemon could not hold it) asks for a lane
        and the scheduler's turn."""
        job = self.jobs.get(l.session)
        if job is None or job.running:
            return RUN
        if not job.refused:
            if not job.wants_turn:
                self._trace(job, "asks")
            job.wants_lane = True
            job.wants(self.clock())
            self._reschedule(l.gpu)
        if job.running:
            return RUN
        if job.refused:  # now or before: no lane can ever fit it
            return self._refusal(job, job.refused)
        return Decision.wait(f"salus: {self._note_held(job)}")

    def launch_started(self, l: LaunchView) -> None:  # noqa: E741
        job = self.jobs.get(l.session)
        if job is not None:
            # counted in the next memory event's AllocationView.launches on its GPU too
            job.launches[l.gpu] = job.launches.get(l.gpu, 0) + 1
            job.detector.launched(self.clock())

    def watches_launches(self, session: int) -> Watch:
        """What of the session's launches must come to launch_requested now: all of them while
        it does not run (its launch asks for its turn and may wait; its calls may be held);
        none while it runs: it is never held within an iteration, so pilotd's fast path runs
        its launches (and its library calls, copies and synchronizations) in C. The detector
        needs to know only whether the job launched between two of its returns to the level,
        which it reads from the count pilotd keeps (AllocationView.launches) at the next
        allocation or free; watching the first launch after each return made a PyTorch step,
        which returns to its level about 11 times, pay 11 launches through Python. A job is
        watched more again only in its own events (the free that is its boundary), as the fast
        path requires."""
        job = self.jobs.get(session)
        if job is None or not job.running:
            return Watch.ALL
        return Watch.NONE

    # ---- quiet memory events ----
    def _catch_up(self, job: Job, a: AllocationView, freed: bool) -> None:
        """The detector hears what pilotd kept quiet before this event (its counts since the
        last event heard), then this event as usual."""
        if not a.allocations and not a.frees:
            return  # not counted by pilotd (a view made outside a daemon)
        before = job.heard.get(a.gpu, (0, 0, 0))
        job.heard[a.gpu] = (a.allocations, a.frees, a.live)
        allocations = a.allocations - before[0] - (0 if freed else 1)
        frees = a.frees - before[1] - (1 if freed else 0)
        if allocations <= 0 and frees <= 0:
            return
        det = job.detector
        others = det.live - before[2]  # its other GPUs' bytes, as the detector counts them
        live = a.live + a.size if freed else a.live - a.size  # before this event
        det.quiet(max(0, allocations), max(0, frees), others + live, others + a.high, others + a.low)

    def _quiet(self, job: Job, gpu: int) -> None:
        """While the job runs its recognized, settled iterations on one GPU, pilotd keeps quiet
        what salus would only count: allocations within what its lane counts for it (P + E: the
        answer is RUN, nothing changes) and frees that stay above its level's tolerance (not a
        candidate: nothing to do). Every free that can end a piece or an iteration is heard;
        at most half the detector's `relearn` events in a row are quiet. A PyTorch step of
        30-50 allocations and as many frees then costs salus its dozen returns to the level."""
        if len(job.heard) > 1:  # on several GPUs: every part heard in full
            for other in list(job.bands):
                del job.bands[other]
                self.controls.quiet_memory(job.session.id, other)
            return
        band = self._band(job, gpu)
        if band != job.bands.get(gpu):
            if band is None:
                del job.bands[gpu]
                self.controls.quiet_memory(job.session.id, gpu)
            else:
                job.bands[gpu] = band
                self.controls.quiet_memory(job.session.id, gpu, *band)

    def _band(self, job: Job, gpu: int) -> tuple[int, int, int] | None:
        det = job.detector
        heard = job.heard.get(gpu)
        if not job.running or job.refused or heard is None \
                or not det.recognized or not det.settled or det.level is None:
            return None
        m = self._lanes(job).members.get(job.session.id)
        if m is None:
            return None
        others = det.live - heard[2]
        return (m.persistent + m.ephemeral - others, det.level + det.tolerance_of(det.level) - others,
                max(1, det.relearn // 2))

    # ---- internals ----
    def _reschedule(self, gpu: int) -> None:
        """Offer lanes to the jobs that wait for one, then let the scheduler's choices run:
        a chosen job becomes running, and if its calls were held they are released."""
        lanes = self._admit(gpu)
        for job in self.jobs.values():  # allocations held until they fit (or nothing can free)
            if job.waits_for and job.session.gpu == gpu and (
                    lanes.used + job.waits_for <= lanes.capacity or not self._can_make_room(job)):
                job.waits_for = 0
                self.controls.release_session(job.session.id)  # asked again: RUN or REFUSE
        for job in self.jobs.values():  # admitted at its start: it sets itself up now
            if job.gated and not job.wants_turn and job.session.gpu == gpu and job.session.id in lanes:
                self._release(job)
        chosen = runnable(self.settings.scheduler, self._states(gpu, lanes))
        now = self.clock()
        for sid in chosen:
            job = self.jobs[sid]
            if job.running or not job.wants_turn:
                continue
            job.running, job.started = True, now
            if job.waiting_since is not None:
                job.waited += now - job.waiting_since
                job.waiting_since = None
            self.last_turn[gpu] = sid
            self._trace(job, "turn")
            self._release(job)

    def _trace(self, job: Job, what: str) -> None:
        """A debug line per step of a job's life (bench/salus_timeline.py reads them)."""
        log.debug("salus event %s session %d pid %d at %.6f", what, job.session.id, job.session.pid,
                  self.clock())

    def _trace_piece(self, job: Job) -> None:
        """A debug line per piece (what came between two returns to the level): its signature,
        for telling why a job's steps are or are not folded (bench/salus_experiments.py steps)."""
        det = job.detector
        p = det.last_piece
        if p is not None:
            log.debug("salus piece %d session %d: allocations %d frees %d peak %d live %d gap %.6f; "
                      "period %d, iterations %d", det.candidates, job.session.id, p.allocations, p.frees,
                      p.peak, p.live, p.gap, det.period, det.boundaries)

    def _can_make_room(self, job: Job) -> bool:
        """Whether another job of job's GPU can still end or be admitted and so change what is
        counted: an admitted one (it runs and ends; it never waits for an allocation), or one
        without a lane that is neither waiting for an allocation nor for a lane. If none can,
        an allocation that does not fit never will: it is refused rather than held."""
        lanes = self._lanes(job)
        return any(o is not job and o.session.gpu == job.session.gpu
                   and (o.session.id in lanes or not (o.waits_for or o.wants_lane))
                   for o in self.jobs.values())

    def _refuse(self, job: Job, p: int, e: int, capacity: int, beside: str) -> None:
        """No lane will ever fit `job` (P + E past C, or past C `beside` memory that nothing
        can free), so it does not wait for one (it would wait for ever): its calls go on and
        its next allocation or launch fails, as on a GPU of capacity C."""
        where = f" beside {beside}" if beside else ""
        job.refused = (f"salus: P {size_text(p)} + E {size_text(e)}{where} is more than C "
                       f"({size_text(capacity)}): no lane can ever fit the job")
        job.wants_lane = job.wants_turn = False
        job.waiting_since = None
        log.warning("salus: session %d refused: %s", job.session.id, job.refused)
        self._release(job)

    def _release(self, job: Job) -> None:
        """The job's held calls go on (its session released), and its hold is reported over."""
        if job.gated:
            job.gated = False
            self.controls.release_session(job.session.id)
        if job.held:
            job.held = ""
            self.controls.report("release", job.session.tenant)

    def _refusal(self, job: Job, why: str) -> Decision:
        """An allocation or launch of the job refused (counted for its tenant), as a GPU of
        capacity C would fail it."""
        self.controls.report("refuse", job.session.tenant)
        return Decision.refuse(why)

    def _hold_unless_running(self, job: Job) -> None:
        if not job.running:
            self._trace(job, "held")
            job.gated = True
            self.controls.hold_session(job.session.id, f"salus: {self._note_held(job)}")

    def _note_held(self, job: Job) -> str:
        """Why the job waits (kept for pilotctl), counted once per wait."""
        lanes = self._lanes(job)
        if job.session.id not in lanes:
            p, e = job.sizes()
            why = (f"no lane fits P {size_text(p)}, E {size_text(e)} "
                   f"({size_text(lanes.used)} of {size_text(lanes.capacity)} used)")
        else:
            why = f"{self.settings.scheduler}: another job's turn"
        if not job.held:
            self.controls.report("hold", job.session.tenant)
        job.held = why
        return why

    def _lanes(self, job: Job) -> Lanes:
        """The job's GPU's lanes, as of the last look at its capacity (every _gpu_lanes: each
        reschedule and tick), without asking the daemon again: this runs at every allocation
        and free, and Controls.gpu builds a view of the whole GPU."""
        lanes = self.lanes.get(job.session.gpu)
        return lanes if lanes is not None else self._gpu_lanes(job.session.gpu)

    def _gpu_lanes(self, gpu: int) -> Lanes:
        lanes = self.lanes.get(gpu)
        if lanes is None:
            lanes = self.lanes[gpu] = Lanes(0, self.settings.grow,
                                            shared=self.settings.scheduler in ONE_AT_A_TIME)
        card = self.controls.capacity(gpu)  # 0: not known (outside a daemon)
        mine = self.settings.capacity
        lanes.capacity = min(mine, card) if mine and card else mine or card
        return lanes

    def _remaining(self, job: Job, typical_s: float | None) -> float:
        """SRTF's estimate of the job's remaining seconds (schedulers.remaining_s), with the
        job's own measured pace once it has one."""
        pace = job.iteration_s or job.declared.iteration_s or typical_s
        return remaining_s(job.detector.boundaries, job.declared.iterations, pace, job.service)

    def _state(self, job: Job, lanes: Lanes, typical_s: float | None = None,
               now: float | None = None) -> JobState:
        srtf = self.settings.scheduler == "srtf"
        remaining = self._remaining(job, typical_s)
        if srtf and now is not None:
            remaining -= self.settings.aging * job.waited_s(now)
        service = job.vservice if self.settings.scheduler == "fair" else job.service
        lane = lanes.lane_of(job.session.id) if job.wants_turn or job.running else None
        incumbent = srtf and self.last_turn.get(job.session.gpu) == job.session.id
        return JobState(job.session.id, job.arrival, lane, job.running, service, remaining, incumbent)

    def _typical_s(self, gpu: int) -> float | None:
        """The mean iteration time of the measured jobs of `gpu`: SRTF's guess for the others."""
        times = [t for j in self.jobs.values() if j.session.gpu == gpu
                 for t in [j.iteration_s] if t is not None]
        return sum(times) / len(times) if times else None

    def _states(self, gpu: int, lanes: Lanes) -> list[JobState]:
        typical = self._typical_s(gpu) if self.settings.scheduler == "srtf" else None
        now = self.clock()
        return [self._state(j, lanes, typical, now) for j in self.jobs.values() if j.session.gpu == gpu]

    def _admit(self, gpu: int) -> Lanes:
        """Offer lanes to the jobs of `gpu` that wait for one, in the scheduler's order. Never
        a wait that cannot end: a job whose P + E alone passes C is refused (_refuse), and
        FIFO's strict order stops at a job that does not fit only for jobs that hold nothing:
        one that holds memory outside the lanes (set-up, or it left its lane) is still offered
        a lane, since the first may wait for exactly what it holds."""
        lanes = self._gpu_lanes(gpu)
        typical = self._typical_s(gpu) if self.settings.scheduler == "srtf" else None
        now = self.clock()
        waiting = [self._state(j, lanes, typical, now) for j in self.jobs.values()
                   if j.session.gpu == gpu and j.wants_lane and j.session.id not in lanes]
        blocked = False
        for st in admission_order(self.settings.scheduler, waiting):
            job = self.jobs[st.job]
            if blocked and st.job not in lanes.outside:
                continue
            p, e = job.sizes()
            if lanes.capacity and p + e > lanes.capacity:
                self._refuse(job, p, e, lanes.capacity, "")
                continue
            placed = lanes.admit(st.job, p, e)
            if placed is None:
                blocked = strict_order(self.settings.scheduler)
                continue
            self._trace(job, "admitted")
            mates = [self.jobs[j].vservice for j in lanes.lanes[placed.lane].jobs if j != st.job]
            job.vservice = max(job.vservice, min(mates, default=0.0))
        stuck = [j for j in self.jobs.values() if j.session.gpu == gpu and j.wants_lane
                 and j.session.id in lanes.outside and j.session.id not in lanes]
        if stuck and not any(self._can_make_room(j) for j in stuck):
            # Each waits for memory another one holds and nothing else can change what is
            # counted: the youngest that holds memory fails, as on a GPU of capacity C.
            job = max(stuck, key=lambda j: j.arrival)
            self._refuse(job, *job.sizes(), lanes.capacity, "what the others waiting hold")
        return lanes

    # ---- reports ----
    def state(self) -> dict[str, Any]:
        gpus: dict[str, Any] = {}
        for gpu, lanes in sorted(self.lanes.items()):
            jobs = [self.jobs[j] for j in sorted(self.jobs) if self.jobs[j].session.gpu == gpu]
            gpus[str(gpu)] = {
                "capacity": lanes.capacity, "used": lanes.used, "persistent": lanes.persistent,
                "lane_bytes": lanes.lane_bytes, "outside": lanes.outside_bytes,
                "lanes": lanes.describe(),
                "queue": [j.session.id for j in jobs if j.wants_lane and j.session.id not in lanes],
                "jobs": [self._describe(j, lanes) for j in jobs]}
        return {"scheduler": self.settings.scheduler, "gpus": gpus}

    def _describe(self, job: Job, lanes: Lanes) -> dict[str, Any]:
        det = job.detector
        p, e = job.sizes()
        return {"session": job.session.id, "tenant": job.session.tenant, "pid": job.session.pid,
                "lane": lanes.lane_of(job.session.id), "persistent": p, "ephemeral": e,
                "recognized": det.recognized, "iterations": det.boundaries,
                "pieces": det.candidates, "period": det.period,
                "iteration_s": job.iteration_s, "service_s": round(job.service, 3),
                "remaining_s": round(self._remaining(job, self._typical_s(job.session.gpu)), 3),
                "waited_s": round(job.waited_s(self.clock()), 3),
                "running": job.running, "held": job.held, "refused": job.refused}

    def session_status(self, session: int) -> tuple[str, str] | None:
        job = self.jobs.get(session)
        if job is not None and job.refused:
            return "refused", job.refused
        if job is None or not job.held:
            return None
        return "held", f"salus {job.held}"

