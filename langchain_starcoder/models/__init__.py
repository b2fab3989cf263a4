"""MLX model modules, one file per architecture."""
