"""Task and service spec: parsing, validation, typed values and the replica-config comparison."""

from skyserve_lite.spec.config import (
    FieldChange,
    compute_config_fingerprint,
    compute_replica_config,
    find_config_changes,
    is_same_replica_config,
)
from skyserve_lite.spec.model import (
    Cloud,
    LoadBalancingPolicy,
    ReadinessProbe,
    ReplicaPolicy,
    Resources,
    ServiceSpec,
    SubmittedTask,
    TaskSpec,
)
from skyserve_lite.spec.parse import is_valid_service_name, load_task_file, parse_task

__all__ = [
    "Cloud",
    "FieldChange",
    "LoadBalancingPolicy",
    "ReadinessProbe",
    "ReplicaPolicy",
    "Resources",
    "ServiceSpec",
    "SubmittedTask",
    "TaskSpec",
    "compute_config_fingerprint",
    "compute_replica_config",
    "find_config_changes",
    "is_same_replica_config",
    "is_valid_service_name",
    "load_task_file",
    "parse_task",
]
