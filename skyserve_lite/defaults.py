"""Defaults and choices that the command line shows in its help, kept where reading them imports nothing.

`sky-lite --help` builds every command's options, so whatever an option's default or choices come from is
imported by each start of the command; here they cost nothing (the api, the spec parser and the state store
are imported only by the commands that use them).
"""

from __future__ import annotations

# Events a status view carries unless asked for more (`serve status NAME --events N`).
DEFAULT_EVENTS = 10

# The values of ``plan.rollout.UpdateMode`` (`serve update --mode`), the default first; a test holds the two
# equal.
UPDATE_MODES = ("rolling", "blue_green", "canary")

# How often a load balancer reads which replicas to send requests to (``lb.proxy.LoadBalancer``). A rollout
# wait that sees old replicas drained waits this long (and a little) more before it says the version is
# rolled out: until then the load balancer may still send a request to a replica that is draining.
LB_REFRESH_SECONDS = 0.5
