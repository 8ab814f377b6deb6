"""Hypothesis profiles of the reliability suite: "ci" (the default, bounded) and "long" (opt-in).

tests/support/fixtures.py (the plugin tests/conftest.py registers) imports this module, which
registers both profiles and loads "ci" unless another profile was chosen. It is imported before
hypothesis reads ``--hypothesis-profile``, so select the long profile with::

    python -m pytest --hypothesis-profile=long tests/test_model.py
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=30,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=500,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

if settings.get_current_profile_name() == "default":
    settings.load_profile("ci")
