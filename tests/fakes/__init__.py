"""Stand-ins for outside tools the tests cannot have here (``tests/fakes/nvidia``: NVIDIA's, without a GPU)."""
