"""One node's side: the link to the coordinator, the node agent, the worker channel, beats and metrics."""
