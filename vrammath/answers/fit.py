"""Every answer for one setup, under the setup as given, and the recommendation beside them.

:func:`largest_micro_batch`, :func:`longest_sequence` and :func:`fewest_gpus` solve one estimate
on a budget (GPU and host) with :mod:`vrammath.answers.inverse`; :func:`fit` answers the questions asked of a setup -- does it fit, the largest micro-batch, the
longest sequence, the fewest data-parallel GPUs -- each under the ZeRO stage, offload and
recomputation the caller chose, on the GPU and, where states are offloaded, on the host
(offloaded bytes per rank x ranks per node against the node's system memory). Apart from those
answers it states the recommendation: the cheapest combination of stage, offload and
recomputation that fits at the setup's GPU count (:func:`~vrammath.answers.plan.cheapest_fit`).

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.compose.setup import Setup
>>> answer = fit(Setup(load_model("llama-3.1-8b"), zero=3, gpus=8, seq_len=4096, gpu="A100-80GB"))
>>> answer.batch.question, answer.given.setup.zero, answer.plan.label
('largest micro-batch', 3, 'ZeRO-1')
>>> answer.as_dict()["answers"]["largest_micro_batch"]["value"] == answer.batch.value
True
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from vrammath.answers.budget import (
    Budget,
    HostCheck,
    exact_bytes,
    gpu_terms,
    host_check,
    setup_budget,
)
from vrammath.answers.inverse import SEARCH_CAP, Method, Solution, largest, smallest
from vrammath.answers.plan import Plan, cheapest_fit, checked_setup, plan_label
from vrammath.answers.report import estimate_dict, estimate_table
from vrammath.compose.engines import RANKED_ENGINES
from vrammath.compose.estimate import Estimate, estimate
from vrammath.compose.setup import Setup, with_changes
from vrammath.notation.errors import InputError, warn_context
from vrammath.notation.fields import MAX_COUNT
from vrammath.notation.symbols import N_d, b, s
from vrammath.notation.units import fmt_bytes
from vrammath.terms.parallel import tensor_numels


def _checked(est: object, budget: Budget | None) -> tuple[Estimate, Budget]:
    if not isinstance(est, Estimate):
        raise InputError("est", "must be an Estimate (vrammath.estimate(setup))", got=est)
    return est, setup_budget(est.setup, budget)


def _host_need(est: Estimate, bud: Budget, unknown: sympy.Symbol, n: int) -> int:
    """Host bytes per node with ``unknown = n``: offloaded bytes per rank x ranks per node."""
    cpu = [c.expr for c in est.components if c.device == "cpu" and c.expr is not None]
    per_rank = exact_bytes(cpu, {**est.values, unknown: n})
    gpus = n if unknown == N_d else est.setup.gpus
    return per_rank * min(gpus * est.setup.tp * est.setup.pp, bud.gpus_per_node)


def _with_host(sol: Solution, est: Estimate, bud: Budget, step: int, *, grows: bool) -> Solution:
    """``sol`` with the host side checked: the answer must also fit the node's system memory.

    The host holds only offloaded states, which do not grow with ``b`` or ``s`` and shrink with
    ``N_d`` (``grows`` False): where the host is what binds, an exact search over multiples of
    ``step`` moves the answer until both sides fit.
    """
    if not any(c.device == "cpu" and c.expr is not None for c in est.components):
        return sol
    unknown, limit = sol.unknown, bud.host_bytes
    at = sol.value if sol.value is not None else est.values[unknown]

    def need(n: int | None) -> int | None:
        return None if n is None else _host_need(est, bud, unknown, n)

    host_at = need(at)
    if limit is None or sol.status == "none-fits" or (host_at is not None and host_at <= limit):
        return replace(
            sol, host_limit=limit, host_bytes=host_at, neighbour_host_bytes=need(sol.neighbour)
        )
    terms = gpu_terms(est)

    def gpu_at(n: int) -> int:
        return exact_bytes(terms, {**est.values, unknown: n})

    def both(k: int) -> bool:
        host = need(k * step)
        return host is not None and host <= limit and gpu_at(k * step) <= sol.limit

    def answer(k: int | None, neighbour_k: int | None) -> Solution:
        value = None if k is None else k * step
        neighbour = None if neighbour_k is None else neighbour_k * step
        return replace(
            sol,
            status="none-fits" if k is None else "ok",
            value=value,
            method="search",
            bytes=None if value is None else gpu_at(value),
            neighbour=neighbour,
            neighbour_bytes=None if neighbour is None else gpu_at(neighbour),
            host_limit=limit,
            host_bytes=need(value if value is not None else step),
            neighbour_host_bytes=need(neighbour),
        )

    if grows:  # largest b or s: the host binds from below, search down from the GPU answer
        if not both(1):
            return answer(None, None)
        lo, hi = 1, max(2, at // step)  # both(lo) holds, both(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if both(mid) else (lo, mid)
        return answer(lo, lo + 1)
    lo, hi = max(1, at // step), max(2, 2 * (at // step))  # fewest N_d: search up
    while not both(hi):
        lo, hi = hi, hi * 2
        if hi * step > SEARCH_CAP:
            return answer(None, None)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if both(mid) else (mid, hi)
    return answer(hi, hi - 1)


def largest_micro_batch(
    est: Estimate, budget: Budget | None = None, *, multiple_of: int = 1
) -> Solution:
    """The largest micro-batch ``b`` whose estimated GPU total fits ``budget``.

    ``budget`` defaults to the setup's GPU with :data:`~vrammath.answers.budget.DEFAULT_RESERVE_BYTES`
    reserved. While no estimated component depends on ``b`` the answer is ``unbounded``; see
    ``est.unestimated``. With offload, the node's host memory must hold the offloaded states.
    """
    return _largest(est, budget, b, multiple_of, "largest micro-batch")


def longest_sequence(
    est: Estimate, budget: Budget | None = None, *, multiple_of: int = 1
) -> Solution:
    """The longest sequence ``s`` (a multiple of ``multiple_of``) that fits ``budget``; an answer
    past the model's positions comes with a :class:`~vrammath.notation.errors.ContextWarning`."""
    sol = _largest(est, budget, s, multiple_of, "longest sequence")
    if sol.value is not None:
        spec = est.setup.model
        warn_context(spec.name, spec.past_context("longest_sequence", sol.value))
    return sol


def _largest(
    est: Estimate, budget: Budget | None, unknown: sympy.Symbol, multiple_of: int, question: str
) -> Solution:
    est, bud = _checked(est, budget)
    sol = largest(
        gpu_terms(est), est.values, unknown, bud.usable, multiple_of=multiple_of, question=question
    )
    return _with_host(sol, est, bud, multiple_of, grows=True)


def fewest_gpus(est: Estimate, budget: Budget | None = None, *, multiple_of: int = 1) -> Solution:
    """The fewest data-parallel GPUs ``N_d`` (a multiple of ``multiple_of``) that fit ``budget``.

    With ZeRO-0 nothing is sharded: the answer is 1 or nothing fits. With offload, the host side
    (offloaded bytes per rank x ranks per node) must fit the node's memory too.

    >>> from vrammath.compose.estimate import estimate
    >>> from vrammath.compose.setup import Setup
    >>> from vrammath.model.presets import load_model
    >>> from vrammath.answers.budget import budget
    >>> setup = Setup(load_model("llama-2-70b"), zero=3, gpus=8, offload_optimizer=True)
    >>> sol = fewest_gpus(estimate(setup), budget("A100-80GB", host_bytes=512 * 2**30))
    >>> sol.verified, sol.host_bytes <= 512 * 2**30 < sol.neighbour_host_bytes
    (True, True)
    """
    est, bud = _checked(est, budget)
    if est.setup.engine in RANKED_ENGINES:
        return _fewest_by_partition(est, bud, multiple_of)
    sol = smallest(
        gpu_terms(est), est.values, N_d, bud.usable, multiple_of=multiple_of, question="fewest GPUs"
    )
    return _with_host(sol, est, bud, multiple_of, grows=False)


def _fewest_by_partition(est: Estimate, bud: Budget, step: int) -> Solution:
    """:func:`fewest_gpus` under ``--engine zero1-torch`` or ``deepspeed``: the busiest rank's
    share ``P_r`` is made of whole tensors, no expression in ``N_d``, so each candidate is
    estimated afresh (doubling, then bisection; memory falls as ranks are added). Past one rank
    per tensor ZeroRedundancyOptimizer's share is the largest tensor and nothing changes: the
    search stops there; DeepSpeed's flat partition goes on shrinking, up to the largest
    ``--gpus`` a setup takes."""
    setup = est.setup
    cap = len(tensor_numels(setup.model)) * step
    if setup.engine == "deepspeed":  # its flat partition shrinks on past a rank per tensor
        cap = MAX_COUNT // step * step

    def at(n: int) -> int:
        return estimate(with_changes(setup, gpus=n, rank=None)).gpu_bytes

    def answer(n: int | None, method: Method = "search") -> Solution:
        neighbour = None if n is None or n == step else n - step
        return Solution(
            question="fewest GPUs",
            unknown=N_d,
            status="none-fits" if n is None else "ok",
            value=n,
            method=method,
            limit=bud.usable,
            bytes=None if n is None else at(n),
            neighbour=neighbour,
            neighbour_bytes=None if neighbour is None else at(neighbour),
            expr=sympy.Add(*gpu_terms(est)),
        )

    if at(step) <= bud.usable:
        return answer(step)
    lo, hi = step, 2 * step  # at(lo) does not fit; find hi that does
    while at(hi) > bud.usable:
        if hi >= cap:
            return answer(None)
        lo, hi = hi, min(2 * hi, cap)
    while hi - lo > step:
        mid = (lo + hi) // (2 * step) * step
        lo, hi = (lo, mid) if at(mid) <= bud.usable else (mid, hi)
    return answer(hi)


@dataclass(frozen=True)
class Fit:
    """Every answer for one setup on one budget.

    ``given`` is the setup as the caller gave it, estimated, and ``host`` its CPU side; ``batch``,
    ``sequence`` and ``gpus`` are solved on that setup (its stage, offload and recomputation).
    ``plan`` is the recommendation, apart: the cheapest stage/offload/recomputation that fits at
    the setup's GPU count.
    """

    setup: Setup
    budget: Budget
    given: Estimate
    host: HostCheck
    batch: Solution
    sequence: Solution
    gpus: Solution
    plan: Plan

    @property
    def fits(self) -> bool:
        """Whether the setup as given fits the GPU and (where it offloads) the host."""
        return self.given.gpu_bytes <= self.budget.usable and self.host.fits is not False

    def lines(self) -> list[str]:
        """The budget, the verdict on the setup as given, one line per answer, the
        recommendation, then the breakdown of the setup as given."""
        missing = self.given.unestimated
        caveat = f" (not estimated: {', '.join(missing)})" if missing else ""
        setup = self.setup
        label = plan_label(setup)
        verdict = "fits" if self.fits else "does NOT fit"
        return [
            f"{setup.model.name} on {self.budget.describe()}; {self.budget.describe_host()}",
            f"as given ({label}, {setup.gpus} GPU(s), micro-batch {setup.micro_batch} x "
            f"{setup.seq_len} tokens): {fmt_bytes(self.given.gpu_bytes)} per GPU, {verdict}; "
            f"{self.host}",
            str(self.batch) + (caveat if self.batch.status == "unbounded" else ""),
            str(self.sequence) + (caveat if self.sequence.status == "unbounded" else ""),
            f"{self.gpus} with {label}",
            str(self.plan),
            f"breakdown ({label}, {setup.gpus} GPU(s), micro-batch {setup.micro_batch} x "
            f"{setup.seq_len} tokens):",
            estimate_table(self.given),
        ]

    def text(self) -> str:
        """:meth:`lines` as one text."""
        return "\n".join(self.lines())

    def __str__(self) -> str:
        return self.text()

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form of everything :meth:`text` shows; bytes are integers."""
        return {
            "model": self.setup.model.name,
            "budget": self.budget.as_dict(),
            "given": {
                "label": plan_label(self.setup),
                "gpu_bytes": self.given.gpu_bytes,
                "fits": self.fits,
                "host": self.host.as_dict(),
                "estimate": estimate_dict(self.given),
            },
            "answers": {
                "largest_micro_batch": self.batch.as_dict(),
                "longest_sequence": self.sequence.as_dict(),
                "fewest_gpus": self.gpus.as_dict(),
            },
            "recommendation": self.plan.as_dict(),
        }


def fit(setup: Setup, budget: Budget | None = None) -> Fit:
    """Every answer for ``setup`` on ``budget`` (default: the setup's GPU and its node).

    :func:`largest_micro_batch`, :func:`longest_sequence` and :func:`fewest_gpus` on the setup
    as given, and
    :func:`~vrammath.answers.plan.cheapest_fit` as the recommendation.

    >>> from vrammath.model.presets import load_model
    >>> answer = fit(Setup(load_model("llama-7b"), gpus=8, gpu="A100-80GB"))
    >>> answer.fits, answer.plan.label, answer.gpus.status
    (False, 'ZeRO-1', 'none-fits')
    >>> fit(answer.setup, "A100-80GB")
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: budget: must be a Budget (vrammath.budget(...)) or None (got 'A100-80GB')
    """
    setup = checked_setup(setup)
    bud = setup_budget(setup, budget)
    given = estimate(setup)
    return Fit(
        setup=setup,
        budget=bud,
        given=given,
        host=host_check(given, bud),
        batch=largest_micro_batch(given, bud),
        sequence=longest_sequence(given, bud),
        gpus=fewest_gpus(given, bud, multiple_of=setup.ep),  # EP ranks are part of N_d
        plan=cheapest_fit(setup, bud),
    )


__all__ = ["Fit", "fewest_gpus", "fit", "largest_micro_batch", "longest_sequence"]
