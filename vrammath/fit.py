"""Every answer for one setup, under the setup as given, and the recommendation beside them.

:func:`fit` answers the questions asked of a setup -- does it fit, the largest micro-batch, the
longest sequence, the fewest data-parallel GPUs -- each under the ZeRO stage, offload and
recomputation the caller chose, on the GPU and, where states are offloaded, on the host
(offloaded bytes per rank x ranks per node against the node's system memory). Apart from those
answers it states the recommendation: the cheapest combination of stage, offload and
recomputation that fits at the setup's GPU count (:func:`~vrammath.plan.cheapest_fit`).

Examples
========

>>> from vrammath.presets import load_model
>>> from vrammath.setup import Setup
>>> answer = fit(Setup(load_model("llama-7b"), zero=3, gpus=8, seq_len=4096, gpu="A100-80GB"))
>>> answer.batch.question, answer.given.setup.zero, answer.plan.label
('largest micro-batch', 3, 'ZeRO-1')
>>> answer.as_dict()["answers"]["largest_micro_batch"]["value"] == answer.batch.value
True
"""

from __future__ import annotations

from dataclasses import dataclass

from vrammath.budget import Budget, HostCheck, host_check, setup_budget
from vrammath.estimate import Estimate, estimate
from vrammath.inverse import Solution, fewest_gpus, largest_micro_batch, longest_sequence
from vrammath.plan import Plan, cheapest_fit, checked_setup, plan_label
from vrammath.setup import Setup
from vrammath.units import fmt_bytes


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
            self.given.table(),
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
                "estimate": self.given.as_dict(),
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

    :func:`~vrammath.inverse.largest_micro_batch`, :func:`~vrammath.inverse.longest_sequence` and
    :func:`~vrammath.inverse.fewest_gpus` on the setup as given, and
    :func:`~vrammath.plan.cheapest_fit` as the recommendation.

    >>> from vrammath.presets import load_model
    >>> answer = fit(Setup(load_model("llama-7b"), gpus=8, gpu="A100-80GB"))
    >>> answer.fits, answer.plan.label, answer.gpus.status
    (False, 'ZeRO-1', 'none-fits')
    >>> fit(answer.setup, "A100-80GB")
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: budget: must be a Budget (vrammath.budget(...)) or None (got 'A100-80GB')
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
        gpus=fewest_gpus(given, bud),
        plan=cheapest_fit(setup, bud),
    )


__all__ = ["Fit", "fit"]
