"""Update plans (which replicas are reused, replaced, terminated) and rollout strategies. All pure."""
