"""Method handlers: one module per DWN interface."""
