"""Measuring the backends: `microgpt-gui bench`, its report, time to a held-out
loss, the scaling study and the PyTorch comparison point."""
