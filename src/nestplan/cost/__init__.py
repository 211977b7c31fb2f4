"""Cost model: compute, network, memory and pipeline time of a plan."""
