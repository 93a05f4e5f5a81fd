"""A study's unit of work: :class:`StudyJob`, one run of one rung (the bottom of the study
package: the rungs map a job to a run spec, the planner makes and groups them)."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.experiments.results import part_name


@dataclass(frozen=True)
class StudyJob:
    """One run of the study: ``phase`` (``calib`` or ``study``), ``rung``, ``rule``, step size
    ``lr``, ``epochs`` (mu) and base ``seed`` (the paired seed of a rung without replicates; 0
    where one spec trains every paired seed). :attr:`part` names its result part."""

    phase: str
    rung: str
    rule: str
    lr: float
    epochs: int
    seed: int

    @property
    def part(self) -> str:
        """The job's part file name (``<phase>__<rung>__<rule>__lr=<lr>__mu=<mu>__s<seed>``):
        parts on disk are found again by it, so it never changes."""
        lr, mu = f"lr={self.lr!r}", f"mu={self.epochs}"
        return part_name(self.phase, self.rung, self.rule, lr, mu, f"s{self.seed}")

    @property
    def point(self) -> tuple[str, str, str, float, int]:
        """Everything but the seed: the jobs of one point may run as one group."""
        return self.phase, self.rung, self.rule, self.lr, self.epochs
