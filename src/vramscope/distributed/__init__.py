"""Distributed runs under torchrun: each rank tracks itself, rank 0 gathers one report.

``rank`` reads what the launcher says about this process; ``memory`` names the memory
DDP and FSDP add; ``exchange`` moves each rank's report to rank 0 (the job's store, or
files in a private directory); ``gather`` joins the reports into one (pure functions);
``job`` runs those steps at the end of a rank; ``journals`` reads the journal of a rank
that sent no report; ``launch`` is ``vramscope run --nproc``.
"""

DEFAULT_TIMEOUT_S = 60.0  # how long rank 0 waits for the other ranks' reports by default
VIA = ("auto", "files")  # --gather-via: the job's stores and files, or files only
JOB_EXIT_FILE = "VRAMSCOPE_JOB_EXIT_FILE"  # set by `vramscope run --nproc` for rank 0
