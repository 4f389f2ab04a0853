"""The only place that imports verl (0.9.1). Every hook used here is pinned by tests/contract/."""
