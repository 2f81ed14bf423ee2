"""Planning an MLLM: the search over encoder plans and partitions, the layouts it is compared with,
the report, dynamic data and the modality bubble model."""
