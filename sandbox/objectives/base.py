"""The objective contract, the registry and the shared helpers every objective uses.

An objective is a callable object built with its hyperparameters as keyword arguments::

    obj = get_objective("ppo_clip", eps_low=0.2, eps_high=0.28)
    out = obj(logp, logp_old, adv, mask, generator=gen)

and returns an :class:`ObjectiveOutput` with a per-token ``loss`` ``[B, T]`` (0 where the mask is 0),
the realised gradient coefficient ``coef = -dloss/dlogp`` (detached) and a dict of 0-d metric
tensors. Objectives never call ``.item()`` and never touch global RNG.

Notation (docs/objectives.md §1): ``log_ratio = clamp(logp - logp_old, -20, 20)``
(:func:`log_ratio`, the one clamp, :data:`LOG_RATIO_CLAMP`), ``r = exp(log_ratio)``,
``l = 1 - eps_low``, ``u = 1 + eps_high``. The hard-clip dead zone is ``Z_hi = {A > 0, r > u}`` and
``Z_lo = {A < 0, r < l}``. The clamp is a true clamp, as in verl: a token whose raw log-ratio lies
outside ±20 gets no gradient through ``r`` (its ``coef`` reports 0).

A call has three stages: :func:`check_inputs` (shapes, devices, dtypes: Python only, no device
read), :func:`check_values` (finite values, a 0/1 mask that is not empty: one device->host read,
skipped with ``validate=False``) and :meth:`Objective.draw` (the random draws of stochastic rules,
from ``generator``), all eager; then :meth:`Objective.forward`, a pure function of tensors that
``torch.compile(fullgraph=True)`` captures whole (see :meth:`Objective.compile`).
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0
"""Bound on ``|logp - logp_old|`` before ``exp`` (docs/objectives.md §1), for the objectives, the
KL estimators and the rollout correction alike: ``exp(20) ~ 4.9e8`` stays finite in float32 and
bf16. verl uses the same bound (its ``SAFETY_BOUND``)."""

Zone = tuple[Tensor, Tensor]  # (Z_lo, Z_hi) boolean masks
CoefFn = Callable[[], Tensor]  # the realised coef, computed on demand
_T = TypeVar("_T")


class ObjectiveOutput:
    """What every objective returns.

    Attributes:
        loss: ``[B, T]`` per-token loss, 0 where ``mask == 0``. Aggregate it with
            :func:`sandbox.aggregate.aggregate`.
        coef: ``[B, T]`` detached gradient coefficient, ``-dloss/dlogp`` as realised in this call
            (including this call's random draws). Computed on first access, from detached
            tensors kept by the call, so a training loop that never reads it pays nothing.
        metrics: 0-d tensors (no host sync): clip fractions, ratio statistics, k3, ...
    """

    __slots__ = ("_coef", "loss", "metrics")

    def __init__(
        self, loss: Tensor, coef: Tensor | Callable[[], Tensor], metrics: dict[str, Tensor]
    ) -> None:
        self.loss = loss
        self._coef = coef
        self.metrics = metrics

    @property
    def coef(self) -> Tensor:
        if callable(self._coef):
            self._coef = self._coef().detach()
        return self._coef

    def __repr__(self) -> str:
        return f"ObjectiveOutput(loss={tuple(self.loss.shape)}, metrics={sorted(self.metrics)})"


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------

_REGISTRY: dict[str, type[Objective]] = {}


def register_objective(name: str) -> Callable[[type[Objective]], type[Objective]]:
    """Class decorator: register an :class:`Objective` subclass under ``name``."""

    def wrap(cls: type[Objective]) -> type[Objective]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"objective name {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available_objectives() -> list[str]:
    """Every registered objective name, sorted."""
    return sorted(_REGISTRY)


def objective_class(name: str) -> type[Objective]:
    """The class registered under ``name`` (no presets). Raises ``ValueError`` if unknown."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown objective {name!r}; valid names: {', '.join(available_objectives())}"
        ) from None


def build_objective(name: str, params: dict[str, Any]) -> Objective:
    """Instantiate a registered objective, turning unknown keywords into a clear ``ValueError``."""
    cls = objective_class(name)
    valid = cls.param_names()
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for objective {name!r}; "
            f"valid parameters: {', '.join(valid) or '(none)'}"
        )
    return cls(**params)


# --------------------------------------------------------------------------------------------------
# Validation helpers (hyperparameters)
# --------------------------------------------------------------------------------------------------


def check_range(
    name: str,
    value: float,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Return ``float(value)`` if it lies in the interval, else raise a ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    bad = not math.isfinite(value)
    if low is not None:
        bad |= value <= low if low_open else value < low
    if high is not None:
        bad |= value >= high if high_open else value > high
    if bad:
        lo = "(-inf" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "inf)" if high is None else f"{high:g}" + (")" if high_open else "]")
        raise ValueError(f"{name} must lie in {lo}, {hi}, got {value!r}")
    return value


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------------
# Input preparation (tensors)
# --------------------------------------------------------------------------------------------------


class lazy(Generic[_T]):
    """``functools.cached_property`` without its lock, which ``torch.compile`` cannot trace (Python
    3.11): computed on first access, then stored on the instance."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


#: The compute dtype (``>= float32``: bf16 inputs are computed in float32) of common input dtypes,
#: without a call to ``torch.promote_types`` per objective call.
_COMPUTE_DTYPE = {torch.float32: torch.float32, torch.float64: torch.float64}


def _cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, without the call where it would return ``x`` (the objectives' hot path
    makes several per call)."""
    return x if x.dtype == dtype else x.to(dtype)


def _detached(x: Tensor) -> Tensor:
    """``x.detach()``, without the call for a tensor that records no graph."""
    return x.detach() if x.requires_grad else x


class Batch:
    """The inputs in the compute dtype (``>= float32``), with masked positions neutralised.

    ``raw_lr = logp - logp_old`` (unclamped, carries the graph) and ``adv`` are 0 at masked
    positions, so padding contributes neither loss nor gradient, whatever garbage (NaN, ±inf) it
    holds; ``logp`` (sanitised the same way) and the other derived tensors are built only for the
    rules that need them. ``mask`` may be ``None`` (every token valid) or of any dtype (nonzero is
    valid; :func:`check_values` insists on 0/1).

    ``groups=G`` (batch-statistic objectives only) splits the rows into ``G`` equal consecutive
    blocks, independent batches stacked into one call: ``n_valid`` and every batch statistic
    (:meth:`total`, :meth:`count`) are then ``[G]``, one per block, so one call computes what
    ``G`` calls on the blocks would, without a Python loop.
    """

    def __init__(
        self,
        logp: Tensor,
        logp_old: Tensor,
        adv: Tensor,
        mask: Tensor | None,
        groups: int | None = None,
    ) -> None:
        dtype = _COMPUTE_DTYPE.get(logp.dtype) or torch.promote_types(logp.dtype, torch.float32)
        if mask is None:
            mask = torch.ones_like(logp, dtype=torch.bool)
        elif mask.dtype != torch.bool:
            mask = mask != 0
        logp, logp_old = _cast(logp, dtype), _cast(_detached(logp_old), dtype)
        self._logp_in, self._logp_old_in = logp, logp_old
        self.raw_lr = torch.where(mask, logp - logp_old, 0.0)  # [B, T], 0 where masked, graph
        self.adv = torch.where(mask, _cast(_detached(adv), dtype), 0.0)  # [B, T], from [B, 1]
        self.mask = mask  # [B, T] bool
        self.groups = groups
        self.n_valid = self.count(mask).to(dtype)  # 0-d (or [G]), no int64 copy

    def total(self, x: Tensor) -> Tensor:
        """Sum of ``x`` (``[B, ...]``): 0-d, or ``[G]`` (one per block of rows) with groups."""
        return x.sum() if self.groups is None else x.reshape(self.groups, -1).sum(-1)

    def count(self, flags: Tensor) -> Tensor:
        """Number of true entries of ``flags`` (``[B, ...]``): 0-d, or ``[G]`` with groups."""
        if self.groups is None:
            return torch.count_nonzero(flags)
        return torch.count_nonzero(flags.reshape(self.groups, -1), dim=-1)

    def spread(self, stat: Tensor) -> Tensor:
        """A statistic of :meth:`total`'s shape, broadcastable against ``[B, T]``: itself when
        ungrouped, else ``[B, 1]`` (each row gets its block's value)."""
        if self.groups is None:
            return stat
        rows = self.mask.shape[0] // self.groups
        return stat[:, None].expand(self.groups, rows).reshape(-1, 1)

    @property
    def group_numel(self) -> int:
        """Entries of ``[B, T]`` per block (all of them when ungrouped)."""
        return self.mask.numel() // (self.groups or 1)

    @lazy
    def n(self) -> Tensor:
        """0-d ``max(n_valid, 1)``: the denominator of every mean over valid tokens."""
        return self.n_valid.clamp(min=1)

    @lazy
    def maskf(self) -> Tensor:
        """``[B, T]`` the mask in the compute dtype."""
        return self.mask.to(self.raw_lr.dtype)

    @lazy
    def logp(self) -> Tensor:
        """``[B, T]`` log pi_theta, 0 where masked (carries the graph)."""
        return torch.where(self.mask, self._logp_in, 0.0)

    @lazy
    def logp_old(self) -> Tensor:
        return torch.where(self.mask, self._logp_old_in, 0.0)

    @lazy
    def neg_adv(self) -> Tensor:
        return -self.adv

    @lazy
    def adv_pos(self) -> Tensor:
        """``A > 0`` (False on padding)."""
        return self.adv > 0

    @lazy
    def adv_neg(self) -> Tensor:
        """``A < 0`` (False on padding)."""
        return self.adv < 0


def _check_tensor(name: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def check_inputs(
    logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Check types, shapes and devices (Python only: no device read, free in a hot loop).

    Returns the inputs with ``adv`` as ``[B, T]`` or ``[B, 1]``: an ``adv`` of shape ``[B]`` is
    read as ``[B, 1]`` (one advantage per sequence, broadcast over its tokens).
    """
    _check_tensor("logp", logp)
    _check_tensor("logp_old", logp_old)
    _check_tensor("adv", adv)
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [B, T], got {tuple(logp.shape)}")
    B, T = logp.shape
    if logp_old.shape != logp.shape:
        raise ValueError(
            f"logp_old must have the shape of logp {(B, T)}, got {tuple(logp_old.shape)}"
        )
    if adv.dim() == 1 and adv.shape[0] == B:
        adv = adv[:, None]
    if adv.dim() != 2 or adv.shape[0] != B or adv.shape[1] not in (1, T):
        raise ValueError(
            f"adv must have shape [B, T], [B, 1] or [B] with (B, T) = {(B, T)}, "
            f"got {tuple(adv.shape)}"
        )
    if mask is not None:
        _check_tensor("mask", mask)
        if mask.shape != logp.shape:
            raise ValueError(f"mask must have the shape of logp {(B, T)}, got {tuple(mask.shape)}")
    for name, x in (("logp_old", logp_old), ("adv", adv), ("mask", mask)):
        if x is not None and x.device != logp.device:
            raise ValueError(f"{name} is on {x.device} but logp is on {logp.device}")
    if not logp.is_floating_point():
        raise ValueError(f"logp must be a floating-point tensor, got {logp.dtype}")
    return logp, logp_old, adv, mask


def check_groups(groups: Any, rows: int) -> int | None:
    """``groups`` if it is ``None`` or a positive integer dividing the ``rows`` of the batch, else
    a ``ValueError`` naming it (Python only)."""
    if groups is None:
        return None
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or rows % groups:
        raise ValueError(f"groups must be a positive divisor of B={rows}, got {groups!r}")
    return groups


def check_values(
    logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor | None, groups: int | None = None
) -> None:
    """Raise a ``ValueError`` naming the argument unless the mask holds only 0 and 1 (or is bool),
    is not empty (nor is any of its ``groups`` blocks of rows), and ``logp``, ``logp_old`` and
    ``adv`` are finite at its valid positions.

    One reduction and one device->host read; the message is worked out only on failure. A hot loop
    whose inputs are known to be clean skips it (``validate=False``).
    """
    with torch.no_grad():
        dtype = torch.promote_types(logp.dtype, torch.float32)
        if mask is None:
            valid, ok = torch.ones_like(logp, dtype=torch.bool), True
        elif mask.dtype == torch.bool:
            valid, ok = mask, True
        else:
            valid, ok = mask != 0, ((mask == 0) | (mask == 1)).all()
        # a NaN/Inf at a valid position makes the sum non-finite (masked positions are 0)
        total = torch.where(valid, logp.detach() - logp_old.detach(), 0.0).sum(dtype=dtype)
        total = total + torch.where(valid, adv.detach(), 0.0).sum(dtype=dtype)
        G = groups or 1
        ok = torch.isfinite(total) & valid.reshape(G, -1).any(-1).all() & ok
        if not bool(ok):
            _raise_bad_values(logp.detach(), logp_old.detach(), adv.detach(), mask, valid, G)


def _raise_bad_values(
    logp: Tensor, logp_old: Tensor, adv: Tensor, mask: Tensor | None, valid: Tensor, groups: int
) -> None:
    if mask is not None and mask.dtype != torch.bool:
        bad = mask[(mask != 0) & (mask != 1)]
        if bad.numel():
            raise ValueError(
                f"mask must hold only 0 and 1 (or be bool), got values {bad.unique()[:5].tolist()}"
            )
    if not bool(valid.any()):
        raise ValueError("mask is empty: no valid token to compute a loss on")
    empty = (~valid.reshape(groups, -1).any(-1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(
            f"mask is empty in block(s) {empty[:5]} of groups={groups}: no valid token there"
        )
    for name, x in (("logp", logp), ("logp_old", logp_old), ("adv", adv)):
        if bool((~torch.isfinite(x) & valid).any()):
            raise ValueError(f"{name} contains NaN or Inf at valid (mask == 1) positions")
    raise ValueError("logp - logp_old is not finite at a valid position (e.g. -inf - -inf)")


# --------------------------------------------------------------------------------------------------
# Shared maths
# --------------------------------------------------------------------------------------------------


def log_ratio(logp: Tensor, logp_old: Tensor) -> Tensor:
    """``clamp(logp - logp_old, ±20)``: the one log-ratio every objective uses (docs/objectives.md
    §1)."""
    return (logp - logp_old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def masked_mean(x: Tensor, maskf: Tensor, n: Tensor | None = None) -> Tensor:
    n = maskf.sum() if n is None else n
    return (x * maskf).sum() / n.clamp(min=1)


def valid_share(flags: Tensor, b: Batch) -> Tensor:
    """Share of valid tokens where ``flags`` (bool, False on padding) holds (``[G]`` if grouped)."""
    return b.count(flags).to(b.n_valid.dtype) / b.n


def sequence_log_ratio(b: Batch) -> Tensor:
    """GSPO-token log-ratio: value ``log s_i = clamp(mean_t log r_it, ±20)``, gradient 1 per token.

    ``log s_it = sg(log s_i) + logp_t - sg(logp_t)`` (GSPO, arXiv 2507.18071, eq. 11), so that
    d log s_it / d logp_t = 1 and a per-token loss built on ``s_it`` has the per-sequence GSPO
    gradient when aggregated with ``seq-mean-token-mean``.
    """
    with torch.no_grad():
        lengths = torch.count_nonzero(b.mask, dim=-1)[:, None].to(b.raw_lr.dtype).clamp(min=1)
        seq_lr = b.raw_lr.sum(-1, keepdim=True) / lengths
        seq_lr = seq_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return seq_lr + (b.logp - b.logp.detach())


def dead_zone(ratio: Tensor, adv: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """Boolean masks ``Z_lo = {A < 0, r < low}`` and ``Z_hi = {A > 0, r > high}`` (detached).

    Padding has ``adv = 0``, so it is never in the dead zone."""
    ratio = ratio.detach()
    return (adv < 0) & (ratio < low), (adv > 0) & (ratio > high)


def ratio_metrics(
    lr: Tensor, r: Tensor, b: Batch, token_lr: Tensor | None = None
) -> dict[str, Tensor]:
    """Statistics of the ratio the rule acts on (``lr`` and ``r = exp(lr)``: token or sequence
    level) over valid tokens, and ``kl_k3 = mean(r - 1 - log r)`` of the token ratio (``token_lr``,
    default ``lr``; 0 on padding), which estimates KL(pi_old || pi). ``[G]`` each with groups."""
    # every input detached (n_valid and the mask carry no graph): nothing here is recorded
    lr, r = _detached(lr), _detached(r)
    n = b.n
    n_pad = b.group_numel - b.n_valid
    if token_lr is None:  # token level: lr = 0 and r = 1 on padding, plain sums suffice
        ratio_sum = token_ratio_sum = b.total(r) - n_pad
        lr_sum = token_lr_sum = b.total(lr)  # one pass, for the mean and for k3
    else:
        token_lr = _detached(token_lr)
        ratio_sum = b.total(r * b.maskf)
        token_ratio_sum = b.total(token_lr.exp()) - n_pad
        lr_sum, token_lr_sum = b.total(lr * b.maskf), b.total(token_lr)
    lr_mean = lr_sum / n
    # One pass for both extremes: padding takes the valid mean, which lies between them.
    filled = torch.where(b.mask, lr, b.spread(lr_mean))
    if b.groups is None:
        lo, hi = torch.aminmax(filled)
    else:
        lo, hi = torch.aminmax(filled.reshape(b.groups, -1), dim=-1)
    return {
        "ratio_mean": ratio_sum / n,
        "ratio_max": hi.exp(),
        "ratio_min": lo.exp(),
        "kl_k3": (token_ratio_sum - token_lr_sum) / n - 1,
    }


def clip_metrics(z_lo: Tensor, z_hi: Tensor, b: Batch) -> dict[str, Tensor]:
    """Sign-aware dead-zone shares of valid tokens (identically 0 on-policy, where r = 1)."""
    return {"clip_low_frac": valid_share(z_lo, b), "clip_high_frac": valid_share(z_hi, b)}


# --------------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------------


class Objective:
    """Base class. Subclasses set the class attributes, validate parameters in ``__init__`` (keyword
    arguments with the paper's defaults) and implement :meth:`compute` (and, where a closed form
    exists, :meth:`expected_coef`; where the rule is random, :meth:`draw`).

    Class attributes:
        name: registry name (set by :func:`register_objective`).
        level: ``"token"`` or ``"sequence"`` (the importance ratio the clip acts on).
        stochastic: whether ``coef`` depends on random draws (then ``expected_coef`` is its mean).
        batch_statistic: whether a token's loss depends on the other tokens of the batch through
            a batch-wide statistic (Clip-Cov, KL-Cov rank tokens by covariance), so that the
            result changes when a batch is split or several independent batches (seeds) are
            stacked into one call: trainers pass ``groups=G`` (one call, each block of rows
            ranked on its own), or call such objectives once per independent batch.
        aggregation: the aggregation mode the paper uses (a recommendation; drivers may override).
        paper: arXiv id of the source.
    """

    name: ClassVar[str] = "objective"
    level: ClassVar[str] = "token"
    #: Whether the loss depends on logp through the (clamped) token ratio; False for CISPO-style
    #: ``-sg(w) * A * logp`` losses, which the ±20 clamp cannot cut.
    through_ratio: ClassVar[bool] = True
    stochastic: ClassVar[bool] = False
    batch_statistic: ClassVar[bool] = False
    #: Whether ``coef(r, c A) = c coef(r, A)`` for c > 0 (every clipping rule); False for a
    #: penalty that acts whatever A is (DRO), which exact Gaussian-reward expectations refuse.
    coef_homogeneous: ClassVar[bool] = True
    aggregation: ClassVar[str] = "token-mean"
    paper: ClassVar[str] = ""
    #: ``(loss_and_metrics, coef)`` compiled kernels, set by :meth:`compile`; ``None``: eager.
    _kernels: tuple[Callable[..., Any], Callable[..., Any]] | None = None
    _compile_options: dict[str, Any] | None = None

    # -- parameters ---------------------------------------------------------------------------------
    @classmethod
    def param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p for p in sig.parameters if p != "self"]

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        sig = inspect.signature(cls.__init__)
        return {k: p.default for k, p in sig.parameters.items() if k != "self"}

    @property
    def params(self) -> dict[str, Any]:
        """The hyperparameters of this instance (as resolved in ``__init__``)."""
        return {k: getattr(self, k) for k in self.param_names()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        compiled = "" if self._kernels is None else ", compiled"
        return f"{type(self).__name__}({args}{compiled})"

    # -- call -----------------------------------------------------------------------------------------
    def __call__(
        self,
        logp: Tensor,
        logp_old: Tensor,
        adv: Tensor,
        mask: Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
        validate: bool = True,
        groups: int | None = None,
    ) -> ObjectiveOutput:
        """Per-token loss, realised gradient coefficient and metrics.

        Args:
            logp: ``[B, T]`` log pi_theta of the sampled tokens (carries the graph).
            logp_old: ``[B, T]`` log-probs under the sampling policy (no gradient flows into it).
            adv: ``[B, T]``, ``[B, 1]`` or ``[B]`` advantages (``[B]`` is read as ``[B, 1]``: one
                per sequence); no gradient flows into it.
            mask: ``[B, T]`` 1 for real tokens, 0 for padding (bool, or a number dtype holding
                only 0 and 1); ``None`` means every token is valid.
            generator: the only source of randomness for stochastic objectives (a
                ``torch.Generator`` on the tensors' device). ``None`` uses a generator owned by
                the objective, seeded by its ``seed`` (never the global RNG).
            validate: check values (mask holds only 0/1 and is not empty, finite inputs at valid
                positions); costs one device->host read. With ``validate=False`` nothing reads
                the device: a nonzero mask entry counts as valid, an empty mask gives 0.
            groups: for a ``batch_statistic`` objective, ``G`` independent batches stacked in
                one call: the rows split into ``G`` equal consecutive blocks (``G`` must divide
                ``B``) and each block's statistics and selection use only its own rows, as ``G``
                separate calls would (the draws of all blocks are made at once); every metric is
                then ``[G]``, one per block. Ignored (after its check) by other objectives,
                whose per-token loss does not depend on the other rows.
        """
        logp, logp_old, adv, mask = check_inputs(logp, logp_old, adv, mask)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator or None, got {generator!r}")
        groups = check_groups(groups, logp.shape[0])
        if not self.batch_statistic:
            groups = None  # a row's loss does not depend on the other rows
        if validate:
            check_values(logp, logp_old, adv, mask, groups)
        noise = self.draw(logp, generator)
        if self._kernels is None:
            return ObjectiveOutput(*self.forward(logp, logp_old, adv, mask, noise, groups))
        loss_and_metrics, coef = self._kernels
        loss, metrics = loss_and_metrics(logp, logp_old, adv, mask, noise, groups)
        args = (logp.detach(), logp_old, adv, mask, noise, groups)
        return ObjectiveOutput(loss, lambda: coef(*args), metrics)

    def forward(
        self,
        logp: Tensor,
        logp_old: Tensor,
        adv: Tensor,
        mask: Tensor | None,
        noise: Tensor | None,
        groups: int | None = None,
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        """The tensor computation of a call, on checked inputs and this call's draws ``noise``:
        ``(loss, coef function, metrics)``. No host sync, no Python branch on tensor values, no
        data-dependent shape: ``torch.compile(fullgraph=True)`` captures it whole."""
        return self.compute(Batch(logp, logp_old, adv, mask, groups), noise)

    def compute(
        self, b: Batch, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:  # pragma: no cover - abstract
        """``(loss, coef, metrics)``; ``coef`` is a tensor or a zero-argument function giving it."""
        raise NotImplementedError

    # -- compilation ----------------------------------------------------------------------------------
    def compile(self, **options: Any) -> Objective:
        """Run this objective's tensor computation (:meth:`forward`) through
        ``torch.compile(fullgraph=True, **options)``; returns ``self``.

        The input checks (and, with ``validate=True``, the value check and its one host read)
        and the random draws of stochastic objectives stay eager, outside the compiled region
        (a ``torch.Generator`` cannot be traced): the compiled kernel receives the uniforms drawn
        from ``generator`` exactly as the eager path draws them, so compiled and eager calls give
        the same values for the same generator state. ``out.coef`` is a second compiled kernel,
        run only when read. ``options`` go to :func:`torch.compile` (``backend``, ``mode``,
        ``dynamic``, ...). Shapes that change from call to call (micro-batches of different
        lengths) make torch recompile once and then treat them as dynamic.
        """
        self._compile_options = dict(options)
        self._kernels = (
            torch.compile(_own_code(self._loss_and_metrics), fullgraph=True, **options),
            torch.compile(_own_code(self._coef), fullgraph=True, **options),
        )
        return self

    def _loss_and_metrics(self, *args: Tensor | int | None) -> tuple[Tensor, dict[str, Tensor]]:
        loss, _, metrics = self.forward(*args)
        return loss, metrics

    def _coef(self, *args: Tensor | int | None) -> Tensor:
        coef = self.forward(*args)[1]
        return coef() if callable(coef) else coef

    def __getstate__(self) -> dict[str, Any]:
        # compiled kernels do not pickle (multiprocessing workers): rebuilt on unpickling
        state = dict(self.__dict__)
        state.pop("_kernels", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._compile_options is not None:
            self.compile(**self._compile_options)

    # -- closed forms ---------------------------------------------------------------------------------
    def clamp_passes(self, raw_log_ratio: Tensor) -> Tensor:
        """Bool: where the ±20 log-ratio clamp lets this rule's gradient through. Everywhere for
        sequence-level rules (their clamp is on a detached value) and for rules whose loss does
        not go through the ratio (CISPO); ``|log r| <= 20`` otherwise. ``expected_coef`` does not
        apply this cut; exact computations multiply by it."""
        if self.level == "token" and self.through_ratio:
            return raw_log_ratio.abs() <= LOG_RATIO_CLAMP
        return torch.ones_like(raw_log_ratio, dtype=torch.bool)

    def sequence_ratio(self, raw_log_ratio: Tensor, mask: Tensor) -> Tensor:
        """``[B]`` the sequence ratio a sequence-level rule's :meth:`expected_coef` takes, from the
        raw token log-ratios ``[B, T]`` (0 on padding) and the bool ``mask``: GSPO's length-
        normalised ``exp(clamp(mean_t log r_t, ±20))`` unless the rule says otherwise (VESPO: the
        product of the token ratios). Detached; :mod:`sandbox.exact` and the tests read it."""
        with torch.no_grad():
            lengths = mask.sum(-1).to(raw_log_ratio.dtype).clamp(min=1)
            mean = torch.where(mask, raw_log_ratio, 0.0).sum(-1) / lengths
            return mean.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()

    def has_expected_coef(self) -> bool:
        """Whether :meth:`expected_coef` has a closed form (False for batch-statistic rules)."""
        try:
            self.expected_coef(1.0, 1.0)
        except NotImplementedError:
            return False
        return True

    def expectation(self) -> Objective | None:
        """The deterministic rule whose coefficient is this rule's expected one, or ``None``.

        For a stochastic rule with a closed-form mean, the objective ``D`` with
        ``D.coef(r, A) = self.expected_coef(r, A)`` for every ``(r, A)`` and no randomness of its
        own: given a batch, ``D``'s gradient is the expectation over this rule's draws of this
        rule's gradient (the loss assembly is linear in the per-token coefficients), so
        ``g_rule - g_D`` is the rule's own noise (NSR -> NSR-decay with the same parameters).
        ``None`` for a rule that is already deterministic and for one without a closed form
        (Clip-Cov's batch ranking).
        """
        return None

    def expected_coef(self, ratio: Tensor | float, adv: Tensor | float) -> Tensor:
        """Closed-form ``E[coef | r, A]`` over the objective's own randomness.

        ``ratio`` is the ratio the rule acts on (the token ratio, or the sequence ratio s_i for
        sequence-level rules); numbers or tensors of broadcastable shapes (else ``ValueError``).
        Raises ``NotImplementedError`` for rules that depend on batch statistics (clip_cov,
        kl_cov).
        """
        raise NotImplementedError(f"{self.name} has no closed-form expected coefficient")

    # -- randomness -----------------------------------------------------------------------------------
    def draw(self, logp: Tensor, generator: torch.Generator | None) -> Tensor | None:
        """This call's random draws (eager, from ``generator``), handed to :meth:`forward` as
        ``noise``: ``None`` for deterministic rules. Stochastic rules draw i.i.d. U(0, 1) in the
        compute dtype, so that the compiled and the eager path see the same numbers."""
        return None

    def _uniform(
        self, shape: tuple[int, ...], logp: Tensor, generator: torch.Generator | None
    ) -> Tensor:
        gen = self._generator(generator, logp.device)
        dtype = torch.promote_types(logp.dtype, torch.float32)
        return torch.rand(shape, generator=gen, device=logp.device, dtype=dtype)

    def _generator(
        self, generator: torch.Generator | None, device: torch.device
    ) -> torch.Generator:
        if generator is not None:
            if generator.device.type != device.type:
                raise ValueError(
                    f"generator is on {generator.device} but the tensors are on {device}"
                )
            return generator
        own = getattr(self, "_own_generators", None)
        if own is None:
            own = self._own_generators = {}
        key = str(device)
        if key not in own:
            own[key] = torch.Generator(device=device).manual_seed(int(getattr(self, "seed", 0)))
        return own[key]


def _own_code(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` rebound to a copy of its function with a code object of its own.

    ``torch.compile`` keeps its compiled graphs, and its limit of 8 recompilations, per code
    object; every objective instance runs the same methods, so without this the ninth compiled
    objective of a process (a sweep over rules) would fail under ``fullgraph=True``."""
    fn = method.__func__
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{method.__self__.name}")
    own = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return types.MethodType(own, method.__self__)


def _broadcast_shape(a: torch.Size, b: torch.Size) -> tuple[int, ...] | None:
    """The broadcast of two shapes, or ``None`` if they do not broadcast: what
    ``torch.broadcast_shapes`` gives for two concrete shapes, in plain Python (torch's goes
    through its symbolic-shape machinery, ~70 us a call: most of a closed form's cost on small
    tensors in :mod:`sandbox.exact`'s loops)."""
    if a == b:
        return tuple(a)
    ndim = max(len(a), len(b))
    a = (1,) * (ndim - len(a)) + tuple(a)
    b = (1,) * (ndim - len(b)) + tuple(b)
    shape = []
    for x, y in zip(a, b, strict=True):
        if x != y and x != 1 and y != 1:
            return None
        shape.append(y if x == 1 else x)
    return tuple(shape)


def as_tensor_pair(ratio: Tensor | float, adv: Tensor | float) -> tuple[Tensor, Tensor]:
    """Broadcast ``ratio`` and ``adv`` (numbers or tensors) to tensors of a common float dtype."""
    for name, x in (("ratio", ratio), ("adv", adv)):
        if isinstance(x, bool) or not isinstance(x, Tensor | int | float):
            raise ValueError(f"{name} must be a number or a torch.Tensor, got {type(x).__name__}")
    # Python numbers become float64 (the closed forms are cheap; keep them exact).
    ratio = ratio if isinstance(ratio, Tensor) else torch.tensor(ratio, dtype=torch.float64)
    adv = adv if isinstance(adv, Tensor) else torch.tensor(adv, dtype=torch.float64)
    dtype = torch.promote_types(torch.promote_types(ratio.dtype, adv.dtype), torch.float32)
    shape = _broadcast_shape(ratio.shape, adv.shape)
    if shape is None:
        raise ValueError(
            f"ratio {tuple(ratio.shape)} and adv {tuple(adv.shape)} must have broadcastable shapes"
        )
    # Each step only where it changes something (the exact flows call this in their loops).
    if ratio.dtype != dtype:
        ratio = ratio.to(dtype)
    if adv.dtype != dtype or adv.device != ratio.device:
        adv = adv.to(device=ratio.device, dtype=dtype)
    if bool((ratio <= 0).any()):  # before the expansion: the same values, fewer of them
        raise ValueError("ratio must be positive")
    if ratio.shape != shape:
        ratio = ratio.expand(shape)
    if adv.shape != shape:
        adv = adv.expand(shape)
    return ratio, adv


class RatioObjective(Objective):
    """An objective defined per token by a surrogate of the importance ratio.

    Subclasses give the loss (:meth:`surrogate`) and the closed-form gradient weight g
    (:meth:`weight`, ``coef = g * A``); the base computes the ratio (token or sequence level), the
    dead zone of :meth:`bounds` once, the realised ``coef``, the clip fractions and the ratio
    statistics. Stochastic, batch-dependent or hand-fused rules override :meth:`realise`.
    """

    def bounds(self) -> tuple[float, float] | None:
        """``(l, u)``: the ratio interval whose sign-aware violations are the dead zone Z."""
        return None

    def surrogate(self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None) -> Tensor:
        """Per-token loss. ``r`` carries the graph, ``rd`` is its detached value, ``z`` the dead
        zone ``(Z_lo, Z_hi)`` when the rule has bounds."""
        raise NotImplementedError

    def weight(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Tensor:
        """Closed-form gradient weight g(r, A) (realised; the expectation for stochastic rules).
        ``z`` is the precomputed dead zone of ``(ratio, adv)``, if at hand."""
        raise NotImplementedError

    def zone(self, ratio: Tensor, adv: Tensor, z: Zone | None = None) -> Zone:
        return z if z is not None else dead_zone(ratio, adv, *self.bounds())

    def realise(
        self, r: Tensor, rd: Tensor, b: Batch, z: Zone | None, noise: Tensor | None
    ) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        """``(loss, coef, extra metrics)`` for this call; ``coef`` (before the clamp's cut-off) is
        a function of detached tensors, evaluated only if ``out.coef`` is read. ``noise`` holds
        this call's draws (:meth:`Objective.draw`)."""
        return self.surrogate(r, rd, b, z), lambda: b.adv * self.weight(rd, b.adv, z), {}

    def expected_coef(self, ratio: Tensor | float, adv: Tensor | float) -> Tensor:
        ratio, adv = as_tensor_pair(ratio, adv)
        return adv * self.weight(ratio, adv)

    def compute(self, b: Batch, noise: Tensor | None) -> tuple[Tensor, CoefFn, dict[str, Tensor]]:
        token_lr = b.raw_lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # = log_ratio(logp, logp_old)
        sequence = self.level == "sequence"
        lr = sequence_log_ratio(b) if sequence else token_lr  # the sequence clamp is detached
        r = lr.exp()
        rd = r.detach()
        bounds = self.bounds()
        z = None
        if bounds is not None:  # dead_zone(rd, b.adv, *bounds), with the batch's sign masks
            z = (b.adv_neg & (rd < bounds[0]), b.adv_pos & (rd > bounds[1]))
        loss, coef, extra = self.realise(r, rd, b, z, noise)
        if self.through_ratio and not sequence:
            realised = coef

            def coef() -> Tensor:  # the clamp passes gradient only where it did not bind
                return torch.where(self.clamp_passes(b.raw_lr.detach()), realised(), 0.0)

        metrics = ratio_metrics(lr, rd, b, token_lr if sequence else None)
        if z is not None:
            metrics.update(clip_metrics(*z, b))
        metrics.update(extra)
        return loss, coef, metrics
