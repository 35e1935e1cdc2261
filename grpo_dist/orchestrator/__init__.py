"""The driver side of rollout: the manager (batch and streaming behind one interface), the two
pipelines, and dispatch over actor groups. It holds handles to rollout and reward actors and
never imports the actor side (``grpo_dist.rollout``): the two sides meet only through Ray calls
and the dataclasses of ``grpo_dist.types``."""
