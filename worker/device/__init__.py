"""The device: CUDA behind one interface, GPU leases, the memory guard."""
