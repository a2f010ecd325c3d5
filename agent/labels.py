"""The Docker labels every container of the platform carries (``gpucloud.<key>``), read by each part of
the host that picks out its own containers: the launcher writes them, the collector, reconcile, the
fence and the relay read them. Its own module so that readers need not import the launcher."""

LABEL = "gpucloud"
