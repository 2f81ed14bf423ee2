"""What work costs: layers cut into kernels, the roofline cost model and its calibration on real
kernels, and the memory model."""
