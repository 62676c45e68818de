"""Command-line tools: `pilot` (run programs under the shim) and later `pilotctl`."""
