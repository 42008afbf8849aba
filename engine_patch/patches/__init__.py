"""One module per upstream defect. Each exposes `PATCH: Patch`."""
