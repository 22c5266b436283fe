"""Autoscaling policies: fixed, request rate, in-flight requests (Ray Serve compatible), spot/on-demand
fallback, and a simulator. All pure: injected time, state held in explicit values, no I/O.

Nothing is imported here: each caller imports the module it uses (``base`` for the state values,
``dispatch`` for a policy's autoscaler and target), so that reading a stored state loads no policy.
"""
