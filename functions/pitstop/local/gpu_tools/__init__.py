"""Stand-ins for nvidia-smi, dcgmi and nccl-tests' all_gather_perf on machines without GPUs.

They print the real output formats with a per-node outcome read from ``PITSTOP_GPU_STATE`` (a JSON
file path, or inline JSON) keyed by node name (``PITSTOP_NODE``, else ``SLURMD_NODENAME``, else the
host name), so a Slurm or GKE job can run them where the real tools would run. Run as modules:
``python -m pitstop.local.gpu_tools.nvidia_smi -q``.
"""
