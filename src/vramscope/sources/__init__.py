"""Where the numbers come from: the CUDA caching allocator, NVML and the host (psutil).

Each module here can be imported alone and knows nothing of reports.
"""
