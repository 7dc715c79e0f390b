"""HTTP routers: health and metrics at the root, the versioned REST API under /api/v1."""
