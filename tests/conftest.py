"""Test-wide settings: hypothesis profiles registered in one place.

``ci`` (the default) keeps property tests to a few dozen examples so the whole run stays
fast on 2 cores; ``long`` is for fuzzing sessions: ``pytest --hypothesis-profile=long``.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.load_profile("ci")
