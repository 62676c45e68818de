"""A design name whose code is not there (`implemented = False`): choosing it must stop pilotd's
start with "not implemented" (tests/apps/test_scheduler_core.py)."""

from pilot.policies import Policy, register


@register
class LaterDesign(Policy):
    name = "later-design"
    summary = "example: a design name only"
    implemented = False
