"""A pytest plugin: in this suite a skipped test is a failed one.

"No skipping what should run here": every extra the suite exercises (vLLM CPU, Ray, DeepSpeed,
OpenSpiel, math-verify) is installed by the README's install command, so a skip (an
``importorskip`` of a broken extra, a ``skipif`` that became true) would turn a missing part
into a green run. ``ROLL_ALLOW_SKIPS=1`` lets a developer without some extra run the rest.
"""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and not hasattr(report, "wasxfail")
            and os.environ.get("ROLL_ALLOW_SKIPS") != "1"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"skipped, and a skip fails in this suite (tests/no_skips.py; "
                           f"ROLL_ALLOW_SKIPS=1 to allow): {reason}")
