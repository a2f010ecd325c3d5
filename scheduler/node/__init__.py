"""What runs on each GPU host: the node agent, the Docker launcher, local images,
GPU discovery (NVML or simulated), the telemetry collector, and the node-queue tasks."""
