"""Load balancer: one aiohttp proxy per service in front of its READY replicas."""
