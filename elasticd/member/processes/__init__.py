"""The processes a node runs: worker groups, the spawner, the zygote they fork from, their titles."""
