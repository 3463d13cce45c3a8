# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Waiting in tests: on a condition with a generous bound, never for a number of seconds.

``until(condition)`` polls a condition; ``GatedClock`` is a check's clock for a test whose outcome is decided at a
deadline or after a delay the check measures (a failure sentence that counts what arrived "within the timeout", a trigger
sent a while after the connection): the clock does not pass the gate until the test's condition holds (what was sent
arrived, a peer connected), so the outcome never depends on how fast the machine is.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import time

BOUND = 60.0  # seconds: the most any condition in these tests may take on a loaded machine (a bound, not an expectation)


def until(condition, bound=BOUND, step=None, what="the condition"):
    """Call ``step()`` (or sleep a little) until ``condition()`` holds; fail the test after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, "%s did not hold within %s s" % (what, bound)
        if step is not None:
            step()
        else:
            time.sleep(0.01)


class GatedClock:
    """A monotonic clock that stays at most ``gate`` seconds after its first reading until ``ready()`` holds (at most ``bound``
    real seconds), then runs on from there at the real pace.

    Give a check this clock with the gate just short of what it measures (its timeout, a trigger's delay): the check then acts
    on that time only once what the test waits for happened. ``ready`` may be set after the check is built.
    """

    def __init__(self, gate, ready=None, bound=BOUND):
        self.gate = gate
        self.ready = ready
        self.bound = bound
        self.start = None
        self.opened_at = None
        self.held = None

    def __call__(self):
        now = time.monotonic()
        if self.start is None:
            self.start = now
        if self.opened_at is None:
            if (self.ready is not None and self.ready()) or now - self.start > self.bound:
                self.opened_at, self.held = now, min(now, self.start + self.gate)
            else:
                return min(now, self.start + self.gate)
        return self.held + (now - self.opened_at)
