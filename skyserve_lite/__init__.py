"""skyserve_lite: serve an HTTP workload on replicas behind one endpoint."""

__version__ = "0.1.0"
