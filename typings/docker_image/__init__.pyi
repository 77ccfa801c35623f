# Type stubs for docker-image-py, which ships none: only what episode_operator uses.
