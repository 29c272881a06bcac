"""The reference model's own checks are asserts (sim.py); rewrite them like a test module's so
they hold under `python -O`, where the pool must behave the same (its checks are raises)."""

import pytest

pytest.register_assert_rewrite("tests.pool.sim")
