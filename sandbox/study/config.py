"""The claims study's settings (:class:`StudyConfig`), its constants, and a study folder's record
(``config.json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sandbox.configs import arg, check_device, check_number
from sandbox.experiments.results import write_text
from sandbox.experiments.runs import objective_of
from sandbox.streams import RNG

from .claims import CLAIMS, Claim, claim_from_record, claim_record, claim_rules
from .rungs import (
    RUNGS,
    SECTIONS,
    check_fields,
    members_per_job,
    mu_grid,
    section_settings,
    unknown,
)

#: The reference rule every rung is calibrated with.
REFERENCE = "dapo"
#: A rule whose gap is a step-size effect (its bounds are 1e3 x narrower): the page names its
#: zeroed gradient mass apart from the hard clips'.
STEP_SIZE_RULE = "gspo"
#: The smallest effect of interest per metric (the power line and the "contradicted" margin):
#: 0.02 pass@1 (a gap a paper would report), 0.05 nats of entropy.
MARGINS = {"final_pass": 0.02, "reward_auc": 0.02, "final_entropy": 0.05}
#: A rung measures one axis where the rules' means correlate with the gradient mass they zero
#: beyond this |r| with 95% confidence (:func:`.analysis.one_axis`): it then ranks rules by how
#: much gradient they discard, i.e. by effective step size, whatever else they do.
ONE_AXIS = 0.8
#: Rules whose clip share stays below this are flagged: their bounds never bind.
NEVER_BINDS = 1e-3
#: Mechanism columns averaged per run (the loss's gradient-mass metrics, the objective's shares).
MECHANISM = (
    "clip_frac",
    "rescue_frac",
    "grad_mass_zero_lo",
    "grad_mass_zero_hi",
    "grad_mass_rescued",
)


@dataclass
class StudyConfig:
    """Settings of the claims study; every field is a flag of ``python -m llm.claims``."""

    rules: list[str] = arg(
        [*claim_rules(), STEP_SIZE_RULE],
        "rules (default: every claim's); a claim whose two rules are not both given is left out "
        "of the ledger, and a note on stderr names it",
    )
    rungs: list[str] = arg(["bandit_exact", "bandit_sampled", "tiny_tf"], "rungs, cheapest first")
    epochs: list[int] = arg(
        [2], "mu grid: epochs (x minibatches) calibration tries on the bandit and llm rungs"
    )
    minibatches: int = arg(2, "optimizer steps per epoch (all rungs)")
    group_size: int = arg(8, "G on the toy rungs")
    paper_aggregation: bool = arg(False, "each rule's own aggregation (default: token-mean)")
    target_low: float = arg(0.05, "calibration: lowest clip share of dapo")
    target_high: float = arg(0.10, "calibration: highest clip share of dapo")
    calib_seeds: int = arg(4, "calibration seeds per step size")
    calib_steps: int = arg(
        0,
        "calibration steps (0: the rung's own run length; the clip share falls as the policy "
        "sharpens, so a shorter window overstates it)",
    )
    control_seeds: int = arg(
        0,
        "step-size control (0: off): on this many paired seeds disjoint from the study's, every "
        "rule of a sampled toy rung runs at each step size of the rung's grid (at its calibrated "
        "mu); the one with the highest mean final_pass is the rule's own, and each rule then "
        "runs there on the study's seeds (ledger_control.csv)",
    )
    sections: dict[str, Any] = arg(
        {},
        "each rung's typed settings by section (sandbox.study.rungs: bandit, tf; llm from "
        "llm.claims), given as settings or mappings; a section not given has its defaults",
    )
    rng: str | None = arg(
        RNG,
        "the toy trainers' random-number scheme (sandbox.streams.RNG; recorded, not a flag): a "
        "study recorded with another, or None (made before it was recorded), does not run; "
        "--tables-only rebuilds its tables as they were made",
    )
    device: str = arg("cpu", "cpu | cuda")
    claims: list[dict[str, Any]] = arg(
        [], "claims of your own besides the papers' (records of sandbox.study.claims.Claim)"
    )
    dtype: str | None = arg(
        None,
        "float64: the sampled toy rungs in double precision (default: the trainers' float32)",
        choices=("float32", "float64"),
    )

    def __post_init__(self) -> None:
        self.epochs = mu_grid("epochs", self.epochs)
        if not isinstance(self.sections, Mapping):
            raise ValueError(f"sections must be a mapping of sections, got {self.sections!r}")
        for name in self.sections:
            if name not in SECTIONS:
                raise unknown("section", name, SECTIONS)
        given = dict(self.sections)
        self.sections = {name: section_settings(name, given.get(name)) for name in SECTIONS}
        if not isinstance(self.claims, list):
            raise ValueError(f"claims must be a list of claim records, got {self.claims!r}")
        self.claims = [claim_record(claim_from_record(c)) for c in self.claims]

    def validate(self) -> None:
        """``ValueError`` naming the first bad field, before anything runs or ``config.json`` is
        written."""
        self.check_claims()  # first: a claim's unknown rule is named with its claim
        if self.rng != RNG:
            raise ValueError(
                f"rng: this code trains with the random-number scheme {RNG!r}, got {self.rng!r} "
                "(a record of an earlier run: --tables-only rebuilds its tables)"
            )
        for name in self.rules:
            objective_of(name)  # ValueError listing the valid names
        if REFERENCE not in self.rules:
            raise ValueError(f"rules must include the reference rule {REFERENCE!r}")
        for rung in self.rungs:
            if rung not in RUNGS:
                raise unknown("rung", rung, RUNGS)
            members_per_job(self, rung)  # ValueError naming the rung's setting
        # the int fields (>= 1; group_size 2: group-relative advantages) and dtype's choices
        check_fields(self, low={"group_size": 2, "calib_steps": 0, "control_seeds": 0})
        check_number("target_low", self.target_low, above=None)
        check_number("target_high", self.target_high, above=None)
        if not 0 <= self.target_low < self.target_high <= 1:
            raise ValueError(
                f"target_low, target_high must satisfy 0 <= low < high <= 1, got "
                f"{self.target_low}, {self.target_high}"
            )
        mus = [mu for rung in self.rungs for mu in RUNGS[rung].epochs(self)]
        if min(self.epochs + mus) * self.minibatches < 2:
            raise ValueError("epochs x minibatches must be >= 2: on-policy no rule clips")
        check_device(self.device)
        for name in dict.fromkeys(RUNGS[rung].section for rung in self.rungs):
            check = getattr(self.sections[name], "check", None)
            if check is not None:
                check()  # ValueError naming the section's setting

    def section(self, name: str) -> Any:
        """The settings of section ``name`` (:mod:`.rungs`), e.g. ``config.section("tf")``."""
        if name not in self.sections:
            raise unknown("section", name, SECTIONS)
        return self.sections[name]

    def seeds(self, rung: str) -> int:
        """The paired seeds of ``rung``: its section's ``seeds``."""
        return self.section(RUNGS[rung].section).seeds

    def check_claims(self) -> None:
        """``ValueError`` for an own claim whose rule is unknown or not in ``rules``, or a claim
        name used twice (the papers' included)."""
        for claim in map(claim_from_record, self.claims):
            for rule in claim.rules:
                try:
                    objective_of(rule)
                except ValueError as exc:
                    raise ValueError(f"claim {claim.name}: {exc}") from None
                if rule not in self.rules:
                    raise ValueError(f"claim {claim.name}: rule {rule!r} is not in rules")
        names = [c.name for c in study_claims(self)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"claims: the name(s) {twice} are used twice (the papers' included)")


def study_claims(config: StudyConfig | None) -> tuple[Claim, ...]:
    """The claims a study's ledger tests: the papers' (:data:`.claims.CLAIMS`) and its own
    (``--claim``, ``--claims FILE``)."""
    return CLAIMS if config is None else (*CLAIMS, *map(claim_from_record, config.claims))


#: The key of a study folder's ``config.json`` that records each rung's calibrated point.
CALIBRATED = "calibrated"


def read_record(out: str | Path) -> tuple[StudyConfig, dict[str, tuple[float, int]] | None]:
    """A study folder's ``config.json``: its settings and, once calibrated, each rung's
    calibrated (step size, epochs); ``rng`` None where the record has none (made before)."""
    path = Path(out) / "config.json"
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable study record ({exc})") from None
    point = values.pop(CALIBRATED, None)
    values.setdefault("rng", None)
    try:
        config = StudyConfig(**values)
    except TypeError as exc:
        raise ValueError(f"{path}: not a study record of this version ({exc})") from None
    calibrated = None if point is None else {r: (float(v[0]), int(v[1])) for r, v in point.items()}
    return config, calibrated


def record_calibration(out: Path, config: StudyConfig, point: Mapping[str, tuple[float, int]]):
    """Write ``config.json`` with the calibrated point of every rung."""
    values = asdict(config)
    record = {**values, CALIBRATED: {r: [lr, mu] for r, (lr, mu) in point.items()}}
    write_text(json.dumps(record, indent=2, default=str), Path(out) / "config.json")


def joined_claims(
    recorded: Sequence[Mapping[str, Any]], given: Sequence[Mapping[str, Any]], out: str | Path
) -> list[dict[str, Any]]:
    """The claims a study folder ``out`` records, then those given now that it does not. A given
    claim of a recorded name that says something else is a ``ValueError``: a folder's claim is
    never replaced (its ledger rows would change meaning under the same name), on a run as on
    ``--tables-only``."""
    claims = {c["name"]: dict(c) for c in recorded}
    for c in given:
        if claims.setdefault(c["name"], dict(c)) != c:
            raise ValueError(
                f"claim {c['name']}: {out} records another claim of that name; rename it, or use "
                "another --out"
            )
    return list(claims.values())


def with_folder(config: StudyConfig, out: str | Path, force: bool = False) -> StudyConfig:
    """``config`` grown by what the study folder ``out`` already holds (unless ``force`` or a new
    folder): the union of its rules, rungs and own claims with the folder's, the folder's first,
    so a run of fewer or other rules adds to the folder's tables. A claim of a recorded name
    that says something else is refused (:func:`joined_claims`)."""
    path = Path(out) / "config.json"
    if force or not path.is_file() or not any((Path(out) / "parts").glob("*.parquet")):
        return config
    try:
        previous, _ = read_record(out)
    except ValueError:
        return config  # an unreadable record: this study alone (its record replaces it)
    rules = list(dict.fromkeys([*previous.rules, *config.rules]))
    rungs = list(dict.fromkeys([*previous.rungs, *config.rungs]))
    claims = joined_claims(previous.claims, config.claims, out)
    rules += [r for c in claims for r in (c["rule_a"], c["rule_b"]) if r not in rules]
    grown = replace(config, rules=rules, rungs=rungs, claims=claims)
    if (rules, rungs) != (config.rules, config.rungs):
        print(
            f"{out} holds a study of {len(previous.rules)} rules on {', '.join(previous.rungs)}: "
            f"this run adds to it (tables over {len(rules)} rules on {', '.join(rungs)}; a new "
            "--out for a study of its own)",
            file=sys.stderr,
            flush=True,
        )
    return grown


def rules_note(config: StudyConfig) -> str | None:
    """The line that names the claims the study's rules leave out (the ledger tests a claim
    only where both its rules run) and the rules they need; None when every claim is in."""
    claims = study_claims(config)
    left = [c for c in claims if not set(c.rules) <= set(config.rules)]
    if not left:
        return None
    names = ", ".join(c.name for c in left)
    needed = ", ".join(dict.fromkeys(r for c in left for r in c.rules if r not in config.rules))
    if len(left) < len(claims):
        return (
            f"note: --rules leaves out the claims {names} (they need the rules {needed}); the "
            f"ledger tests the other {len(claims) - len(left)}"
        )
    return (
        f"note: --rules leaves out every claim ({names}: they need the rules {needed}); the "
        "ledger will be empty (--claim NAME:A>B tests a claim of your own)"
    )
