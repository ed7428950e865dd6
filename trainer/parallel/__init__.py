"""Partitioning over the device mesh, several processes, halo arithmetic, the local multi-process launcher."""
