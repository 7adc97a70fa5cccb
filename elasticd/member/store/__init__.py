"""The c10d stores of a node's rounds and of the job, their host process and the tunnel to them."""
