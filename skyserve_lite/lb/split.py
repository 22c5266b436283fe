"""A canary split: the version a request goes to is drawn first, by weight; the policy then chooses among
that version's replicas only.

The load balancer's view names each ready url's version and the split (``LbView.split``: (version, percent)
for the versions given a share; every other version shares the rest). A draw in [0, 100) picks the group,
and the group's own instance of the configured policy chooses among its urls, so round robin takes the old
version's replicas in turn as it does without a split (one policy over all urls, told to skip the other
group's, gave 663, 600 and 525 of 1,788 requests to three old replicas). Worked numbers: split ((4, 10),),
urls a, b, c of version 3 and d of version 4: a draw of 7.3 is under 10 -> d; a draw of 42 -> a, b or c in
turn. Over 2,000 requests d gets about 200 (10% +- 0.7 points one standard deviation).

When a group has no ready url (the canary's replica is not READY, or every old replica is gone) there is
nothing to split. Pure apart from the injected ``random.Random``: nothing here reads a clock or does I/O;
used from the load balancer's event loop only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence

from skyserve_lite.lb.policies import Policy

Group = tuple[float, tuple[int, ...]]  # (upper bound of the draw, indexes of its urls in the view)


def find_groups(versions: Sequence[int], split: Sequence[tuple[int, int]]) -> tuple[Group, ...]:
    """(upper bound of the draw, indexes of its urls) per group of the split, in order; the rest last, up to
    100. Empty when there is no split to make: no split given, versions unknown, or a group without a url."""
    if not split or not versions:
        return ()
    named = {version for version, _ in split}
    groups: list[Group] = []
    bound = 0.0
    for version, percent in split:
        members = tuple(i for i, v in enumerate(versions) if v == version)
        if not members or percent <= 0:
            return ()
        bound += percent
        groups.append((bound, members))
    rest = tuple(i for i, v in enumerate(versions) if v not in named)
    if not rest or bound >= 100:
        return ()
    groups.append((100.0, rest))
    return tuple(groups)


def find_group(groups: Sequence[Group], draw: float) -> int:
    """The index of the group ``draw`` (in [0, 100)) falls in."""
    for index, (bound, _) in enumerate(groups):
        if draw < bound:
            return index
    return len(groups) - 1


class VersionSplit:
    """The split of one load balancer: ``set_view`` on each view, ``select`` once per request."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()
        self._groups: tuple[Group, ...] = ()
        self.active = False  # a split is in force (groups were found)
        self._policies: tuple[Policy, ...] = ()
        self._key: tuple[object, ...] = ()

    def set_view(self, urls: Sequence[str], accelerators: Sequence[str | None], versions: Sequence[int],
                 split: Sequence[tuple[int, int]], policy: str, make_policy: Callable[[], Policy]) -> None:
        """Take the view's urls (with their accelerators and versions, in order) and split; ``make_policy``
        makes one policy (named ``policy``) per group when any of these changed."""
        key = (tuple(urls), tuple(accelerators), tuple(versions), tuple(split), policy)
        if key == self._key:
            return
        self._key = key
        self._groups = find_groups(versions, split) if len(versions) == len(urls) else ()
        policies = []
        for _, members in self._groups:
            group_policy = make_policy()
            group_policy.set_targets([urls[i] for i in members],
                                     [accelerators[i] for i in members] if accelerators else ())
            policies.append(group_policy)
        self._policies = tuple(policies)
        self.active = bool(self._groups)  # asked per request: an attribute, not a property

    def select(self, exclude: Collection[str] = ()) -> str | None:
        """The drawn group's policy's choice, never one in ``exclude``; None without a split or when every
        url of the drawn group is excluded (the caller then chooses among all)."""
        if not self._groups:
            return None
        return self._policies[find_group(self._groups, self._rng.random() * 100.0)].select(exclude)
