"""When each request is sent: all at once, or a Poisson/gamma process at a mean rate."""

from __future__ import annotations

import math
import random

from inferplug.errors import InferPlugError


def check_rate(request_rate: float, burstiness: float) -> None:
    if math.isnan(request_rate) or request_rate <= 0:
        raise InferPlugError(
            f"--request-rate {request_rate} is invalid: use a positive number of requests per second, "
            "or inf to send every request at once"
        )
    if not math.isfinite(burstiness) or burstiness <= 0:
        raise InferPlugError(
            f"--burstiness {burstiness} is invalid: use a positive number (1 is Poisson, < 1 burstier, > 1 steadier)"
        )


def arrival_offsets(count: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds from the start at which each of `count` requests is sent.

    Gaps are gamma-distributed with shape `burstiness` and mean 1/request_rate, as in vLLM:
    burstiness 1 is a Poisson process. An infinite rate sends everything at time 0.
    """
    check_rate(request_rate, burstiness)
    if math.isinf(request_rate):
        return [0.0] * count
    rng = random.Random(seed)
    scale = 1.0 / (request_rate * burstiness)
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.gammavariate(burstiness, scale)
    return offsets
