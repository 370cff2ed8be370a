"""Made-up scaling results for tests that draw, explain or read them back."""

from __future__ import annotations

from workshop.bench.scaling_results import ScalingResult, ScalingRow


def scaling_result(rows: list[ScalingRow], **changes) -> ScalingResult:
    """A result of ``rows`` measured with gloo on a 2-core CPU machine (a CNN of 10
    parameters, 3 steps); ``changes`` replace any of those fields."""
    fields = dict(
        model="cnn",
        image_size=32,
        parameters=10,
        gradient_bytes=40,
        steps=3,
        warmup=1,
        backend="gloo",
        device="CPU",
        launcher="workshop",
        alpha_beta_source="none",
        machine={"cpu_count": 2},
    )
    return ScalingResult(rows=rows, **(fields | changes))
