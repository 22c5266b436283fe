"""What the metrics tests share: a Prometheus text page read into samples (with prometheus-client's own
parser), and a load balancer with nothing in flight to take snapshots of."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

# (name, labels) -> value
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text page, by name and labels."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def total(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples with these labels over every ``worker`` (a load balancer on several
    processes has a series per worker, one process none): what a query summing by the other labels reads.
    None when there is no such sample."""
    found = [value for (each, labelset), value in samples.items()
             if each == name and {key: text for key, text in labelset if key != "worker"} == labels]
    return sum(found) if found else None


class IdleLoad:
    """A load balancer's load (``lb.metrics.LoadSource``) with nothing in flight: two replicas, the second
    ejected, two retries and one ejection so far; for snapshots of recorded outcomes only."""

    retries = 2
    ejections = 1
    waiting = 0
    ejected = frozenset({"http://r2"})

    def in_flight(self) -> tuple[tuple[str, int], ...]:
        return (("http://r1", 0), ("http://r2", 0))
