"""The delivery strategies of RFC part 2 and the relay's fan-out k, in plain Python: the fan-out
job (Spark) and its plot (matplotlib) both need them, and neither should import the other."""

from __future__ import annotations

from typing import Final

__all__ = ["DIRECT_MAX_PROVIDERS", "RELAY_K_MAX", "RELAY_K_MIN", "STRATEGIES", "relay_k"]

#: k = ceil(log2(P)) "min 2, max 5" (RFC part 2, Core Mechanism step 4).
RELAY_K_MIN: Final = 2
RELAY_K_MAX: Final = 5

#: The RFC's comparison table gives direct delivery for "Providers (P) 2-10"; above that,
#: relay is the recommendation (used only when the path declares no ``$delivery``).
DIRECT_MAX_PROVIDERS: Final = 10

STRATEGIES: Final = ("direct", "relay", "subscribe")


def relay_k(providers: int) -> int:
    """Number of relay coordinators for ``providers`` participating providers (0 for one or none)."""
    if providers <= 1:
        return 0
    k = max(RELAY_K_MIN, min(RELAY_K_MAX, (providers - 1).bit_length()))  # bit_length(P-1) = ceil(log2 P)
    return min(k, providers)
