"""What a step did and how long each phase took: `EngineCore.last_step` and `EngineCore.seconds`,
read by `wicore bench` and tools/profile_step.py."""

from __future__ import annotations

from dataclasses import dataclass

from wicore.types.step import ScheduledRow


@dataclass(frozen=True)
class PhaseSeconds:
    """Seconds spent in each phase of a step (or summed over steps). Under async scheduling the
    phases are the engine thread's: run_s is its wait for the worker, and graphs_s (the worker's)
    overlaps the other phases, so run_s - graphs_s is negative by what the overlap hid."""

    schedule_s: float = 0.0  # the speculator's drafts and the scheduler
    moves_s: float = 0.0  # KV blocks moved between tiers
    run_s: float = 0.0  # the graphs and sampling (runner.execute)
    update_s: float = 0.0  # the scheduler's accounting of the result
    graphs_s: float = 0.0  # of run_s, inside the graphs' runs (ModelGraphs.run); the rest of a step is host work

    @property
    def total_s(self) -> float:
        return self.schedule_s + self.moves_s + self.run_s + self.update_s

    @property
    def host_s(self) -> float:
        """The step's time outside the graphs' runs: scheduling, batch building, sampling on the host, accounting."""
        return self.total_s - self.graphs_s

    def __add__(self, other: PhaseSeconds) -> PhaseSeconds:
        return PhaseSeconds(
            self.schedule_s + other.schedule_s,
            self.moves_s + other.moves_s,
            self.run_s + other.run_s,
            self.update_s + other.update_s,
            self.graphs_s + other.graphs_s,
        )


@dataclass(frozen=True)
class StepTrace:
    """What the last `step()` did, for tools that time or inspect it: the rows it ran, its KV
    moves and the time of each phase."""

    rows: tuple[ScheduledRow, ...] = ()
    num_moves: int = 0
    num_lost: int = 0
    seconds: PhaseSeconds = PhaseSeconds()
    repeated: bool = False  # the last step's rows one token on, not scheduled (wicore.engine.steady)
