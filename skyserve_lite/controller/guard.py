"""The controller's side of the provider boundary: whatever a provider raises becomes a ``ProviderError``.

Providers translate their vendor's errors themselves, once each (``translate_error`` for botocore, OSError
in the local provider). This wrapper is the net under that: an exception a provider did not translate (a
bug, a vendor error nobody anticipated) is logged with its traceback and raised again as a
``TransientProviderError``, so the pass treats it like any failed call of that cloud (its inventory is
unknown this pass, the launch is retried, the termination is asked for again) instead of losing the
whole pass, other clouds and services included.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

from skyserve_lite.errors import ProviderError, TransientProviderError
from skyserve_lite.providers.base import Instance, LaunchOutcome, LaunchRequest, Provider, ReplicaLog

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class GuardedProvider:
    """A ``Provider`` whose every method raises only ``ProviderError``; see the module docstring."""

    def __init__(self, inner: Provider) -> None:
        self.name = inner.name
        self.inner = inner

    def _call(self, method: str, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except ProviderError:
            raise
        except Exception as exc:  # the provider boundary: nothing untranslated crosses it
            log.exception("provider %s: %s raised an untranslated error", self.name, method)
            raise TransientProviderError(f"{self.name} {method} failed unexpectedly: "
                                         f"{type(exc).__name__}: {exc}") from exc

    def launch(self, requests: Sequence[LaunchRequest]) -> list[LaunchOutcome]:
        return self._call("launch", lambda: self.inner.launch(requests))

    def list_instances(self, regions: Collection[str] = ()) -> list[Instance]:
        return self._call("list_instances", lambda: self.inner.list_instances(regions))

    def find_instances(self, instance_ids: Sequence[str], regions: Collection[str] = ()) -> list[Instance]:
        return self._call("find_instances", lambda: self.inner.find_instances(instance_ids, regions))

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self._call("terminate", lambda: self.inner.terminate(instance_ids))

    def release_service(self, service: str) -> None:
        self._call("release_service", lambda: self.inner.release_service(service))

    def read_log(self, service: str, replica_id: int, instance_id: str | None, region: str | None
                 ) -> ReplicaLog | None:
        return self._call("read_log", lambda: self.inner.read_log(service, replica_id, instance_id, region))

    def abandon(self) -> None:
        self._call("abandon", self.inner.abandon)


def guard_provider(provider: Provider) -> Provider:
    """``provider`` behind the guard (once: a guarded provider is returned as it is)."""
    return provider if isinstance(provider, GuardedProvider) else GuardedProvider(provider)
