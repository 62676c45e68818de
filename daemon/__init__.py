"""pilotd: the daemon that owns the GPU and serves the shim's remoted CUDA calls."""
